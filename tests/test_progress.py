"""Progress: the pipeline's counters reach the launcher, which shows them as bars on a
terminal and as status lines elsewhere, with counts that match the manifest; --quiet and
`progress=False` show none.

The local runner (FnApiRunner, in-process and multi-process) and the Dask runner report them
while the job runs: status lines with figures between 0 and the total, and bars on a
pseudo-terminal. The local runs are slowed (each shard's file opens after a pause) so that
they last long enough to be seen running. Servers are started by the test that uses
them, on 127.0.0.1, and stopped by it (tests/test_runners.py's `servers`).
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import pty
import re
import select
import struct
import subprocess
import termios

import pytest
from conftest import RECORDFORGE, run_cli
from test_runners import (  # noqa: F401  (servers: a fixture)
    DASK,
    free_port,
    portable_services,
    server_env,
    servers,
)

import recordforge
from recordforge.pipelines.progress import INTERVAL_VARIABLE, StatusLines

DONE = re.compile(
    r"recordforge: done: listed ([\d,]+) inputs; probed ([\d,]+) of ([\d,]+) images; "
    r"wrote ([\d,]+) of ([\d,]+) records \(([^)]*)\)"
)


def _numbers(match: re.Match) -> list[int]:
    return [int(group.replace(",", "")) for group in match.groups()[:5]]


def _assert_counts_match_manifest(stderr: str, out: pathlib.Path) -> None:
    """The launcher's figures are the manifest's: every input listed and probed, every
    planned record written (or quarantined while writing)."""
    matches = list(DONE.finditer(stderr))
    assert len(matches) == 1, stderr
    listed, probed, probe_total, written, planned = _numbers(matches[0])
    manifest = json.loads((out / "dataset_info.json").read_text())
    by_stage = manifest["errors"]["by_stage"]
    assert listed == manifest["num_inputs"] - by_stage.get("discover", 0)
    assert probed == probe_total == listed
    assert written == planned == manifest["num_records"] + by_stage.get("write", 0)


def test_fn_api_runner_shows_the_final_counts(photo_folder, tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", photo_folder, "--output", out)
    assert result.returncode == 0, result.stderr
    _assert_counts_match_manifest(result.stderr, out)
    # The figures go to stderr; the summary on stdout as before.
    assert "done:" not in result.stdout and result.stdout.startswith("Converted ")


def test_csv_table_shows_rows_listed_and_written(tmp_path):
    table = tmp_path / "table.csv"
    table.write_text("x,label\n" + "".join(f"{i},{'ab'[i % 2]}\n" for i in range(500)) + "oops\n")
    out = tmp_path / "out"
    result = run_cli("convert", table, "--output", out, "--label-column", "label")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "dataset_info.json").read_text())
    records, bad_rows = manifest["num_records"], manifest["errors"]["count"]
    assert (records, bad_rows) == (500, 1)
    # Rows read into records are listed (the bad row is quarantined as it is read); no probing.
    done = f"recordforge: done: listed {records} inputs; wrote {records} of {records} records ("
    assert done in result.stderr, result.stderr


def test_quiet_shows_no_progress(photo_folder, tmp_path):
    result = run_cli("convert", photo_folder, "--output", tmp_path / "out", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "done:" not in result.stderr and "progress:" not in result.stderr


def test_plan_shows_listing_and_probing_only(photo_folder):
    result = run_cli("plan", photo_folder, "--json")
    assert result.returncode == 0, result.stderr
    inputs = json.loads(result.stdout)["num_inputs"]
    line = f"recordforge: done: listed {inputs} inputs; probed {inputs} of {inputs} images\n"
    assert result.stderr.endswith(line), result.stderr
    assert "wrote" not in result.stderr


def test_reshard_shows_writing(photo_folder, tmp_path):
    assert run_cli("convert", photo_folder, "--output", tmp_path / "converted").returncode == 0
    shards = sorted(str(path) for path in (tmp_path / "converted").glob("*.tfrecord-*-of-*"))
    result = run_cli("reshard", *shards, "--output", tmp_path / "resharded")
    assert result.returncode == 0, result.stderr
    records = json.loads((tmp_path / "resharded" / "dataset_info.json").read_text())["num_records"]
    assert f"recordforge: done: wrote {records} of {records} records (" in result.stderr
    assert records == 10


def test_library_progress_switch(photo_folder, tmp_path, capsys):
    recordforge.convert(photo_folder, tmp_path / "shown", progress=True)
    _assert_counts_match_manifest(capsys.readouterr().err, tmp_path / "shown")
    recordforge.convert(photo_folder, tmp_path / "off", progress=False)
    assert "done:" not in capsys.readouterr().err
    # By default a library call shows progress on a terminal or in a notebook only.
    recordforge.convert(photo_folder, tmp_path / "default")
    assert "done:" not in capsys.readouterr().err


def test_status_lines_give_rate_and_time_left_while_running(tmp_path):
    with open(tmp_path / "log", "w") as log:
        lines = StatusLines(log, ("listing", "probing", "writing"))
        counters = {"inputs_listed": 100, "images_probed": 100, "records_planned": 100}
        lines.update({**counters, "bytes_planned": 4096, "records_written": 10})
        lines.update({**counters, "bytes_planned": 4096, "records_written": 10})  # unchanged
        lines.update({**counters, "bytes_planned": 4096, "records_written": 60})
        lines.finish({**counters, "bytes_planned": 4096, "records_written": 100})
    written = (tmp_path / "log").read_text().splitlines()
    assert len(written) == 3, written  # an unchanged status is not repeated
    assert written[0].startswith("recordforge: progress: listed 100 inputs; probed 100 of 100")
    assert "wrote 60 of 100 records" in written[1] and " records/s; about " in written[1]
    assert written[2].startswith("recordforge: done: ") and "wrote 100 of 100" in written[2]


# -- an out-of-process runner that reports while the job runs ----------------------------------


def _start_dask(servers, tmp_path) -> str:  # noqa: F811  (the fixture's value)
    port = free_port()
    local = ("--dashboard-address", "127.0.0.1:0")
    scheduler = servers(
        "dask-scheduler", [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), *local]
    )
    scheduler.wait_for_port(port)
    # The workers pause before each shard file, as the slowed local runs do: the job lasts
    # longer than the launcher's first polls (a fused run of 240 small images can be done
    # before it has shown any bar).
    slowed = {k: v for k, v in _slowed_env(tmp_path).items() if k != INTERVAL_VARIABLE}
    for i in range(2):
        servers(
            f"dask-worker-{i}",
            [DASK, "worker", f"127.0.0.1:{port}", "--host", "127.0.0.1", "--nthreads", "1"]
            + [*local, "--local-directory", str(tmp_path / f"worker-{i}")],
            env=slowed,
        )
    from distributed import Client

    with Client(f"127.0.0.1:{port}", timeout=60) as client:
        client.wait_for_workers(2, timeout=90)
    return f"127.0.0.1:{port}"


def _run_on_pty(
    args: list[str], cwd: pathlib.Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run recordforge with stderr on a pseudo-terminal (100 x 24); (status, stdout, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(
        [RECORDFORGE, *args],
        cwd=cwd,
        env=env or server_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    terminal = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], 300)
        if not ready:
            process.kill()
            pytest.fail(f"no output for 300 s: {terminal.decode(errors='replace')}")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not data:
            break
        terminal += data
    os.close(master)
    stdout = process.stdout.read().decode()
    return process.wait(timeout=60), stdout, terminal.decode(errors="replace")


def test_dask_runner_progress_live_and_final(many_images, tmp_path, servers):  # noqa: F811
    address = _start_dask(servers, tmp_path)
    dask = ["--runner", "dask", "--dask_client_address", address]
    # Not a terminal: status lines, and the final figures match the manifest.
    piped = tmp_path / "piped"
    result = subprocess.run(
        [RECORDFORGE, "convert", many_images, "--output", piped, *dask],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    _assert_counts_match_manifest(result.stderr, piped)
    assert result.stdout.startswith("Converted 240 inputs into 240 records")
    # A terminal: a bar per phase, filled from the metrics polled while the job ran.
    status, stdout, terminal = _run_on_pty(
        ["convert", str(many_images), "--output", str(tmp_path / "bars"), *dask],
        tmp_path,
        {**server_env(), INTERVAL_VARIABLE: "0.05"},
    )
    assert status == 0, terminal
    assert stdout.startswith("Converted 240 inputs into 240 records"), stdout
    _assert_full_bars(terminal)


def _assert_full_bars(terminal: str) -> None:
    for phase, unit in (("listing", "inputs"), ("probing", "images"), ("writing", "records")):
        final = re.findall(rf"{phase} *: 100%\|[^|]*\| 240/240 \[[^\]]* {unit}/s", terminal)
        assert final, f"no full {phase} bar:\n{terminal}"
    assert re.search(r"writing *: 100%.*records/s, [\d.]+ [KM]iB/[\d.]+ [KM]iB\]", terminal)
    assert "recordforge: done:" not in terminal  # bars, not the line shown without a terminal


# -- the local runner, in-process and multi-process, reports while the job runs ----------------

# Loaded by every Python process of a slowed run (the launcher and worker processes alike, through
# PYTHONPATH): each shard's file opens after a pause.
_SLOW_SHARDS = """
import time

