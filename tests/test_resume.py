"""`--resume` (issue 14, requirement 4): a killed run continued keeps what it staged, writes the
rest, and ends byte-identical to an uninterrupted run; changed options or inputs are refused,
saying what changed."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import pytest
from conftest import RECORDFORGE
from test_faults import ENV, _files, _staged_parts, _without_created

OPTIONS = ("--name", "tab", "--label-column", "kind", "--min-shard-mb", "0.2")
OPTIONS += ("--max-shard-mb", "0.4")


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> pathlib.Path:
    """A CSV table without images, several shards' worth, one bad row."""
    path = tmp_path_factory.mktemp("resume") / "rows.csv"
    lines = ["id,kind,score,note"]
    lines += [f"{i},{'abc'[i % 3]},{i / 7:.4f},{'n' * (i % 50)}" for i in range(60_000)]
    lines.insert(100, "bad,row")
    path.write_text("\n".join(lines) + "\n")
    return path


def _convert(source, out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RECORDFORGE, "convert", str(source), "-o", str(out), *OPTIONS, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )


@pytest.fixture(scope="module")
def uninterrupted(table, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("whole") / "out"
    result = _convert(table, out)
    assert result.returncode == 0, result.stderr
    files = _files(out)
    assert sum(name.endswith(tuple("0123456789")) for name in files) >= 4  # shards
    return files


def _killed_after(source, out, parts: int, *extra) -> int:
    """Start a conversion, SIGKILL it (its whole process group) once `parts` shards are staged;
    the number staged then."""
    process = subprocess.Popen(
        [RECORDFORGE, "convert", str(source), "-o", str(out), *OPTIONS, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if _staged_parts(out) >= parts:
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it was killed"
    return _staged_parts(out)


def test_a_killed_table_conversion_resumed_is_byte_identical(table, uninterrupted, tmp_path):
    out = tmp_path / "out"
    staged = _killed_after(table, out, 2)
    assert not out.exists()  # nothing committed
    resumed = _convert(table, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert resumed.stderr.count("staged by an earlier run") >= staged >= 2
    assert _without_created(_files(out)) == _without_created(uninterrupted)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_resume_refuses_changed_options_naming_each(table, tmp_path):
    out = tmp_path / "out"
    _killed_after(table, out, 1)
    result = _convert(table, out, "--resume", "--num-shards", "3", "--split-salt", "pepper")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("recordforge: error: --resume: the options changed since the ")
    assert "--num-shards: null → 3" in line and '--split-salt: "recordforge" → "pepper"' in line
    assert line.endswith("rerun without --resume to start over")
    assert _staged_parts(out) >= 1  # the staged work is still there, for a resume as it was
    assert not out.exists()
    # Options that shape no byte may change.
    result = _convert(table, out, "--resume", "--max-error-rate", "0.5")
    assert result.returncode == 0, result.stderr


def test_resume_refuses_inputs_changed_under_a_staged_shard(table, tmp_path):
    source = tmp_path / "rows.csv"
    source.write_bytes(table.read_bytes())
    out = tmp_path / "out"
    _killed_after(source, out, 1)
    # The same bytes, written again: a modified file, as far as anything can tell unread.
    source.write_bytes(source.read_bytes())
    os.utime(source, ns=(time.time_ns(), time.time_ns() + 10**9))
    result = _convert(source, out, "--resume")
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "recordforge: error: --resume: the inputs changed since the interrupted run: shard "
            "tab-train.tfrecord-"
        )
    ), result.stderr
    assert not out.exists()
    # Without --resume the staged work is discarded, and the run starts afresh.
    result = _convert(source, out)
    assert result.returncode == 0, result.stderr
    assert "discarded the staged work of an interrupted run" in result.stderr


def test_resume_with_nothing_to_resume_starts_afresh(table, uninterrupted, tmp_path):
    out = tmp_path / "out"
    result = _convert(table, out, "--resume")
    assert result.returncode == 0, result.stderr
    assert "no interrupted run to continue" in result.stderr
    assert _without_created(_files(out)) == _without_created(uninterrupted)
