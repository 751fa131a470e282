"""Splits, shard balance and determinism across runs and worker modes; loopback-only listeners."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import time

from conftest import RECORDFORGE, read_dataset, shard_files

MULTI_PROCESS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
# Small thresholds so 240 images (~3.6 MB) plan several shards per split.
SMALL_SHARDS = ("--min-shard-mb", "0.2", "--max-shard-mb", "0.4")
SPLITS = ("--splits", "train=0.8,validation=0.1,test=0.1")


def _shard_bytes(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in shard_files(out)}


def test_same_input_gives_byte_identical_shards_in_process_and_multi_process(
    many_images, tmp_path, cli
):
    runs = {
        "first": (),
        "second": (),
        "multi": MULTI_PROCESS,
        "workers": ("--workers", "3"),
    }
    outputs, summaries = {}, {}
    for label, extra in runs.items():
        out = tmp_path / label
        result = cli(
            "convert", many_images, "-o", out, "--name", "ds", *SPLITS, *SMALL_SHARDS, *extra
        )
        assert result.returncode == 0, result.stderr
        outputs[label] = _shard_bytes(out)
        summaries[label] = result.stdout.splitlines()[1]
    assert len(outputs["first"]) > 3
    assert outputs["first"] == outputs["second"] == outputs["multi"] == outputs["workers"]
    manifests = [json.loads((tmp_path / label / "dataset_info.json").read_text()) for label in runs]
    for manifest in manifests:
        manifest.pop("created")
    assert manifests[0] == manifests[1] == manifests[2] == manifests[3]
    # The summary says how fast, and how it ran.
    rate = r"  [\d,]+ images/s, [\d,.]+ MB/s written; ran "
    # Not told where to run, recordforge chose this process for so little input, and says so.
    chosen = r" \(chosen for [\d.]+ KiB of input; --workers N runs N worker processes\)"
    assert re.fullmatch(rate + "in this process" + chosen, summaries["first"]), summaries
    assert re.fullmatch(rate + "in 2 worker processes", summaries["multi"]), summaries
    assert re.fullmatch(rate + "in 3 worker processes", summaries["workers"]), summaries


def test_splits_shards_balance_and_counts(many_images, tmp_path, cli):
    out = tmp_path / "out"
    result = cli("convert", many_images, "-o", out, *SPLITS, *SMALL_SHARDS, "--num-hosts", "2")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert list(info["splits"]) == ["train", "validation", "test"]
    assert info["num_records"] == 240 == sum(len(r) for r in splits.values())
    # A salted hash, not chance: the proportions are near the request, and every record is in
    # exactly one split.
    assert 170 <= len(splits["train"]) <= 215
    names = [r["image/filename"] for records in splits.values() for r in records]
    assert len(names) == len(set(names)) == 240
    for name, split in info["splits"].items():
        shards = split["shards"]
        plan = info["plan"]["splits"][name]
        assert len(shards) == plan["num_shards"] == split["num_shards"]
        assert all(s["num_records"] > 0 for s in shards), "never an empty shard"
        sizes = [s["num_bytes"] for s in shards]
        mean = sum(sizes) / len(sizes)
        largest_record = plan["max_record_bytes"]
        assert max(sizes) <= 1.1 * mean or largest_record > 0.1 * mean, (name, sizes)
        assert max(sizes) <= mean + largest_record
        for index, shard in enumerate(shards):
            assert shard["file"].endswith(f"{index:05d}-of-{len(shards):05d}")
            assert (out / shard["file"]).stat().st_size == shard["num_bytes"]
        assert sum(s["num_records"] for s in shards) == split["num_records"] == len(splits[name])
    train = info["plan"]["splits"]["train"]
    assert train["num_shards"] % 2 == 0, "a multiple of the 2 reading hosts"


def test_records_within_a_shard_are_shuffled_not_grouped_by_class(many_images, tmp_path, cli):
    out = tmp_path / "out"
    assert cli("convert", many_images, "-o", out).returncode == 0
    _, splits = read_dataset(out)
    labels = [int(r["image/class/label"]) for r in splits["train"]]
    changes = sum(a != b for a, b in zip(labels, labels[1:], strict=False))
    assert changes > len(labels) / 2, "records follow a hash order, not the folder order"


def test_split_salt_changes_the_split(many_images, tmp_path, cli):
    members = []
    for salt in ("one", "two"):
        out = tmp_path / salt
        assert cli("convert", many_images, "-o", out, *SPLITS, "--split-salt", salt).returncode == 0
        _, splits = read_dataset(out)
        members.append(sorted(r["image/filename"] for r in splits["test"]))
    assert members[0] != members[1]


def _listening_sockets(pids: set[int]) -> list[str]:
    """Local addresses of TCP sockets in LISTEN state owned by the given processes."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1].split(":")[0])
    return found


def _process_tree(root: int) -> set[int]:
    pids, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        try:
            children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if child not in pids:
                pids.add(child)
                frontier.append(child)
    return pids


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def test_multi_process_run_listens_on_loopback_only(many_images, tmp_path):
    process = subprocess.Popen(
        [RECORDFORGE, "convert", many_images, "-o", tmp_path / "out", "-q", *MULTI_PROCESS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[str] = set()
    try:
        while process.poll() is None:
            seen.update(_listening_sockets(_process_tree(process.pid)))
            time.sleep(0.05)
    finally:
        stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert seen, "the multi-process runner should have opened gRPC listeners"
    assert seen <= LOOPBACK, f"listeners outside 127.0.0.1: {seen - LOOPBACK}"


def test_plan_prints_counts_and_reasons_and_writes_nothing(many_images, tmp_path, cli):
    before = sorted(p for p in tmp_path.rglob("*"))
    result = cli("plan", many_images, *SPLITS, *SMALL_SHARDS, "--num-hosts", "2")
    assert result.returncode == 0, result.stderr
    assert "240 inputs" in result.stdout
    assert "train:" in result.stdout and "because" in result.stdout
    assert sorted(p for p in tmp_path.rglob("*")) == before
    as_json = cli("plan", many_images, *SPLITS, *SMALL_SHARDS, "--num-hosts", "2", "--json")
    report = json.loads(as_json.stdout)
    out = tmp_path / "out"
    assert (
        cli(
            "convert", many_images, "-o", out, *SPLITS, *SMALL_SHARDS, "--num-hosts", "2"
        ).returncode
        == 0
    )
    info = json.loads((out / "dataset_info.json").read_text())
    assert report["splits"] == info["plan"]["splits"], "plan shows what convert then does"
    assert report["labels"] == ["class0", "class1", "class2", "class3"]
