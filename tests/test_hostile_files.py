"""Filesystems as they are (issue 15): links, FIFOs and devices, names that are not UTF-8,
folders that cannot be read, paths too long, the same file reached twice, stray files in a
class-folder tree. Each becomes an error record, a count in the manifest, or a record; none
ends or hangs the run, none vanishes."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess

from conftest import RECORDFORGE, make_image, read_errors

from recordforge import iterate


def _manifest(out: pathlib.Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


def _classes(root: pathlib.Path, files: dict[str, int]) -> pathlib.Path:
    """root/<class>/<n>.jpg: `files` maps a class to how many images it holds."""
    seed = 0
    for name, count in files.items():
        for i in range(count):
            make_image(root / name / f"{i}.jpg", "JPEG", seed=seed)
            seed += 1
    return root


def _errors(out: pathlib.Path) -> dict[str, str]:
    return {os.path.basename(e["source"]["path"]): e["error"] for e in read_errors(out)}


def test_fifos_sockets_and_devices_are_never_opened(tmp_path, cli):
    # A FIFO named x.jpg made the run hang forever: opening it waits for a writer.
    root = _classes(tmp_path / "photos", {"cat": 2, "dog": 2})
    os.mkfifo(root / "cat" / "fifo.jpg")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "dog" / "socket.jpg"))
    (root / "dog" / "null.jpg").symlink_to("/dev/null")  # a link to a character device
    try:
        out = tmp_path / "out"
        result = cli("convert", root, "-o", out, timeout=120)
    finally:
        listener.close()
    assert result.returncode == 0, result.stderr
    assert _errors(out) == {
        "fifo.jpg": "NotARegularFile",
        "socket.jpg": "NotARegularFile",
        "null.jpg": "NotARegularFile",
    }
    messages = " ".join(e["message"] for e in read_errors(out))
    assert "a FIFO (named pipe)" in messages and "a socket" in messages
    assert "a character device" in messages
    assert _manifest(out)["num_inputs"] == 7


def test_a_folder_holding_only_a_fifo_is_an_error_record_not_empty(tmp_path, cli):
    # It was refused as "input folder 'ff' is empty": the FIFO went unmentioned.
    (tmp_path / "ff").mkdir()
    os.mkfifo(tmp_path / "ff" / "x.jpg")
    result = cli("convert", tmp_path / "ff", "-o", tmp_path / "out", timeout=120)
    assert result.returncode == 1, result.stderr
    assert "all 1 inputs failed" in result.stderr and "is empty" not in result.stderr
    errors = list((tmp_path / ".out.recordforge" / "errors").glob("*.jsonl"))
    assert [json.loads(line)["error"] for line in errors[0].read_text().splitlines()] == [
        "NotARegularFile"
    ]


def test_a_fifo_a_csv_row_names_is_not_opened(tmp_path, cli):
    make_image(tmp_path / "a.jpg", "JPEG")
    os.mkfifo(tmp_path / "fifo.jpg")
    table = tmp_path / "t.csv"
    table.write_text("path,label\na.jpg,x\nfifo.jpg,y\n")
    out = tmp_path / "out"
    result = cli("convert", table, "--image-column", "path", "-o", out, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [e["error"] for e in read_errors(out)] == ["NotARegularFile"]


def test_a_link_to_the_root_folder_is_not_followed(tmp_path, cli):
    # It made the run walk the whole filesystem, then crash in /proc.
    root = _classes(tmp_path / "photos", {"cat": 2, "dog": 2})
    (root / "dog" / "everything").symlink_to("/")
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out, timeout=300)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert manifest["num_inputs"] == manifest["num_records"] == 4
    assert manifest["source"]["symlinked_folders_not_followed"] == 1
    # Followed on request, but confined: the link leads outside the allowed root.
    out = tmp_path / "followed"
    result = cli(
        "convert", root, "-o", out, "--follow-symlinks", "--allowed-root", root, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert _errors(out) == {"everything": "OutsideAllowedRoot"}
    assert _manifest(out)["num_records"] == 4


def test_link_loops_end_when_links_are_followed(tmp_path, cli):
    root = _classes(tmp_path / "photos", {"cat": 2, "dog": 2})
    (root / "cat" / "up").symlink_to(root)
    (root / "dog" / "self").symlink_to(root / "dog")
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out, "--follow-symlinks", timeout=300)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert manifest["num_records"] == 4
    assert manifest["source"]["symlinked_folders_not_followed"] == 2  # both lead back


def test_file_names_that_are_not_utf8_are_converted_and_shown_escaped(tmp_path, cli):
    # A name that is not UTF-8 ended the run (and `plan`) with a UnicodeEncodeError.
    root = tmp_path / "photos"
    make_image(root / "cat" / "ok.jpg", "JPEG", seed=1)
    raw_root = os.fsencode(root)
    os.makedirs(os.path.join(raw_root, b"d\xf6g"))  # Latin-1 "dög"
    good = make_image(tmp_path / "g.png", "PNG", seed=2)
    with open(os.path.join(raw_root, b"d\xf6g", b"b\xe9st.png"), "wb") as f:
        f.write(good)
    with open(os.path.join(raw_root, b"cat", b"broken\xff.jpg"), "wb") as f:
        f.write(b"not an image")
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    manifest = _manifest(out)
    assert manifest["labels"] == ["cat", "d\\xf6g"]  # shown escaped
    names = sorted(r["image/filename"][0] for r in iterate(str(out), "train"))
    assert names == [b"cat/ok.jpg", b"d\xf6g/b\xe9st.png"]  # the original bytes
    (error,) = read_errors(out)
    assert error["source"]["path"].endswith("cat/broken\\xff.jpg")
    assert error["error"] == "NotAnImage"
    plan = cli("plan", root, "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["num_inputs"] == 3
    # plan showed the pipeline's own form of the name, a NUL and hex ("broken\x00ff.jpg").
    (shown,) = json.loads(plan.stdout)["unusable"]["NotAnImage"]["first"]
    assert shown["path"].endswith("cat/broken\\xff.jpg"), shown
    text = cli("plan", root).stdout
    assert "cat/broken\\xff.jpg: " in text and "\\x00" not in text, text


def test_class_folders_shown_alike_are_refused_not_merged(tmp_path, cli):
    # `d<0xf6>g` and a folder literally named `d\xf6g` were one class, without a word.
    root = tmp_path / "photos"
    make_image(root / "d\\xf6g" / "1.jpg", "JPEG", seed=1)
    os.makedirs(os.path.join(os.fsencode(root), b"d\xf6g"))
    with open(os.path.join(os.fsencode(root), b"d\xf6g", b"2.jpg"), "wb") as f:
        f.write(make_image(tmp_path / "g.jpg", "JPEG", seed=2))
    result = cli("convert", root, "-o", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "two class folders are both shown as 'd\\\\xf6g'" in result.stderr
    assert not (tmp_path / "out").exists()
    # Without labels the names do not matter: both images convert.
    result = cli("convert", root, "-o", tmp_path / "out", "--labels", "none")
    assert result.returncode == 0, result.stderr
    assert _manifest(tmp_path / "out")["num_records"] == 2


def _without_privileges(command: list[str]) -> subprocess.CompletedProcess:
    """Run a command for which permission bits count: root reads every folder, whatever its
    mode, unless it runs in a user namespace of its own, where its capabilities stop at files
    owned by users the namespace does not map (util-linux's unshare)."""
    prefix = ["unshare", "--user"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *command], capture_output=True, text=True, timeout=300, check=False
    )


