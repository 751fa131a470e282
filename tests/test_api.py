"""The Python API: convert, plan, verify; tables as sources; errors; the README example."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import grpc
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import userstate
from conftest import make_image, read_errors, shard_files

import recordforge
from recordforge import errors

MULTI_PROCESS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _shards(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in shard_files(out)}


def _errors_with_paths(out: pathlib.Path, shown: str) -> list[dict]:
    """The error records, each one's file path replaced by `shown`."""
    return [{**e, "source": {**e["source"], "path": shown}} for e in read_errors(out)]


def _frame(rows: int = 40_000) -> pd.DataFrame:
    """Integers, floats with gaps, text, a label; one cell far past the type sample is text in
    the integer column (a BadCell), one row has no label."""
    rng = np.random.default_rng(3)
    count = pd.Series(rng.integers(-1000, 1000, rows), dtype=object)
    count[rows - 7] = "many"
    score = rng.normal(size=rows)
    score[::11] = np.nan
    label = rng.choice(["cat", "dog", "fox"], rows).astype(object)
    label[5] = None
    return pd.DataFrame(
        {"id": np.arange(rows), "count": count, "score": score, "label": label, "note": "x"}
    )


def test_a_dataframe_converts_as_the_same_data_written_to_csv(tmp_path):
    frame = _frame()
    csv_folder = tmp_path / "csv"
    csv_folder.mkdir()
    frame.to_csv(csv_folder / "table.csv", index=False)
    options = dict(label_column="label", splits="train=0.7,test=0.3", min_shard_mb=0.25)
    from_csv = recordforge.convert(csv_folder / "table.csv", tmp_path / "a", name="d", **options)
    staged_before = set(pathlib.Path("/tmp").glob("recordforge-table-*"))  # others' leftovers
    from_frame = recordforge.convert(frame, tmp_path / "b", name="d", **options)

    assert len(_shards(tmp_path / "a")) > 2
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")
    assert from_frame.counts == from_csv.counts and from_frame.num_records == 40_000 - 2
    expected = _errors_with_paths(tmp_path / "a", "<pandas.DataFrame>")
    assert read_errors(tmp_path / "b") == expected
    assert sorted((e["source"]["row"], e["error"]) for e in expected) == [
        (6, "MissingLabel"),
        (40_000 - 6, "BadCell"),
    ]
    manifest = from_frame.manifest.to_dict()
    assert manifest["source"]["inputs"] == ["<pandas.DataFrame>"]
    assert manifest["features"] == from_csv.manifest.to_dict()["features"]
    # Nothing of the staged file is left behind.
    assert set(pathlib.Path("/tmp").glob("recordforge-table-*")) == staged_before


def test_an_arrow_table_converts_as_pyarrow_csv_writes_it(tmp_path):
    table = pa.table(
        {
            "n": pa.array([1, None, 3, 4, 5, 6], pa.int64()),
            "f": pa.array([0.1, 2.5, None, 1e300, -0.0, 7.0]),
            "s": pa.array(['a "quoted", text', "", None, "ü", "line\nbreak", "z"]),
            "label": ["x", "y", "x", "y", "x", "y"],
        }
    )
    (tmp_path / "csv").mkdir()
    pyarrow.csv.write_csv(table, tmp_path / "csv" / "table.csv")
    recordforge.convert(
        tmp_path / "csv" / "table.csv", tmp_path / "a", name="t", label_column="label"
    )
    dataset = recordforge.convert(table, tmp_path / "b", name="t", label_column="label")
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")
    records = sorted(recordforge.iterate(dataset), key=lambda r: r["label/text"])
    # `f` is a float column, and 1e300 is beyond float32: a BadCell of its row, both ways.
    assert len(records) == 5 and {r["label/text"][0] for r in records} == {b"x", b"y"}
    for out in ("a", "b"):
        (error,) = read_errors(tmp_path / out)
        assert (error["error"], error["source"]["row"]) == ("BadCell", 4)


