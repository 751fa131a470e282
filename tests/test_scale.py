"""The scale simulation (benchmarks/scale.py) on a small size: structure and real invariants.

The simulation runs the pipeline's own placement steps (core/planning/placement.py); here its
result is compared with the definition of the assignment (assign_all over the whole split in
order-key order), so a simulation that drifted from the pipeline, or lost a record, fails.
Nothing here is timed.
"""

from __future__ import annotations

import collections
import json
import pathlib
import subprocess
import sys

import pytest

from recordforge.transforms.core.planning.sharding import MIB, ShardingConfig, assign_all
from recordforge.transforms.core.records import concat_batches

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is not installed with the package
try:
    import benchmarks.scale as scale
finally:
    sys.path.remove(str(ROOT))

# 30,000 records of ~100 KB in shards of at most 2 MiB: ~1,400 shards, so most of the buckets
# that hold records are cut by a shard boundary and go through the spill (pass 3).
CONFIG = scale.SimConfig(
    records=30_000,
    mean_record_bytes=100_000,
    sharding=ShardingConfig(min_shard_bytes=MIB, max_shard_bytes=2 * MIB),
)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    spill = tmp_path_factory.mktemp("spill")
    report, layouts, assignment = scale.simulate(CONFIG, str(spill), keep_assignment=True)
    assert not list(spill.iterdir()), "the spill folder is removed"
    return report, layouts, assignment


def _orders_and_sizes():
    for batch in scale.generate_batches(CONFIG):
        orders, sizes = batch.column("order").to_pylist(), batch.column("size").to_pylist()
        yield from zip(orders, sizes, strict=True)


def test_every_record_is_placed_once_in_the_shard_the_definition_gives(simulated):
    report, layouts, assignment = simulated
    records = sorted(_orders_and_sizes())
    assert len(records) == CONFIG.records
    assert len(assignment) == CONFIG.records
    assert set(assignment) == {order for order, _ in records}
    expected = assign_all([size for _, size in records], layouts["train"].plan.num_shards)
    assert [assignment[order] for order, _ in records] == expected
    assert all(report["checks"].values()), report["checks"]


def test_shards_are_balanced_within_the_planners_bound(simulated):
    report, layouts, assignment = simulated
    plan = layouts["train"].plan
    sizes = dict(_orders_and_sizes())
    per_shard = collections.Counter()
    for order, shard in assignment.items():
        per_shard[shard] += sizes[order]
    assert sorted(per_shard) == list(range(plan.num_shards))
    mean = plan.stats.total_bytes / plan.num_shards
    assert all(abs(total - mean) <= plan.stats.max_record_bytes for total in per_shard.values())
    balance = report["splits"]["train"]
    assert balance["planned_shards"] == balance["non_empty_shards"] == plan.num_shards
    assert balance["shard_bytes"]["min"] == min(per_shard.values())
    assert balance["shard_bytes"]["max"] == max(per_shard.values())
    assert balance["relative_spread"] == pytest.approx(
        (max(per_shard.values()) - min(per_shard.values())) / mean, abs=1e-6
    )


def test_cut_buckets_go_through_the_spill_and_memory_is_reported(simulated):
    report, layouts, _ = simulated
    cut = report["cut"]
    assert 0 < cut["buckets"] <= layouts["train"].plan.num_shards - 1
    assert 0 < cut["fine_buckets"] <= layouts["train"].plan.num_shards - 1
    # Only the fine buckets a boundary cuts go through the group, not whole cut buckets (here
    # ~1.5 records a bucket, so few are spared; tests/test_sharding.py has buckets of 160).
    assert 0 < cut["records"] < cut["records_in_cut_buckets"]
    assert cut["record_share"] == round(cut["records"] / CONFIG.records, 4)
    held = report["held"]
    assert 0 < held["largest_cut_bucket_records"] <= held["largest_cut_range_records"]
    # The spill buffers at most SPILL_FLUSH records per file before writing them out.
    spill_files = 1 << scale.SPILL_RANGE_BITS
    assert held["max_spill_buffered_records"] <= spill_files * scale.SPILL_FLUSH
    assert report["peak_rss_mb"] > 0
    assert set(report["seconds"]) >= {"plan (pass 1)", "total"}


def test_a_lost_record_fails_the_checks(monkeypatch):
    real = scale.place_cut_bucket

    def lose_one(split, bucket, batches, layouts):
        pieces = list(real(split, bucket, batches, layouts))
        key, records = pieces[0]
        pieces[0] = (key, concat_batches([records]).slice(1))
        return pieces

    monkeypatch.setattr(scale, "place_cut_bucket", lose_one)
    report, _, _ = scale.simulate(CONFIG)
    assert report["checks"]["every_record_placed_exactly_once"] is False


def test_the_command_reports_balance_elements_and_limits(tmp_path):
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--records=5000", f"--json={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "check every_record_placed_exactly_once: ok" in result.stdout
    report = json.loads(out.read_text())
    elements = report["elements"]
    per_record = elements["shuffle_bytes_per_record"]
    assert set(per_record) >= {
        "spread candidates (Reshuffle)",
        "pieces by shard (batches → shards)",
    }
    # References, not image bytes, cross the shuffles: a few hundred bytes per ~100 KB image.
    assert all(50 < v < 5_000 for v in per_record.values()), per_record
    assert 0 < elements["shuffle_bytes_per_input_byte"] < 0.05
    largest = elements["largest_elements"]
    assert largest["bytes"]["layouts side input (to every worker)"] > 0
    assert max(largest["bytes"].values()) < largest["limits"]["shuffle record (TFDS issue 10995)"]
