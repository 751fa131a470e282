"""Splits the inputs name (issue 16, item 2): split folders, sources named like splits, and
SOURCE=SPLIT; read back with tf.data and compared with TFDS's ImageFolder on the same tree."""

from __future__ import annotations

import collections
import json
import zlib

import pytest
from conftest import make_image, read_dataset, read_errors

from recordforge.transforms.core.planning.splits import (
    SplitNameClash,
    describe_folders,
    ordered_splits,
    split_folders,
)

# split folder → classes; `owl` only in test, `val` spelled as TFDS's ImageFolder keeps it.
TREE = {"train": ("cat", "dog"), "val": ("cat", "dog"), "test": ("cat", "dog", "owl")}
PER_CLASS = 3


def _make_tree(root, layout=TREE):
    for split, classes in layout.items():
        for name in classes:
            for i in range(PER_CLASS):
                seed = zlib.crc32(f"{split}/{name}/{i}".encode()) % 1000
                make_image(root / split / name / f"{name}{i}.jpg", "JPEG", size=(16, 12), seed=seed)
    return root


def test_split_folder_names():
    assert split_folders(["train", "val", "test"]) == {
        "test": "test",
        "train": "train",
        "val": "validation",
    }
    assert split_folders(["Train", "dev"]) == {"Train": "train", "dev": "validation"}
    assert split_folders(["train", "cats"]) is None  # one class folder: no split layout
    assert split_folders([]) is None
    with pytest.raises(SplitNameClash, match="'dev' and 'val' both name the validation"):
        split_folders(["train", "val", "dev"])
    assert ordered_splits(["test", "zzz", "train", "validation"]) == (
        "train",
        "validation",
        "test",
        "zzz",
    )
    assert describe_folders({"train": "train", "val": "validation"}) == ("train, validation ← val/")