def test_an_arrow_table_with_columns_a_csv_cannot_hold_is_a_usage_error(tmp_path):
    # pyarrow's own ArrowInvalid came out of convert(), naming no column.
    tables = {
        "'l' (list<item: int64>)": pa.table({"n": [1, 2], "l": pa.array([[1, 2], [3]])}),
        "'s' (struct<a: int64>)": pa.table({"s": pa.array([{"a": 1}, {"a": 2}])}),
        "Invalid UTF8": pa.table({"b": pa.array([b"\xff\xfe", b"a"], pa.binary())}),
    }
    for said, table in tables.items():
        with pytest.raises(errors.UsageError, match=re.escape(said)):
            recordforge.convert(table, tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_a_dataframes_usage_errors_name_the_dataframe_not_its_staged_file(tmp_path):
    # They named /tmp/recordforge-table-*/table.csv, a file the user never made (gone by then).
    cases = (
        (pd.DataFrame({"a": [1, 2]}), {"label_column": "nope"}, "not a column of"),
        (pd.DataFrame([[1, 2]], columns=["a", "a"]), {}, "more than once"),
    )
    for table, options, said in cases:
        with pytest.raises(errors.UsageError, match=said) as caught:
            recordforge.convert(table, tmp_path / "out", **options)
        assert "<pandas.DataFrame>" in str(caught.value)
        assert "table.csv" not in str(caught.value)


def test_image_paths_in_a_dataframe_are_relative_to_the_current_folder(tmp_path, monkeypatch, tf):
    images = tmp_path / "images"
    images.mkdir()
    for index in range(6):
        make_image(images / f"{index}.png", "PNG", seed=index)
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    frame = pd.DataFrame(
        {
            "path": [f"images/{i}.png" for i in range(6)]
            + ["images/broken.png", "images/gone.png"],
            "label": ["a", "b"] * 4,
        }
    )
    frame.to_csv(tmp_path / "table.csv", index=False)  # its paths: relative to its folder
    monkeypatch.chdir(tmp_path)
    options = dict(image_column="path", label_column="label")
    recordforge.convert("table.csv", tmp_path / "a", name="i", **options)
    dataset = recordforge.convert(frame, tmp_path / "b", name="i", **options)
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")
    assert read_errors(tmp_path / "b") == _errors_with_paths(tmp_path / "a", "<pandas.DataFrame>")
    assert sorted(e["source"]["row"] for e in read_errors(tmp_path / "b")) == [7, 8]

    # Read back with tf.data through load(), which takes what convert returned.
    loaded = recordforge.load(dataset, decode_images=True, image_channels=3)
    pixels = [example["image"].shape for example in loaded]
    assert len(pixels) == 6 and all(shape == (48, 64, 3) for shape in pixels)


def test_options_are_the_commands_own(tmp_path):
    from recordforge.pipelines.cli import command_parser

    keywords = {
        action.dest
        for action in command_parser("convert")._actions
        if action.option_strings and action.dest not in ("help", "verbose", "quiet", "output")
    }
    assert {"num_hosts", "image_column", "allowed_root", "write_index", "runner"} <= keywords
    source = tmp_path / "t.csv"
    source.write_text("a,b\n1,x\n2,y\n")
    for key in keywords:  # every option is a keyword: none is refused as unknown
        with pytest.raises(errors.UsageError) as refused:  # two values: none takes these
            recordforge.convert(source, tmp_path / "o", **{key: ["1", "2"]})
        assert "has no option" not in str(refused.value)
    with pytest.raises(errors.UsageError, match="did you mean 'num_hosts'"):
        recordforge.convert(source, tmp_path / "o", num_host=2)
    with pytest.raises(ValueError, match="--num-hosts must be between 1"):
        recordforge.convert(source, tmp_path / "o", num_hosts=0)
    with pytest.raises(ValueError, match="invalid choice: 'zip'"):
        recordforge.convert(source, tmp_path / "o", compression="zip")
    with pytest.raises(errors.UsageError, match="overwrite is True or False"):
        recordforge.convert(source, tmp_path / "o", overwrite="yes")
    with pytest.raises(errors.UsageError, match="name takes one value"):
        recordforge.convert(source, tmp_path / "o", name=["a", "b"])
    assert not (tmp_path / "o").exists()

    # Lists, dicts, paths and switches mean what their flags mean.
    dataset = recordforge.convert(
        source,
        tmp_path / "o",
        splits={"train": 0.5, "test": 0.5},
        allowed_root=[tmp_path],
        write_index=True,
        num_hosts=2,
    )
    assert set(dataset.splits) == {"train", "test"} and dataset.num_records == 2
    assert dataset.manifest.options["allowed_roots"] == [str(tmp_path)]
    assert dataset.manifest.options["sharding"]["num_hosts"] == 2
    assert all(pathlib.Path(p).exists() for p in dataset.shard_paths("train"))


def test_beam_options_as_flags_or_pipeline_options_give_the_same_bytes(tmp_path):
    frame = _frame(3000)
    recordforge.convert(frame, tmp_path / "a", name="d", label_column="label")
    recordforge.convert(
        frame, tmp_path / "b", name="d", label_column="label", beam_args=MULTI_PROCESS
    )
    options = PipelineOptions(direct_num_workers=2, direct_running_mode="multi_processing")
    recordforge.convert(frame, tmp_path / "c", name="d", label_column="label", beam_args=options)
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b") == _shards(tmp_path / "c")
    with pytest.raises(errors.UsageError, match="unrecognised option '--direct_num_worker=2'"):
        recordforge.convert(frame, tmp_path / "d", beam_args=["--direct_num_worker=2"])


def test_patches_do_not_outlive_a_call(tmp_path):
    beams = grpc.server, userstate.get_dofn_specs, statesampler.StateSampler
    frame = _frame(500)
    recordforge.convert(frame, tmp_path / "a", beam_args=MULTI_PROCESS, label_column="label")
    assert (grpc.server, userstate.get_dofn_specs, statesampler.StateSampler) == beams
    with pytest.raises(errors.ErrorRateExceeded):
        recordforge.convert(frame, tmp_path / "b", label_column="label", max_error_rate=0)
    assert (grpc.server, userstate.get_dofn_specs, statesampler.StateSampler) == beams
    recordforge.plan(frame, label_column="label")
    assert (grpc.server, userstate.get_dofn_specs, statesampler.StateSampler) == beams


def test_a_refused_run_raises_and_writes_no_manifest(tmp_path):
    frame = _frame(500)
    with pytest.raises(errors.RunFailed, match="inputs failed") as refused:
        recordforge.convert(frame, tmp_path / "out", label_column="label", max_error_rate=0)
    assert isinstance(refused.value, errors.ErrorRateExceeded)
    assert isinstance(refused.value, errors.RecordforgeError)
    assert not (tmp_path / "out" / "dataset_info.json").exists()
    with pytest.raises(errors.UsageError, match="is not a recordforge dataset"):
        recordforge.open_dataset(tmp_path / "out")


def test_a_refused_system_call_is_a_run_failed_and_a_failed_cleanup_is_no_failure(
    tmp_path, monkeypatch
):
    # convert() raised Beam's bare RuntimeError for a refused system call, even when only the
    # cleanup after its commit had failed and the new dataset was in place (a tester's finding).
    import errno

    from recordforge.transforms import staging

    frame, out = _frame(200), tmp_path / "out"
    recordforge.convert(frame, out, label_column="label")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def refused(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", str(out))

    with monkeypatch.context() as patch:
        patch.setattr(staging, "_swap_in", refused)
        with pytest.raises(errors.RunFailed, match=r"refused a file operation at .*\(EIO\)"):
            recordforge.convert(frame, out, label_column="label", overwrite=True, num_shards=3)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

    def cleanup_refused(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "old"))

    other = tmp_path / "other"  # `out` holds the refused run's commit, which its next run ends
    recordforge.convert(frame, other, label_column="label")
    with monkeypatch.context() as patch:
        patch.setattr(staging, "_clear_old_copy", cleanup_refused)
        dataset = recordforge.convert(
            frame, other, label_column="label", overwrite=True, num_shards=3
        )
    assert len(dataset.manifest.splits["train"].shards) == 3
    assert recordforge.verify(other).ok


def test_plan_returns_the_plan(tmp_path):
    frame = _frame(2000)
    plan = recordforge.plan(frame, label_column="label", splits={"train": 0.8, "test": 0.2})
    assert isinstance(plan, recordforge.Plan)
    assert plan.num_inputs == 2000 and plan.failed_inputs == 1  # the row without a label
    assert set(plan.splits) == {"train", "test"} and plan.labels == ["cat", "dog", "fox"]
    assert "train:" in str(plan) and plan.to_dict() == plan.report
    with pytest.raises(errors.UsageError, match="plan\\(\\) has no option 'name'"):
        recordforge.plan(frame, name="x")


def test_verify_returns_a_report_and_raises_only_when_asked(tmp_path):
    dataset = recordforge.convert(_frame(500), tmp_path / "out", label_column="label")
    assert recordforge.verify(dataset).ok and recordforge.verify(tmp_path / "out", check=True).ok
    shard = pathlib.Path(dataset.shard_paths("train")[0])
    shard.write_bytes(shard.read_bytes()[:-5])
    report = recordforge.verify(dataset)
    assert not report.ok
    with pytest.raises(errors.VerifyFailed) as failed:
        recordforge.verify(str(tmp_path / "out"), check=True)
    assert failed.value.report.findings.errors >= 1
    with pytest.raises(errors.UsageError):
        recordforge.verify(dataset, max_findings=-1)


def test_sources_that_are_not_inputs_are_usage_errors(tmp_path):
    with pytest.raises(errors.UsageError, match="no rows or no columns"):
        recordforge.convert(pd.DataFrame({"a": []}), tmp_path / "o")
    with pytest.raises(errors.UsageError, match="alone"):
        recordforge.convert([pd.DataFrame({"a": [1]})], tmp_path / "o")
    with pytest.raises(errors.UsageError, match="input not found"):
        recordforge.convert(tmp_path / "nothing", tmp_path / "o")
    with pytest.raises(errors.UsageError, match="beam_args is a list"):
        recordforge.convert(pd.DataFrame({"a": [1]}), tmp_path / "o", beam_args="--x")


def test_what_is_not_a_path_is_a_usage_error_and_writes_nothing(tmp_path, monkeypatch):
    # A number or None where a path belongs raised TypeErrors from inside (or, as an output,
    # wrote a dataset into a folder named "42"), and WriteDataset refused a pathlib.Path.
    monkeypatch.chdir(tmp_path)
    table = pd.DataFrame({"a": [1, 2, 3]})
    calls = {
        "output": lambda: recordforge.convert(table, 42),
        "sources": lambda: recordforge.convert(42, tmp_path / "o"),
        "no sources": lambda: recordforge.convert(None, tmp_path / "o"),
        "a source": lambda: recordforge.convert([tmp_path, 7], tmp_path / "o"),
        "reshard": lambda: recordforge.reshard(42, tmp_path / "o"),
        "WriteDataset": lambda: recordforge.WriteDataset(42),
        "open_dataset": lambda: recordforge.open_dataset(42),
        "verify": lambda: recordforge.verify(None),
    }
    for what, call in calls.items():
        with pytest.raises(errors.UsageError, match="path|paths"):
            call()
        assert sorted(p.name for p in tmp_path.iterdir()) == [], what
    assert recordforge.WriteDataset(tmp_path / "w").config.output == str(tmp_path / "w")


def test_a_dataset_in_the_home_folder_is_read_by_its_tilde_path(tmp_path, monkeypatch):
    # convert, plan and verify took "~/data"; open_dataset, load and iterate did not.
    monkeypatch.setenv("HOME", str(tmp_path))
    recordforge.convert(pd.DataFrame({"a": [1, 2, 3]}), "~/data")
    assert (tmp_path / "data" / "dataset_info.json").is_file()
    assert recordforge.open_dataset("~/data").manifest.num_records == 3
    assert sorted(row["a"][0] for row in recordforge.iterate("~/data")) == [1, 2, 3]
    assert len(list(recordforge.load("~/data"))) == 3


def test_the_library_never_exits():
    package = pathlib.Path(recordforge.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"sys\.exit|SystemExit|os\._exit|\.exit\(", text):
            line = text[: match.start()].count("\n") + 1
            offenders.append(f"{path.relative_to(package)}:{line}")
    # Only the programs exit: their entry points, under `if __name__ == "__main__":`, and the
    # `recordforge` program's second-signal exit (its handlers are installed by the program) and
    # its end without the interpreter's teardown (registered by the program's main()); and the
    # worker processes the fork server forks, which end with os._exit (a forked child
    # must not run its parent's exit handlers).
    programs = ("__main__.py", "command.py", "pipelines/loopback.py")
    forked = ("worker_forks.py",)
    assert offenders and all(o.startswith(programs + forked) for o in offenders), offenders
    for program in programs:
        assert 'if __name__ == "__main__":\n    sys.exit(' in (package / program).read_text()
    command = (package / "command.py").read_text()
    assert [o for o in offenders if o.startswith("command.py")] == [
        f"command.py:{command[: command.index(marker)].count(chr(10)) + 1}"
        for marker in ("os._exit(128", "os._exit(_finished", "sys.exit(main())")
    ]


def test_cli_usage_errors_stay_one_line_with_status_2(tmp_path, cli):
    result = cli("convert", tmp_path, "--num-hosts", "x", "-o", tmp_path / "o")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == (
        "recordforge: error: argument --num-hosts: invalid int value: 'x' "
        "(see recordforge convert --help)\n"
    )


def _readme_example() -> str:
    text = README.read_text()
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(tmp_path):
    # In a fresh interpreter and folder, as a notebook would run it.
    done = subprocess.run(
        [sys.executable, "-c", _readme_example()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "pets" / "dataset_info.json").read_text())
    assert manifest["num_records"] == 4 and manifest["source"]["inputs"] == ["<pandas.DataFrame>"]


def test_ctrl_c_during_convert_raises_keyboard_interrupt_and_the_next_call_works(
    tmp_path, monkeypatch
):
    """Ctrl-C (SIGINT) while the in-process runner writes shards: FnApiRunner re-raised the
    KeyboardInterrupt a DoFn met as a RuntimeError, so `except Exception` around convert()
    swallowed it. It is a KeyboardInterrupt; the output is as it was, the staged shards are
    kept for `resume=True`, and the next call converts. The SIGINT is sent by the writer itself
    once its first shard is staged, so that it lands mid-run however busy the machine is."""
    import os
    import signal
    import time

    from recordforge.transforms import write
    from recordforge.transforms.core.files.parts import PART_RECORD_SUFFIX

    for i in range(600):
        make_image(tmp_path / "photos" / ("a", "b")[i % 2] / f"{i:04d}.png", "PNG", seed=i)
    out = tmp_path / "out"
    recordforge.convert(str(tmp_path / "photos"), str(out), num_shards=2)
    before = _shards(out)
    write_atomically = write.write_atomically
    interrupted = []

    def interrupt_once_a_shard_is_staged(final, temp_dir, fill):
        write_atomically(final, temp_dir, fill)
        if final.endswith(PART_RECORD_SUFFIX) and not interrupted:
            interrupted.append(final)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # the interrupt arrives meanwhile

    monkeypatch.setattr(write, "write_atomically", interrupt_once_a_shard_is_staged)
    # Python's own Ctrl-C handler, as in a terminal or a notebook: a process started in the
    # background by a shell (a CI job) inherits SIGINT ignored, and Python then installs none.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            recordforge.convert(str(tmp_path / "photos"), str(out), num_shards=12, overwrite=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted
    assert _shards(out) == before
    monkeypatch.undo()
    resumed = recordforge.convert(
        str(tmp_path / "photos"), str(out), num_shards=12, overwrite=True, resume=True
    )
    assert resumed.counts == {"train": 600}
    assert len(shard_files(out)) == 12


def test_a_table_that_does_not_fit_its_temporary_folder_is_out_of_space(tmp_path):
    """The table is staged as CSV in a temporary folder first: a full disk there raised a bare
    OSError ('[Errno 28] No space left on device', naming no file) out of convert()."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        with pytest.raises(errors.RunFailed) as raised:  # OutOfSpace, as for a shard
            recordforge.convert(
                _frame(), str(tmp_path / "out"), beam_args=[f"--temp_location={disk}"]
            )
        message = str(raised.value)
        assert message.startswith(
            "out of disk space while writing <pandas.DataFrame> staged as CSV at "
        )
        assert str(disk) in message
        assert list(disk.iterdir()) == []  # the staged table is gone
        assert not (tmp_path / "out").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


_QUIET_CALLS = """
import logging, sys
import recordforge
from recordforge import errors

photos, out = sys.argv[1], sys.argv[2]
recordforge.convert(photos, out + "/a")
recordforge.plan(photos)
recordforge.verify(out + "/a")
try:
    recordforge.convert(photos, out + "/b", max_error_rate=0.01)
except errors.ErrorRateExceeded:
    pass
print(len(logging.getLogger().handlers))
logging.basicConfig(level=logging.INFO, format="USER %(message)s")
logging.getLogger("app").info("configured")
"""


def test_calls_print_nothing_and_leave_logging_unconfigured(tmp_path):
    # Beam's options ran logging.basicConfig(): a handler stayed on the root logger (the
    # caller's own basicConfig then did nothing), and a refused run printed Beam's ERROR line
    # and a traceback although the call raised the refusal.
    photos = tmp_path / "photos"
    for index in range(3):
        make_image(photos / "cat" / f"{index}.png", "PNG", size=(8, 8), seed=index)
    (photos / "cat" / "broken.jpg").write_bytes(b"not a picture")
    done = subprocess.run(
        [sys.executable, "-c", _QUIET_CALLS, str(photos), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert done.stderr == "USER configured\n"


@pytest.mark.parametrize(
    ("call", "switch"),
    [
        (lambda out: recordforge.verify(out, deep="no"), "deep"),
        (lambda out: recordforge.verify(out, check="no"), "check"),
        (lambda out: recordforge.load(out, decode_images="no"), "decode_images"),
        (lambda out: recordforge.convert(out, out.parent / "c", progress="no"), "progress"),
        (lambda out: recordforge.plan(out, progress=1), "progress"),
        (lambda out: recordforge.load(out, image_channels=5), "image_channels is 0 .as stored"),
        (lambda out: recordforge.load(out, parallel_reads="4"), "parallel_reads is a whole"),
    ],
)
def test_switches_take_true_or_false_only(tmp_path, call, switch):
    # "no" is true to Python: verify(deep="no") decoded every image, progress="no" showed it.
    out = tmp_path / "out"
    recordforge.convert(_frame(50), out, label_column="label")
    refusal = switch if " " in switch else f"{switch} is True or False, got"
    with pytest.raises(errors.UsageError, match=refusal):
        call(out)
