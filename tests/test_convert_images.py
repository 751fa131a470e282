"""End to end: image folders through the CLI, read back with TensorFlow, compared to the files."""

from __future__ import annotations

import json

from conftest import BAD_FILES, GOOD_IMAGES, make_image, read_dataset, read_errors, shard_files
from PIL import Image

FORMATS = {"JPEG": b"jpeg", "PNG": b"png", "GIF": b"gif", "BMP": b"bmp", "WEBP": b"webp"}


def test_class_folders_every_record_matches_its_file(photo_folder, tmp_path, cli):
    out = tmp_path / "out"
    result = cli("convert", photo_folder, "--output", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)

    # Nothing lost: good images are records, bad files are errors, hidden files are ignored.
    assert info["num_inputs"] == len(GOOD_IMAGES) + len(BAD_FILES)
    assert info["num_records"] == len(GOOD_IMAGES) == len(splits["train"])
    assert info["errors"]["count"] == len(BAD_FILES)
    assert info["source"]["ignored_hidden_files"] == 2
    assert info["labels"] == ["cat", "dog", "eel"]

    for record in splits["train"]:
        relative = record["image/filename"].decode()
        path = photo_folder / relative
        fmt, _, _ = GOOD_IMAGES[relative]
        assert record["image/encoded"] == path.read_bytes(), "original bytes, unchanged"
        assert record["image/format"] == FORMATS[fmt]
        with Image.open(path) as image:
            assert (record["image/width"], record["image/height"]) == image.size
        class_name = relative.split("/")[0]
        assert record["image/class/text"] == class_name.encode()
        assert record["image/class/label"] == info["labels"].index(class_name)
    assert sorted(r["image/filename"].decode() for r in splits["train"]) == sorted(GOOD_IMAGES)

    errors = read_errors(out)
    assert {e["source"]["path"]: e["error"] for e in errors} == {
        str(photo_folder / relative): kind for relative, kind in BAD_FILES.items()
    }
    assert all(e["stage"] == "probe" and e["message"] for e in errors)
    assert "WARNING: 5 of 15 inputs failed" in result.stderr


def test_manifest_sizes_and_names_are_exact(photo_folder, tmp_path, cli):
    out = tmp_path / "out"
    result = cli("convert", photo_folder, "-o", out, "--name", "pets")
    assert result.returncode == 0, result.stderr
    # Progress while running, a summary at the end.
    assert "wrote pets-train.tfrecord-00000-of-00001: 10 records" in result.stderr
    assert "Converted 15 inputs into 10 records in" in result.stdout
    info = json.loads((out / "dataset_info.json").read_text())
    shards = info["splits"]["train"]["shards"]
    assert [s["file"] for s in shards] == ["pets-train.tfrecord-00000-of-00001"]
    assert shards[0]["num_bytes"] == (out / shards[0]["file"]).stat().st_size
    assert info["splits"]["train"]["num_bytes"] == shards[0]["num_bytes"]
    # The planner saw the exact final sizes before anything was written.
    assert info["plan"]["splits"]["train"]["total_bytes"] == shards[0]["num_bytes"]
    assert [p.name for p in shard_files(out)] == [shards[0]["file"]]
    assert sorted(p.name for p in out.iterdir()) == [
        "dataset_info.json",
        "errors",
        "pets-train.tfrecord-00000-of-00001",
    ]


def test_channels_match_what_tensorflow_decodes(photo_folder, tmp_path, cli):
    import tensorflow as tf

    out = tmp_path / "out"
    assert cli("convert", photo_folder, "-o", out).returncode == 0
    _, splits = read_dataset(out)
    for record in splits["train"]:
        decoded = tf.io.decode_image(record["image/encoded"], expand_animations=False)
        assert decoded.shape == (
            record["image/height"],
            record["image/width"],
            record["image/channels"],
        ), record["image/filename"]


def test_flat_and_nested_folders_have_no_labels(tmp_path, cli):
    from conftest import make_image

    flat, nested = tmp_path / "flat", tmp_path / "nested"
    for i in range(3):
        make_image(flat / f"{i}.jpg", "JPEG", seed=i)
        make_image(nested / "2024" / f"{i:02d}" / f"{i}.png", "PNG", seed=i)
    for folder in (flat, nested):
        out = tmp_path / f"out-{folder.name}"
        result = cli("convert", folder, "-o", out)
        assert result.returncode == 0, result.stderr
        info, splits = read_dataset(out)
        assert info["labels"] is None
        assert "image/class/label" not in info["features"]
        assert len(splits["train"]) == 3
        assert "image/class/label" not in splits["train"][0]


def test_labels_folder_mode_uses_first_level(tmp_path, cli):
    from conftest import make_image

    root = tmp_path / "nested"
    make_image(root / "cat" / "a" / "1.jpg", "JPEG")
    make_image(root / "dog" / "2.jpg", "JPEG")
    make_image(root / "stray.jpg", "JPEG")
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out, "--labels", "folder")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert info["labels"] == ["cat", "dog"]
    assert sorted(r["image/class/text"] for r in splits["train"]) == [b"cat", b"dog"]
    assert [e["error"] for e in read_errors(out)] == ["NoClassFolder"]
    assert info["num_inputs"] == 3 == info["num_records"] + info["errors"]["count"]


