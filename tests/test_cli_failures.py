"""Failures: usage mistakes (exit 2, one line, nothing written), error budgets, atomic output."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time

import apache_beam as beam
import pytest
from conftest import make_image, shard_files

from recordforge.pipelines.options import tool_version
from recordforge.transforms import write as write_module
from recordforge.transforms.convert import ConvertConfig, ConvertToTFRecords
from recordforge.transforms.core.planning.sharding import ShardingConfig
from recordforge.transforms.core.records import Source


def _assert_usage_error(result, *phrases):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("recordforge: error: ")
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def _tree(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def small_folder(tmp_path):
    root = tmp_path / "photos"
    for i in range(4):
        make_image(root / ("a" if i % 2 else "b") / f"{i}.jpg", "JPEG", seed=i)
    return root


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["convert", "{missing}", "-o", "{out}"], ["input not found"]),
        (["convert", "{empty}", "-o", "{out}"], ["is empty"]),
        (["convert", "{only_hidden}", "-o", "{out}"], ["is empty"]),
        (["convert", "{folder}/*.png", "-o", "{out}"], ["no files match"]),
        (["convert", "{folder}", "-o", "{out}", "--num-hosts", "0"], ["--num-hosts"]),
        (["convert", "{folder}", "-o", "{out}", "--min-shard-mb", "500"], ["--min-shard-mb"]),
        (["convert", "{folder}", "-o", "{out}", "--num-shards", "-3"], ["--num-shards"]),
        (["convert", "{folder}", "-o", "{out}", "--splits", "train=0.5,test=0.2"], ["add up to 1"]),
        (["convert", "{folder}", "-o", "{out}", "--splits", "train"], ["NAME=FRACTION"]),
        (["convert", "{folder}", "-o", "{out}", "--max-error-rate", "2"], ["--max-error-rate"]),
        (["convert", "{folder}", "-o", "{out}", "--name", "a/b"], ["--name"]),
        (["convert", "{folder}", "-o", "{out}", "--name=_x"], ["starting with a letter or digit"]),
        (["convert", "{folder}", "-o", "{out}", "--label-column", "x"], ["CSV inputs"]),
        (["convert", "{folder}", "-o", "{out}", "--num-host", "8"], ["unrecognised option"]),
        (["convert", "{folder}", "-o", "{folder}/out"], ["inside the input"]),
        (["convert", "{folder}", "-o", "{out}[1]"], ["'[' in its path", "as a pattern"]),
        (["convert", "{folder}", "-o", "{out}*"], ["'*' in its path"]),
        (["reshard", "{folder}", "-o", "{out}?"], ["'?' in its path"]),
        (["convert", "{folder}", "{csv}", "-o", "{out}"], ["cannot be mixed"]),
        (["convert", "{tsv}", "-o", "{out}"], ["named as a table", "CSV files only"]),
        # Every file became a NotAnImage, the run failed "all inputs failed" (a tester's finding)
        (["convert", "{tables}", "-o", "{out}"], ["holds CSV files only", "/*.csv), to convert"]),
        (["plan", "{missing}"], ["input not found"]),
    ],
)
def test_usage_errors_exit_2_with_one_line_and_write_nothing(
    small_folder, tmp_path, cli, args, phrases
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "only_hidden").mkdir()
    (tmp_path / "only_hidden" / ".DS_Store").write_bytes(b"x")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "data.tsv").write_text("a\tb\n1\t2\n")  # was one NotAnImage, its run failed
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "a.csv").write_text("a,b\n1,2\n")
    (tmp_path / "tables" / "b.csv.gz").write_bytes(b"")
    values = {
        "missing": tmp_path / "nope",
        "empty": tmp_path / "empty",
        "only_hidden": tmp_path / "only_hidden",
        "folder": small_folder,
        "out": tmp_path / "out",
        "csv": tmp_path / "data.csv",
        "tsv": tmp_path / "data.tsv",
        "tables": tmp_path / "tables",
    }
    before = _tree(tmp_path)
    result = cli(*[a.format(**values) for a in args])
    _assert_usage_error(result, *phrases)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["--name", "n" * 200], ["--name 'nnn", "(200 chars)", "shorten them by 18 bytes"]),
        (["--splits", "s" * 240 + "=0.5,b=0.5"], ["the dataset name", "split 'sss", "(240 chars)"]),
        (["--name", "n" * 190, "--compression", "gzip"], ["--name", "shorten them by 11 bytes"]),
    ],
)
def test_names_too_long_for_shard_file_names_are_usage_errors(
    small_folder, tmp_path, cli, args, phrases
):
    """While a run works, a shard's part record is `{name}-{split}.tfrecord-00000-of-00001.{32
    hex}.part.json`: past 255 bytes, the file system's limit, the run failed writing its first
    shard, with a traceback ('OSError: [Errno 36] File name too long'), after all the work."""
    before = _tree(tmp_path)
    result = cli("convert", small_folder, "-o", tmp_path / "out", *args)
    _assert_usage_error(result, *phrases)
    assert _tree(tmp_path) == before


def test_names_at_the_file_name_limit_convert(small_folder, tmp_path, cli):
    # The longest name written: `{name}-train.tfrecord-00000-of-00001.{32 hex}.part.json`.
    name = "n" * (255 - len("-train.tfrecord-00000-of-00001") - 33 - len(".part.json"))
    result = cli("convert", small_folder, "-o", tmp_path / "out", "--name", name)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in shard_files(tmp_path / "out")] == [
        f"{name}-train.tfrecord-00000-of-00001"
    ]


def test_a_split_column_value_too_long_for_a_file_name_fails_in_one_line(tmp_path, cli):
    table = tmp_path / "t.csv"
    table.write_text(
        "x,split\n" + "".join(f"{i},{'s' * 240 if i % 2 else 'train'}\n" for i in range(6))
    )
    out = tmp_path / "out"
    result = cli("convert", table, "--split-column", "split", "-o", out)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "failed" in line]
    assert line.startswith("recordforge: failed: cannot write shard out-sss")
    assert "too long for the file system" in line and "'ssss" in line
    assert not out.exists()


def test_an_output_beside_an_image_file_given_on_its_own_is_not_inside_the_input(small_folder, cli):
    # `convert photos/b/0.jpg -o photos/b/out` was refused: "the output folder ... is inside the
    # input '.../0.jpg'; its files would be read as inputs" (the file's folder was taken for
    # the input), though a file source reads that one file only. A folder source still refuses.
    image = small_folder / "b" / "0.jpg"
    out = small_folder / "b" / "out"
    result = cli("convert", image, "-o", out, "--name", "one")
    assert result.returncode == 0, result.stderr
    assert [p.name for p in shard_files(out)] == ["one-train.tfrecord-00000-of-00001"]
    assert json.loads((out / "dataset_info.json").read_text())["num_records"] == 1
    _assert_usage_error(cli("convert", small_folder / "b", "-o", out), "inside the input")


def test_non_empty_output_needs_overwrite(small_folder, tmp_path, cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _assert_usage_error(cli("convert", small_folder, "-o", out), "not empty", "--overwrite")
    _assert_usage_error(cli("convert", small_folder, "-o", out, "--overwrite"), "did not write")
    assert _tree(out) == ["keep.txt"]


def test_overwrite_replaces_a_dataset_without_mixing_runs(small_folder, tmp_path, cli):
    out = tmp_path / "out"
    assert (
        cli("convert", small_folder, "-o", out, "--name", "old", "--num-shards", "2").returncode
        == 0
    )
    assert len(shard_files(out)) == 2
    result = cli("convert", small_folder, "-o", out, "--name", "new", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert [p.name for p in shard_files(out)] == ["new-train.tfrecord-00000-of-00001"]
    assert json.loads((out / "dataset_info.json").read_text())["name"] == "new"


def test_unwritable_output(small_folder, tmp_path, cli):
    if os.geteuid() == 0:
        # root ignores permissions; a path under a regular file cannot be created by anyone.
        blocker = tmp_path / "file"
        blocker.write_text("x")
        out = blocker / "out"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "out"
    _assert_usage_error(cli("convert", small_folder, "-o", out), "cannot write")


def test_error_rate_exceeded_fails_and_leaves_the_output_as_it_was(small_folder, tmp_path, cli):
    for i in range(3):
        (small_folder / "a" / f"bad{i}.jpg").write_bytes(b"not an image at all")
    out = tmp_path / "out"
    result = cli("convert", small_folder, "-o", out, "--max-error-rate", "0.2")
    assert result.returncode == 1, result.stderr
    assert "3 of 7 inputs failed (42.9%)" in result.stderr
    assert "Traceback" not in result.stderr
    # Nothing is committed: no output folder, the reasons in the run's working folder.
    work = tmp_path / ".out.recordforge"
    assert not out.exists()
    assert f"The reasons are in {work}/errors" in result.stderr
    assert _tree(work / "errors") == ["probe.jsonl"]
    assert len((work / "errors" / "probe.jsonl").read_text().splitlines()) == 3
    assert not (tmp_path / ".out.recordforge-lock").exists()
    # Under the limit the same input converts (the failed run's leftovers go), and reports its
    # errors prominently.
    result = cli("convert", small_folder, "-o", out, "--max-error-rate", "0.5")
    assert result.returncode == 0, result.stderr
    assert "WARNING: 3 of 7 inputs failed" in result.stderr
    assert not work.exists()
    # A rerun that fails its error rate leaves the dataset it would replace as it was.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = cli("convert", small_folder, "-o", out, "--max-error-rate", "0.2", "--overwrite")
    assert result.returncode == 1, result.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_refused_run_in_worker_processes_says_so_in_one_line(small_folder, tmp_path, cli):
    """Beam's SDK worker prints a failed bundle's traceback on its own stderr; the launcher
    reports the refusal once, and shows the workers' lines only with -v."""
    for i in range(3):
        (small_folder / "a" / f"bad{i}.jpg").write_bytes(b"not an image at all")
    out = tmp_path / "out"
    args = ("convert", small_folder, "-o", out, "--max-error-rate", "0.2", "--workers", "2")
    result = cli(*args)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("recordforge: converting"), result.stderr
    assert lines[1].startswith("recordforge: failed: 3 of 7 inputs failed (42.9%)"), lines
    told = cli(*args, "-v")
    assert told.returncode == 1, told.stderr
    assert "recordforge: Traceback (most recent call last):" in told.stderr
    assert "ErrorRateExceeded" in told.stderr


def test_a_crash_mid_run_leaves_no_manifest_and_no_partial_shard(
    tmp_path, many_images, monkeypatch
):
    """An unexpected failure while writing: no manifest, no partial file under a final name."""
    calls = {"n": 0}
    real_read = write_module.read_payload

    def failing_read(ref, *opened):
        calls["n"] += 1
        if calls["n"] == 150:
            raise RuntimeError("disk on fire")
        return real_read(ref, *opened)

    monkeypatch.setattr(write_module, "read_payload", failing_read)
    out = tmp_path / "out"
    out.mkdir()
    root = str(many_images)
    config = ConvertConfig(
        sources=(Source(0, "images", root + "/**", root, root),),
        output=str(out),
        name="ds",
        sharding=ShardingConfig(min_shard_bytes=100_000, max_shard_bytes=400_000),
        tool_version=tool_version(),
    )
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    with pytest.raises(Exception, match="disk on fire"):
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            pipeline | ConvertToTFRecords(config)
    assert calls["n"] >= 150
    assert not (out / "dataset_info.json").exists()
    from recordforge.transforms.core.tfrecord.framing import read_records

    written = shard_files(out)
    for path in written:  # shards that did complete are whole; nothing else has a final name
        with path.open("rb") as f:
            assert sum(1 for _ in read_records(f)) > 0
    assert len(written) < 9


def test_a_run_where_every_input_fails_is_a_failure(tmp_path, cli):
    (tmp_path / "in" / "x").mkdir(parents=True)
    (tmp_path / "in" / "x" / "1.jpg").write_text("not an image")
    (tmp_path / "in" / "x" / "2.png").write_bytes(b"")
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "in", "-o", out)
    assert result.returncode == 1
    assert "all 2 inputs failed" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
    assert _tree(tmp_path / ".out.recordforge" / "errors") == ["probe.jsonl"]


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_output_cut_short_by_a_pipe_is_not_an_error(photo_folder, tmp_path, cli, command):
    """`recordforge verify --json OUT | head -1`: no traceback when the reader stops early."""
    from conftest import RECORDFORGE

    out = tmp_path / "out"
    assert cli("convert", photo_folder, "-o", out).returncode == 0
    reader = subprocess.Popen(
        [RECORDFORGE, command, str(out), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reader.stdout.close()  # the reader is gone before anything is printed, as `| head` may be
    _, stderr = reader.communicate(timeout=300)
    assert reader.returncode == 0, stderr
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr


# --- runner preflight: a runner that cannot work fails in seconds, before anything is written ---


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.parametrize(
    ("runner", "phrase"),
    [
        (["--runner", "portable", "--job_endpoint", "127.0.0.1:{port}"], "the Beam job service"),
        (["--runner", "dask", "--dask_client_address", "127.0.0.1:{port}"], "the Dask scheduler"),
        (
            ["--runner", "portable", "--job_endpoint", "127.0.0.1:{listening}"]
            + ["--worker_pool", "127.0.0.1:{port}"],
            "the SDK worker pool",
        ),
        (["--runner", "DataflowRunner", "--project", "p"], "--region, --temp_location"),
    ],
    ids=["job-endpoint", "dask-scheduler", "worker-pool", "dataflow-options"],
)
def test_a_runner_that_cannot_work_is_a_usage_error_within_seconds(
    small_folder, tmp_path, cli, runner, phrase
):
    with socket.socket() as listening:  # a job service that does answer
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        values = {"port": _closed_port(), "listening": listening.getsockname()[1]}
        started = time.monotonic()
        result = cli(
            "convert", small_folder, "-o", tmp_path / "out", *[a.format(**values) for a in runner]
        )
        seconds = time.monotonic() - started
    _assert_usage_error(result, phrase)
    assert seconds < 60  # the program's start-up included; the check itself waits 5 s at most
    assert not (tmp_path / "out").exists()


# Loaded by every Python process of the first run (through PYTHONPATH): its shard files open
# only once the file GO_FILE names exists, so the run holds its lock until the test says.
_WAIT_TO_WRITE = """
import os, time

from recordforge.transforms import write

_create = write._create


def _create_when_told(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _create(path)


write._create = _create_when_told
"""


def test_a_second_run_into_the_same_output_is_refused_naming_the_first(small_folder, tmp_path):
    from conftest import RECORDFORGE

    out = tmp_path / "out"
    lock = tmp_path / ".out.recordforge-lock"
    site, go = tmp_path / "site", tmp_path / "go"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_WAIT_TO_WRITE)
    first = subprocess.Popen(
        [RECORDFORGE, "convert", str(small_folder), "-o", str(out), "--name", "one"]
        + ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site), "GO_FILE": str(go)},
    )
    deadline = time.monotonic() + 120
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    holder = json.loads(lock.read_text())
    second = subprocess.run(
        [RECORDFORGE, "convert", str(small_folder), "-o", str(out), "--name", "two"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    go.touch()  # the first run may write now
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    _assert_usage_error(second, "another conversion is writing this output", holder["run_id"])
    assert f"pid {holder['pid']} on " in second.stderr
    assert [p.name for p in shard_files(out)] == ["one-train.tfrecord-00000-of-00001"]
    assert not lock.exists()


def test_overwrite_refuses_a_dataset_recordforge_did_not_write(small_folder, tmp_path, cli):
    """A TFDS dataset (TFDS's own dataset_info.json, features.json and shards): not ours."""
    tfds_made = tmp_path / "tfds"
    assert cli("convert", small_folder, "-o", tfds_made, "--tfds").returncode == 0
    (tfds_made / "recordforge.json").unlink()  # what TFDS itself writes has no such file
    before = _tree(tfds_made)
    _assert_usage_error(
        cli("convert", small_folder, "-o", tfds_made, "--overwrite"), "did not write"
    )
    assert _tree(tfds_made) == before


def test_a_stop_after_the_commits_cleanup_says_the_new_dataset_is_in_place(tmp_path):
    # A Ctrl-C that arrived after the commit had put the new dataset in place and removed its
    # working folder (journal and all) was reported as "OUT is as it was".
    import shutil

    from recordforge.pipelines import output as output_folder
    from recordforge.pipelines import run_outcomes as program

    out = str(tmp_path / "out")

    def prepared():
        return output_folder.prepare_output(
            out, run_id="r1", options={}, overwrite=True, resume=False, resumable=False
        )

    stopped_before = prepared()
    try:
        # An output that never existed "is as it was" said too little (a tester's finding).
        assert program.kept(stopped_before).startswith(f"{out} was not created")
    finally:
        stopped_before.release()
    stopped_after = prepared()
    try:
        shutil.rmtree(stopped_after.staging.work)  # what the commit's cleanup does last
        assert program.kept(stopped_after) == (
            f"the new dataset is in place in {out}: the run was stopped after its commit"
        )
    finally:
        stopped_after.release()


def test_a_stdout_that_cannot_be_written_is_one_line_and_a_converted_dataset_stays(
    small_folder, tmp_path
):
    # `> log` on a full disk: convert committed, then printed a traceback and exited 1;
    # verify exited 1, its "the dataset has problems" (a tester's finding).
    from conftest import RECORDFORGE

    out = tmp_path / "out"

    def run(*args):
        with open("/dev/full", "w") as full:
            return subprocess.run(
                [RECORDFORGE, *map(str, args)], stdout=full, stderr=subprocess.PIPE, text=True
            )

    converted = run("convert", small_folder, "-o", out, "-q")
    assert converted.returncode == 0, converted.stderr
    assert converted.stderr.splitlines() == [
        "recordforge: warning: the summary could not be written to stdout (No space left on "
        "device); the dataset is in place"
    ]
    assert (out / "dataset_info.json").exists()
    verified = run("verify", out)
    assert verified.returncode == 2, verified.stderr
    assert verified.stderr.splitlines() == [
        "recordforge: error: cannot write to stdout: No space left on device"
    ]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            RuntimeError(
                "OSError: [Errno 5] Input/output error: '/data/out/x' [while running "
                "'ConvertToTFRecords/WriteShards/WriteShard/ParDo(_WriteShardFn)']"
            ),
            "the system refused a file operation at /data/out/x: Input/output error (EIO)",
        ),
        (
            RuntimeError(
                "OSError: [Errno 5] Input/output error [while running "
                "'ConvertToTFRecords/WriteShards/WriteShard/ParDo(_WriteShardFn)']"
            ),
            "the system refused a file operation in WriteShard: Input/output error (EIO)",
        ),
        (
            RuntimeError(
                "Rename operation failed with exceptions {('/a.tmp', '/a.json'): "
                "OSError(PermissionError(13, 'Permission denied'))}"
            ),
            "the system refused a file operation at /a.tmp: Permission denied (EACCES)",
        ),
        (
            socket.gaierror(-2, "Name or service not known"),
            "a network call failed: Name or service not known (errno -2)",
        ),
        (ValueError("a defect of the program"), None),
    ],
    ids=["text-path", "text-step", "beam-io-error", "offline", "no-errno"],
)
def test_a_refused_system_call_is_told_in_words(error, message):
    # A gs:// image on a machine without network ended in a 21 KB traceback; so did any errno
    # but a full disk's (testers' findings). A defect of the program keeps its traceback.
    from recordforge.pipelines.run_outcomes import system_error

    assert system_error(error) == message