from recordforge.transforms import write

_create = write._create


def _create_after_a_pause(path):
    time.sleep(0.3)
    return _create(path)


write._create = _create_after_a_pause
"""

LOCAL_RUNS = {
    "in-process": [],
    "multi-process": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
}


def _slowed_env(tmp_path: pathlib.Path) -> dict[str, str]:
    site = tmp_path / "slow-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SLOW_SHARDS)
    # Updates 20 times a second: a status line (10 s apart by default) in a short run.
    return {**server_env(), "PYTHONPATH": str(site), INTERVAL_VARIABLE: "0.05"}


@pytest.mark.parametrize("mode", sorted(LOCAL_RUNS))
def test_local_runner_progress_live_and_final(mode, many_images, tmp_path):
    convert = ["convert", str(many_images), "--num-shards", "8", *LOCAL_RUNS[mode]]
    env = _slowed_env(tmp_path)
    # Not a terminal: status lines while the shards are written, then the manifest's figures.
    piped = tmp_path / "piped"
    result = subprocess.run(
        [RECORDFORGE, *convert, "--output", str(piped)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    _assert_counts_match_manifest(result.stderr, piped)
    assert result.stdout.startswith("Converted 240 inputs into 240 records")
    written = re.findall(r"recordforge: progress: .*; wrote (\d+) of 240 records", result.stderr)
    assert any(0 < int(count) < 240 for count in written), result.stderr
    # Nothing counted twice on the way: no figure ever above the final one.
    running = re.findall(r"recordforge: progress: .*", result.stderr)
    counts = re.findall(r"(?:listed|probed|wrote) ([\d,]+) ", "\n".join(running))
    assert max(int(count.replace(",", "")) for count in counts) == 240, running
    # A terminal: a bar per phase, drawn while the job ran (part-way) and full at the end.
    status, stdout, terminal = _run_on_pty([*convert, "--output", "bars"], tmp_path, env)
    assert status == 0, terminal
    assert stdout.startswith("Converted 240 inputs into 240 records"), stdout
    _assert_full_bars(terminal)
    part_way = re.findall(r"writing *: +\d+%\|[^|]*\| (\d+)/240 ", terminal)
    assert any(0 < int(count) < 240 for count in part_way), terminal
    # The launcher's log lines (in-process: each shard and the manifest written) start at the
    # left edge of a line the bars were cleared from, not inside a bar.
    logged = [m.start() for m in re.finditer("recordforge: wrote ", terminal)]
    assert logged or mode == "multi-process", terminal  # (there the workers log them)
    for start in logged:
        before = re.sub(r"(\x1b\[A)+$", "", terminal[:start])
        assert before.endswith(("\r", "\n")), terminal[start - 200 : start + 80]


def test_portable_job_service_progress_live_and_final(many_images, tmp_path, servers):  # noqa: F811
    """Beam's job service, started through recordforge.pipelines.loopback, reports a running
    job's figures; the SDK workers of the pool are slowed."""
    env = _slowed_env(tmp_path)
    job_port, pool_port, _ = portable_services(servers, env)
    out = tmp_path / "out"
    result = subprocess.run(
        [RECORDFORGE, "convert", many_images, "--num-shards", "8", "--output", out]
        + ["--runner", "portable", "--job_endpoint", f"127.0.0.1:{job_port}"]
        + ["--worker_pool", f"127.0.0.1:{pool_port}"],
        capture_output=True,
        text=True,
        env={**server_env(), INTERVAL_VARIABLE: "0.05"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    _assert_counts_match_manifest(result.stderr, out)
    written = re.findall(r"recordforge: progress: .*; wrote (\d+) of 240 records", result.stderr)
    assert any(0 < int(count) < 240 for count in written), result.stderr


def test_a_bad_progress_interval_is_a_usage_error(photo_folder, tmp_path):
    env = {**os.environ, INTERVAL_VARIABLE: "soon"}
    result = subprocess.run(
        [RECORDFORGE, "convert", photo_folder, "--output", tmp_path / "out"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"recordforge: error: {INTERVAL_VARIABLE}='soon': expected a number of seconds above 0\n"
    )
    assert not (tmp_path / "out").exists()


def _user_counter(step: str, value: int):
    from apache_beam.metrics.monitoring_infos import int64_user_counter

    return int64_user_counter("recordforge", "records_written", value, ptransform=step)


def _written(bundles) -> int:
    from apache_beam.metrics.monitoring_infos import extract_counter_value

    return sum(
        extract_counter_value(info) for infos in bundles.by_stage().values() for info in infos
    )


def test_running_bundles_count_each_bundle_once():
    """A running bundle's reports are replaced, not added; once it ended, late reports are
    ignored and its final figures count instead."""
    from recordforge.transforms.internals import _RunningBundles

    bundles = _RunningBundles()
    bundles.start("write")
    bundles.progress("bundle_1", [_user_counter("Write", 5)])
    bundles.progress("bundle_2", [_user_counter("Write", 1)])
    bundles.progress("bundle_1", [_user_counter("Write", 7)])  # cumulative: replaces 5
    assert _written(bundles) == 8
    bundles.ended("bundle_1")
    bundles.progress("bundle_1", [_user_counter("Write", 9)])  # after its end: ignored
    bundles.progress("bundle_2", [])  # nothing to report yet: ignored
    assert _written(bundles) == 8
    bundles.finished("write", [_user_counter("Write", 10)])  # both parts' final figures
    bundles.progress("bundle_2", [_user_counter("Write", 3)])  # late: ignored
    assert _written(bundles) == 10
    bundles.start("write")  # the stage's deferred inputs, in a bundle of their own
    bundles.progress("bundle_3", [_user_counter("Write", 2)])
    assert _written(bundles) == 12
    bundles.finished("write", [_user_counter("Write", 4)])
    assert _written(bundles) == 14