def test_split_folders_become_splits_with_one_class_numbering(tmp_path, cli, tf):
    tree = _make_tree(tmp_path / "tree")
    make_image(tree / "stray.jpg", "JPEG")  # beside the split folders: no split
    make_image(tree / "train" / "stray.jpg", "JPEG")  # beside the class folders: no class
    out = tmp_path / "out"
    result = cli("convert", tree, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "splits from split folders in" in result.stdout
    assert "train, validation ← val/, test" in result.stdout
    info, splits = read_dataset(out)
    assert list(info["splits"]) == ["train", "validation", "test"]
    assert info["labels"] == ["cat", "dog", "owl"]  # the union of every split's classes
    assert info["options"]["splits"] is None
    assert info["options"]["source_splits"] == {
        str(tree): {"test": "test", "train": "train", "val": "validation"}
    }
    assert "split folders" in info["source"]["splits"]
    seen = collections.defaultdict(set)
    for split, records in splits.items():
        for record in records:
            name = record["image/filename"].decode()
            folder, class_name, file_name = name.split("/")
            assert {"train": "train", "val": "validation", "test": "test"}[folder] == split
            assert info["labels"][record["image/class/label"]] == class_name
            assert record["image/class/text"].decode() == class_name
            seen[split].add((class_name, file_name))
    assert {split: len(files) for split, files in seen.items()} == {
        "train": 6,
        "validation": 6,
        "test": 9,
    }
    # Class counts per split name every class, 0 where a split has none.
    assert info["splits"]["train"]["label_counts"] == {"cat": 3, "dog": 3, "owl": 0}
    kinds = sorted((e["error"], e["source"]["path"]) for e in read_errors(out))
    assert kinds == [
        ("NoClassFolder", str(tree / "train" / "stray.jpg")),
        ("NoSplitFolder", str(tree / "stray.jpg")),
    ]
    assert info["num_inputs"] == info["num_records"] + info["errors"]["count"] == 23


def test_split_folders_match_tfds_image_folder(tmp_path, cli, tf):
    tfds = pytest.importorskip("tensorflow_datasets")
    tree = _make_tree(tmp_path / "tree")
    out = tmp_path / "out"
    assert cli("convert", tree, "-o", out).returncode == 0
    info, splits = read_dataset(out)
    ours = {
        split: sorted(
            (r["image/filename"].decode().split("/", 1)[1], int(r["image/class/label"]))
            for r in records
        )
        for split, records in splits.items()
    }
    builder = tfds.folder_dataset.ImageFolder(str(tree))
    assert builder.info.features["label"].names == info["labels"]
    theirs = {}
    for folder in builder.info.splits:
        rows = []
        for example in builder.as_dataset(split=folder):
            path = example["image/filename"].numpy().decode()
            rows.append(("/".join(path.split("/")[-2:]), int(example["label"])))
        # ImageFolder keeps folder names as split names; recordforge follows tfds.Split's.
        theirs[{"val": "validation"}.get(folder, folder)] = sorted(rows)
    assert ours == theirs


def test_sources_named_like_splits_are_their_splits(tmp_path, cli, tf):
    data = _make_tree(tmp_path / "data")
    out = tmp_path / "out"
    result = cli("convert", data / "train", data / "test", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "splits from the inputs' names: train ← " in result.stdout
    info, splits = read_dataset(out)
    assert list(info["splits"]) == ["train", "test"]
    assert info["labels"] == ["cat", "dog", "owl"]
    for split, records in splits.items():
        assert {r["image/filename"].decode().split("/")[0] for r in records} <= {
            "cat",
            "dog",
            "owl",
        }
        assert len(records) == {"train": 6, "test": 9}[split]
    # The same folders named explicitly give the same shards, byte for byte.
    named = tmp_path / "named"
    result = cli(
        "convert", f"{data / 'train'}=train", f"{data / 'test'}=test", "-o", named, "--name", "out"
    )
    assert result.returncode == 0, result.stderr
    assert "splits from names given on the command line" in result.stdout
    for shard in sorted(out.glob("*.tfrecord-*")):
        assert (named / shard.name).read_bytes() == shard.read_bytes()


def test_explicit_splits_of_csv_files(tmp_path, cli, tf):
    for name, rows in (("a.csv", range(5)), ("b.csv", range(5, 8))):
        (tmp_path / name).write_text("x,y\n" + "".join(f"{i},t{i}\n" for i in rows))
    out = tmp_path / "out"
    result = cli("convert", f"{tmp_path / 'a.csv'}=train", f"{tmp_path / 'b.csv'}=dev", "-o", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert list(info["splits"]) == ["train", "dev"]  # named explicitly: kept as typed
    assert sorted(int(r["x"]) for r in splits["train"]) == [0, 1, 2, 3, 4]
    assert sorted(int(r["x"]) for r in splits["dev"]) == [5, 6, 7]
    # Files named like splits are their splits.
    (tmp_path / "train.csv").write_text((tmp_path / "a.csv").read_text())
    (tmp_path / "test.csv").write_text((tmp_path / "b.csv").read_text())
    out2 = tmp_path / "out2"
    result = cli("convert", tmp_path / "train.csv", tmp_path / "test.csv", "-o", out2)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out2)
    assert {s: len(r) for s, r in splits.items()} == {"train": 5, "test": 3}


@pytest.mark.parametrize(
    "args, message",
    [
        (["{tree}", "--splits", "train=0.5,test=0.5"], "--splits cannot be combined"),
        (["{tree}/train=train", "--splits", "train=0.5,test=0.5"], "--splits cannot be combined"),
        (["{tree}/train", "{tree}/test", "--splits", "a=0.5,b=0.5"], "--splits would merge"),
        (["{tree}/train", "{tree}/test", "{tree}/test/cat"], "has no split while other inputs"),
        (["{tree}/train=train", "{tree}/test/cat"], "has no split while other inputs name"),
        (["{clash}"], "'dev' and 'val' both name the validation split"),
    ],
)
def test_mixing_splits_is_a_usage_error(tmp_path, cli, args, message):
    tree = _make_tree(tmp_path / "tree", {"train": ("cat",), "test": ("cat",)})
    clash = _make_tree(tmp_path / "clash", {"train": ("a",), "val": ("a",), "dev": ("a",)})
    argv = [a.format(tree=tree, clash=clash) for a in args]
    result = cli("plan", *argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_one_input_named_like_a_split_converts_as_before(tmp_path, cli):
    tree = _make_tree(tmp_path / "tree", {"test": ("cat", "dog")})
    result = cli("plan", tree / "test", "--splits", "train=0.5,validation=0.5", "--json")
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)["splits"]) == {"train", "validation"}
    result = cli("plan", tree / "test", "--json")
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)["splits"]) == {"train"}
    assert not json.loads(result.stdout)["splits_note"]


def test_split_names_among_class_folders_warn_and_stay_classes(tmp_path, cli):
    tree = _make_tree(tmp_path / "tree", {"train": ("a",), "test": ("a",), "extra": ("a",)})
    result = cli("plan", tree, "--json", "--labels", "folder")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert list(report["splits"]) == ["train"]
    assert report["labels"] == ["extra", "test", "train"]
    assert "look like splits" in result.stderr and f"{tree}/test=test" in result.stderr
    assert "split folders are not kept apart" in result.stderr


def test_plan_says_which_layout(tmp_path, cli):
    tree = _make_tree(tmp_path / "tree")
    result = cli("plan", tree)
    assert result.returncode == 0, result.stderr
    assert "splits from split folders in" in result.stdout
    assert "validation: 6 records" in result.stdout


def test_the_flex_template_confines_a_named_split_to_its_source(tmp_path):
    from recordforge.pipelines.flex_template import convert_arguments

    (tmp_path / "photos").mkdir()
    argv, _ = convert_arguments([f"--sources={tmp_path}/photos=train", "--output=gs://b/out"])
    assert f"{tmp_path}/photos=train" in argv
    assert f"--allowed-root={tmp_path}/photos" in argv