def test_several_sources_and_globs_in_one_run(tmp_path, cli):
    from conftest import make_image

    a, b = tmp_path / "a", tmp_path / "b"
    make_image(a / "x" / "same.jpg", "JPEG", seed=1)
    make_image(b / "x" / "same.jpg", "JPEG", seed=2)
    make_image(b / "y" / "other.png", "PNG", seed=3)
    make_image(tmp_path / "loose" / "one.gif", "GIF", seed=4)
    out = tmp_path / "out"
    result = cli("convert", a, f"{b}/*/*.jpg", tmp_path / "loose" / "one.gif", "-o", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    # Same relative path in two sources: two records, both kept.
    assert info["num_records"] == 3
    encoded = sorted(r["image/encoded"] for r in splits["train"])
    assert encoded == sorted(
        p.read_bytes()
        for p in (a / "x" / "same.jpg", b / "x" / "same.jpg", tmp_path / "loose" / "one.gif")
    )


def test_gzip_shards(photo_folder, tmp_path, cli):
    out = tmp_path / "out"
    assert cli("convert", photo_folder, "-o", out, "--compression", "gzip").returncode == 0
    info, splits = read_dataset(out)
    assert info["splits"]["train"]["shards"][0]["file"].endswith("-of-00001.gz")
    assert len(splits["train"]) == len(GOOD_IMAGES)
    for shard in info["splits"]["train"]["shards"]:
        assert shard["num_bytes"] == (out / shard["file"]).stat().st_size


def test_readme_reading_example_reads_every_record(photo_folder, tmp_path, cli, monkeypatch):
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(
        r"### Reading it back with tf.data directly\n\n.*?```python\n(.*?)```", readme, re.S
    )
    # Plain, with TensorFlow Datasets' metadata (its own dataset_info.json beside the
    # manifest, which the snippet opened), and a train split with no records at all.
    for run, extra, expected in (
        ("plain", (), len(GOOD_IMAGES)),
        ("tfds", ("--tfds",), len(GOOD_IMAGES)),
        ("empty", ("--splits", "train=0.01,test=0.99", "--split-salt", "7"), None),
    ):
        folder = tmp_path / run
        assert cli("convert", photo_folder, "-o", folder / "out", *extra).returncode == 0
        monkeypatch.chdir(folder)
        namespace: dict = {}
        exec(block.group(1), namespace)  # the README's code, as a user would paste it
        count = sum(int(batch["image/encoded"].shape[0]) for batch in namespace["dataset"])
        assert count == namespace["info"]["splits"]["train"]["num_records"]
        assert count == (len(GOOD_IMAGES) if expected else 0), run


def test_symlinked_files_are_followed_folders_only_when_asked_and_broken_links_reported(
    tmp_path, cli
):
    from conftest import make_image

    real = tmp_path / "real"
    make_image(real / "cats" / "a.jpg", "JPEG", seed=1)
    make_image(real / "cats" / "b.jpg", "JPEG", seed=2)
    make_image(real / "dogs" / "c.png", "PNG", seed=3)
    root = tmp_path / "dataset"
    root.mkdir()
    (root / "cat").symlink_to(real / "cats")  # a class folder that is a link
    (root / "dog").mkdir()
    (root / "dog" / "c.png").symlink_to(real / "dogs" / "c.png")  # a file that is a link
    (root / "dog" / "gone.png").symlink_to(real / "dogs" / "deleted.png")  # a broken link
    (root / "cat" / "loop").symlink_to(root)  # a link loop: visited once, not forever
    # By default a link to a folder is not followed (it may lead anywhere), and is counted.
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out, "--labels", "folder")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert sorted(r["image/filename"].decode() for r in splits["train"]) == ["dog/c.png"]
    assert info["source"]["symlinked_folders_not_followed"] == 1
    assert "1 links to folders not followed" in result.stdout
    # --follow-symlinks follows it, and the loop inside it once.
    out = tmp_path / "followed"
    result = cli("convert", root, "-o", out, "--labels", "folder", "--follow-symlinks")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    names = sorted(r["image/filename"].decode() for r in splits["train"])
    assert names == ["cat/a.jpg", "cat/b.jpg", "dog/c.png"]
    (error,) = read_errors(out)
    assert error["error"] == "MissingFile" and "broken symbolic link" in error["message"]
    assert info["num_inputs"] == 4
    # The loop (cat/loop -> the dataset itself) leads to a folder walked already.
    assert info["source"]["symlinked_folders_not_followed"] == 1
    # The summary said "links to folders not followed" though they were followed.
    assert "skipped: 1 links to folders already walked" in result.stdout, result.stdout


def test_the_summary_on_stdout_counts_the_failed_inputs(tmp_path, cli):
    # The count was only on stderr: a job keeping stdout (the summary) lost it.
    for index in range(2):
        make_image(tmp_path / "in" / "cat" / f"{index}.png", "PNG", size=(8, 8), seed=index)
    (tmp_path / "in" / "cat" / "broken.jpg").write_bytes(b"not a picture")
    result = cli("convert", tmp_path / "in", "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    expected = f"  1 of 3 inputs failed (NotAnImage 1): the reasons are in {out}/errors/probe.jsonl"
    assert expected in result.stdout.splitlines(), result.stdout
    assert "1 of 3 inputs failed" in result.stderr