def test_a_folder_that_cannot_be_read_is_an_error_record(tmp_path):
    # Images in an unreadable sub-folder were skipped without an error record.
    root = _classes(tmp_path / "photos", {"cat": 2, "dog": 2})
    (root / "dog").chmod(0o000)
    try:
        out = tmp_path / "out"
        result = _without_privileges([RECORDFORGE, "convert", str(root), "-o", str(out)])
        assert result.returncode == 0, result.stderr
        assert _errors(out) == {"dog": "UnreadableFolder"}
        manifest = _manifest(out)
        assert (manifest["num_inputs"], manifest["num_records"]) == (3, 2)
        assert "the files in it were not converted" in read_errors(out)[0]["message"]
    finally:
        (root / "dog").chmod(0o755)


def test_a_path_too_long_to_open_is_an_error_record(tmp_path, cli):
    # Images under a path over 4,096 bytes were skipped without an error record.
    root = tmp_path / "photos"
    make_image(root / "cat" / "ok.jpg", "JPEG")
    deep = os.open(root / "cat", os.O_RDONLY)
    try:
        depth = 0
        while len(str(root / "cat")) + depth * 201 < 4200:
            os.mkdir("d" * 200, dir_fd=deep)
            inner = os.open("d" * 200, os.O_RDONLY, dir_fd=deep)
            os.close(deep)
            deep, depth = inner, depth + 1
        with open(os.open("far.jpg", os.O_WRONLY | os.O_CREAT, dir_fd=deep), "wb") as f:
            f.write((root / "cat" / "ok.jpg").read_bytes())
    finally:
        os.close(deep)
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out)
    assert result.returncode == 0, result.stderr
    kinds = [e["error"] for e in read_errors(out)]
    assert kinds == ["PathTooLong"]
    assert _manifest(out)["num_records"] == 1
    shutil.rmtree(root, ignore_errors=True)  # rmtree copes with deep trees (it uses fds)


