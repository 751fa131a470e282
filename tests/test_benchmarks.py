"""The benchmark harness (benchmarks/) runs end to end on a minute dataset.

Only completeness and the JSON's structure are checked, never speed: the benchmark's figures and
targets are informational and take no part in the test suite's pass/fail.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
METHODS = {"tutorial", "beam", "recordforge", "recordforge-mp", "recordforge-default", "raw"}
RESIZING = {"recordforge-resize", "recordforge-mp-resize"}  # images only


@pytest.mark.timeout(600)
def test_harness_runs_every_method_and_checks_counts(tmp_path):
    out = tmp_path / "results.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--image-mb=1.2",
            "--csv-rows=300",
            "--plan-rows=300",
            "--repeats=1",
            f"--data-dir={tmp_path / 'data'}",
            f"--json={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "records/s" in result.stdout and "targets" in result.stdout

    data = json.loads(out.read_text())
    assert data["complete"] is True
    assert data["machine"]["cpu_count"] >= 1 and data["machine"]["versions"]["apache-beam"]
    assert set(data["cases"]) == {"images", "csv"}
    for name, case in data["cases"].items():
        assert case["expected_records"] > 0 and case["input_bytes"] > 0
        assert set(case["methods"]) == (METHODS | RESIZING if name == "images" else METHODS), name
        for key, method in case["methods"].items():
            assert method["summary"]["complete"], (name, key)
            (run,) = method["runs"]
            assert run["complete"] and run["exit_code"] == 0, (name, key, run)
            assert run["records"] == case["expected_records"], (name, key)
            assert run["wall_s"] > 0 and run["peak_rss_mb"] > 0
            for stat in ("records_per_s", "mb_per_s", "peak_rss_mb"):
                assert set(method["summary"][stat]) == {"min", "median", "max"}
            assert method["ratio_vs_tutorial"] is not None and method["ratio_vs_raw"] is not None
            assert method["ratio_vs_in_process"] is not None
        assert case["methods"]["tutorial"]["ratio_vs_tutorial"] == 1.0
        assert case["methods"]["raw"]["ratio_vs_raw"] == 1.0
        assert case["methods"]["recordforge"]["ratio_vs_in_process"] == 1.0
        # recordforge in-process is asked for by name; the default mode chooses for itself.
        in_process = case["methods"]["recordforge"]["command"]
        assert in_process[in_process.index("--workers") + 1] == "1"
        assert "--workers" not in case["methods"]["recordforge-default"]["command"]

    (plan,) = data["plan"]
    assert plan["inputs"] == 300 and plan["summary"]["complete"]
    assert plan["runs"][0]["num_inputs"] == 300
    names = [target["name"] for target in data["targets"]]
    assert "images: recordforge-mp vs in-process" in names
    assert "csv: recordforge-mp vs in-process" in names
    # The 3 GB target has no verdict on a minute set.
    (at_3gb,) = [t for t in data["targets"] if "at 3 GB" in t["name"]]
    assert at_3gb["pass"] is None and at_3gb["measured"] is None
    for mode in ("recordforge", "recordforge-mp", "recordforge-default"):
        assert f"images/s vs tutorial ({mode})" in names
        assert f"image MB/s vs raw limit ({mode})" in names
        assert f"CSV rows/s vs tutorial ({mode})" in names
    for target in data["targets"]:
        assert target["pass"] in (True, False, None)


def test_an_incomplete_output_is_caught(tmp_path):
    """The read-back that decides completeness rejects a truncated TFRecord file."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import measure
    finally:
        sys.path.remove(str(ROOT))
    from recordforge.transforms.core.tfrecord.framing import frame_record

    good = tmp_path / "good.tfrecord"
    good.write_bytes(b"".join(frame_record(b"x" * n) for n in (1, 10, 100)))
    assert measure.count_framed([str(good)]) == (3, 111)
    cut = tmp_path / "cut" / "cut.tfrecord"
    cut.parent.mkdir()
    cut.write_bytes(good.read_bytes()[:-3])
    counted = measure.count_output("script", str(cut.parent))
    assert counted["records"] is None and "truncated" in counted["error"]


@pytest.mark.timeout(600)
def test_the_dask_method_runs_on_a_cluster_the_harness_starts_and_stops(tmp_path):
    """`--methods ...,recordforge-dask`: a scheduler and one-thread workers on 127.0.0.1, started
    for the benchmark and stopped at its end; the cluster's CPU is counted in the run's."""
    out = tmp_path / "results.json"
    before = {p.pid for p in psutil.process_iter() if _is_dask_server(p)}
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--image-mb=0.5", "--only=images"]
        + ["--plan-rows=0", "--repeats=2", "--methods=recordforge,recordforge-dask"]
        + [f"--data-dir={tmp_path / 'data'}", f"--json={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    after = {p.pid for p in psutil.process_iter() if _is_dask_server(p)}
    assert after <= before, "the harness left dask servers running"
    data = json.loads(out.read_text())
    dask = data["cases"]["images"]["methods"]["recordforge-dask"]
    first, second = dask["runs"]
    assert first["complete"] and second["complete"]
    assert (first["first_on_cluster"], second["first_on_cluster"]) == (True, False)
    for run in (first, second):
        assert run["cluster_cpu_s"] > 0
        assert run["cpu_s"] == pytest.approx(run["launcher_cpu_s"] + run["cluster_cpu_s"], abs=0.01)
    assert dask["ratio_vs_in_process"] is not None
    assert "images: recordforge-dask vs in-process" in [t["name"] for t in data["targets"]]


def _is_dask_server(process) -> bool:
    try:
        command = process.cmdline()
    except psutil.Error:
        return False
    return any(part.endswith("/dask") for part in command[:2]) and sys.prefix in " ".join(command)