def test_the_same_folder_twice_or_a_folder_and_its_subfolder_convert_each_file_once(tmp_path, cli):
    # Both were converted twice without a word, and the overlap dropped every label.
    root = _classes(tmp_path / "photos", {"cat": 3, "dog": 2})
    for sources, duplicates in (
        ([root, root], 5),
        ([root / "cat", root], 3),  # the sub-folder first: its files belong to the outer one
        ([root, root / "cat"], 3),
    ):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        result = cli("convert", *sources, "-o", out)
        assert result.returncode == 0, result.stderr
        manifest = _manifest(out)
        assert (manifest["num_inputs"], manifest["num_records"]) == (5, 5)
        assert manifest["source"]["duplicate_files"] == duplicates
        assert manifest["labels"] == ["cat", "dog"]
        assert f"{duplicates} files reached a second time" in result.stdout


def test_a_link_to_a_file_of_another_source_is_a_duplicate(tmp_path, cli):
    root = _classes(tmp_path / "photos", {"cat": 2, "dog": 2})
    other = tmp_path / "more" / "cat"
    other.mkdir(parents=True)
    (other / "linked.jpg").symlink_to(root / "cat" / "0.jpg")
    make_image(other / "own.jpg", "JPEG", seed=9)
    elsewhere = tmp_path / "elsewhere.jpg"
    make_image(elsewhere, "JPEG", seed=10)
    (other / "outside-a.jpg").symlink_to(elsewhere)
    (root / "dog" / "outside-b.jpg").symlink_to(elsewhere)  # the same file, from two sources
    out = tmp_path / "out"
    result = cli("convert", root, tmp_path / "more", "-o", out)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert manifest["num_records"] == 4 + 1 + 1  # 4, own.jpg, and elsewhere.jpg once
    assert manifest["source"]["duplicate_files"] == 2


def test_a_stray_file_at_the_root_keeps_the_labels_of_the_others(tmp_path, cli):
    # One image at the root of a class-per-folder tree removed every label, exit 0, and the
    # summary did not say why.
    root = _classes(tmp_path / "photos", {"cat": 3, "dog": 3})
    make_image(root / "stray.jpg", "JPEG", seed=99)
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert manifest["labels"] == ["cat", "dog"] and manifest["num_records"] == 6
    assert _errors(out) == {"stray.jpg": "NoClassFolder"}
    assert "1 outside any class folder are error records" in result.stdout
    # Or, when the user says so, converted without a label.
    out = tmp_path / "unlabeled"
    result = cli("convert", root, "-o", out, "--stray-files", "unlabeled")
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert manifest["num_records"] == 7 and manifest["errors"]["count"] == 0
    assert manifest["features"]["image/class/label"]["optional"] is True
    assert "converted without a label" in result.stdout


def test_the_summary_says_why_a_flat_folder_has_no_labels(tmp_path, cli):
    root = tmp_path / "flat"
    for i in range(3):
        make_image(root / f"{i}.jpg", "JPEG", seed=i)
    result = cli("convert", root, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "no labels: not every image is in root/<class>/<file>" in result.stdout


def test_the_summary_escapes_control_characters_in_class_names(tmp_path, cli):
    root = tmp_path / "photos"
    for i, name in enumerate(("two\nlines", "clear\x1b[2Jscreen")):
        make_image(root / name / f"{i}.jpg", "JPEG", seed=i)
    result = cli("convert", root, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert "2 classes: clear\\x1b[2Jscreen, two\\nlines\n" in result.stdout
    assert _manifest(tmp_path / "out")["labels"] == ["clear\x1b[2Jscreen", "two\nlines"]


def test_the_summary_says_when_num_shards_could_not_be_kept(tmp_path, cli):
    root = tmp_path / "flat"
    for i in range(3):
        make_image(root / f"{i}.jpg", "JPEG", seed=i)
    result = cli("convert", root, "-o", tmp_path / "out", "--num-shards", "5")
    assert result.returncode == 0, result.stderr
    manifest = _manifest(tmp_path / "out")
    reason = manifest["plan"]["splits"]["train"]["reason"]
    assert reason.startswith("5 shards, as requested; reduced to "), reason
    assert f"\n  train: {reason}\n" in result.stdout
    kept = cli("convert", root, "-o", tmp_path / "kept", "--num-shards", "1")
    assert "as requested" not in kept.stdout


def test_a_hidden_file_named_on_its_own_is_converted(tmp_path, cli):
    # Named on the command line, `.photo.jpg` was skipped as hidden: exit 0, "Converted 0
    # inputs", an empty dataset committed. Only what a folder or glob finds is skipped so.
    folder = tmp_path / "photos"
    make_image(folder / ".photo.jpg", "JPEG", seed=3)
    make_image(folder / "seen.jpg", "JPEG", seed=4)
    table = tmp_path / ".rows.csv"
    table.write_text("name,value\na,1\nb,2\n")
    out = tmp_path / "one"
    result = cli("convert", folder / ".photo.jpg", "-o", out)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert (manifest["num_inputs"], manifest["num_records"]) == (1, 1)
    assert manifest["source"]["ignored_hidden_files"] == 0
    records = list(iterate(out, "train"))
    assert records[0]["image/encoded"] == [(folder / ".photo.jpg").read_bytes()]
    out = tmp_path / "table"
    result = cli("convert", table, "-o", out)
    assert result.returncode == 0, result.stderr
    assert _manifest(out)["num_records"] == 2
    # The folder itself: its hidden file is still skipped and counted.
    out = tmp_path / "folder"
    result = cli("convert", folder, "-o", out)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out)
    assert (manifest["num_inputs"], manifest["num_records"]) == (1, 1)
    assert manifest["source"]["ignored_hidden_files"] == 1


def test_a_folder_or_file_whose_name_has_glob_characters_is_itself(tmp_path, cli):
    # "photos [2024]" was taken for a glob and matched nothing: "no files match", exit 2.
    root = tmp_path / "in" / "photos [2024]"
    make_image(root / "cat" / "[1].jpg", "JPEG", seed=1)
    make_image(root / "cat" / "1.jpg", "JPEG", seed=2)  # what the glob [1].jpg would match
    make_image(root / "dog" / "a.jpg", "JPEG", seed=3)
    out = tmp_path / "folder"
    result = cli("convert", root, "-o", out)
    assert result.returncode == 0, result.stderr
    assert _manifest(out)["num_records"] == 3
    out = tmp_path / "file"
    result = cli("convert", root / "cat" / "[1].jpg", "-o", out)
    assert result.returncode == 0, result.stderr
    (record,) = list(iterate(out, "train"))
    assert record["image/encoded"] == [(root / "cat" / "[1].jpg").read_bytes()]
    # A pattern that names nothing as it is stays a glob.
    out = tmp_path / "glob"
    result = cli("convert", f"{tmp_path}/in/photos*/*/*.jpg", "-o", out)
    assert result.returncode == 0, result.stderr
    assert _manifest(out)["num_records"] == 3
