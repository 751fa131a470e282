"""The commit protocol, step by step (docs/design.md, "Commit protocol"): stagings, the swap and
the journal cut short at every step and finished by recovery, the lock, readers' refusals.

A "kill" here is a test-only hook: the filesystem call the commit is about to make raises
`Killed` (a BaseException, so nothing in the commit catches it) at the Nth call, for every N the
commit makes; tests/test_faults.py kills real processes.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from apache_beam.io.filesystems import FileSystems

from recordforge.pipelines.dataset import open_dataset
from recordforge.pipelines.output import choose_staging
from recordforge.transforms import staging as staging_module
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files import swap
from recordforge.transforms.lock import LockHeld, LockHolder, acquire_lock, read_lock, release_lock
from recordforge.transforms.staging import (
    JOURNAL,
    SWAP,
    commit,
    interrupted_commit,
    journal_staging,
    recover,
    swap_staging,
)


class Killed(BaseException):
    """The process "died" here."""


def _manifest(name: str, shards: dict[str, bytes], errors: tuple[str, ...] = ()) -> bytes:
    """A minimal recordforge manifest listing `shards` (file -> bytes) in split train."""
    document = {
        "format_version": 1,
        "name": name,
        "tool": {"name": "recordforge", "version": "test"},
        "created": "2026-01-01T00:00:00+00:00",
        "num_inputs": len(shards),
        "num_records": len(shards),
        "compression": "none",
        "splits": {
            "train": {
                "num_records": len(shards),
                "num_bytes": sum(map(len, shards.values())),
                "num_shards": len(shards),
                "shards": [
                    {"file": file, "num_records": 1, "num_bytes": len(data)}
                    for file, data in sorted(shards.items())
                ],
            }
        },
        "features": {},
        "labels": None,
        "plan": {},
        "errors": {"count": 0, "files": list(errors), "by_stage": {}, "by_kind": {}},
        "source": {},
        "options": {},
    }
    return (json.dumps(document, indent=2) + "\n").encode()


OLD = {"old-train.tfrecord-00000-of-00002": b"old zero", "old-train.tfrecord-00001-of-00002": b"o1"}
NEW = {
    "new-train.tfrecord-00000-of-00003": b"new zero",
    "new-train.tfrecord-00001-of-00003": b"new one",
    "new-train.tfrecord-00002-of-00003": b"new two!",
}


def _write_old(folder: pathlib.Path) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {**OLD, "dataset_info.json": _manifest("old", OLD)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _stage_new(staging, tmp: pathlib.Path) -> tuple[list, list]:
    """Stage NEW's shards in the parts folder; (files, documents) for `commit`."""
    parts = pathlib.Path(staging.parts) if "://" not in staging.parts else None
    files = []
    for name, data in NEW.items():
        path = FileSystems.join(staging.parts, name + ".attempt")
        if parts is not None:
            parts.mkdir(parents=True, exist_ok=True)
        with FileSystems.create(path) as f:
            f.write(data)
        files.append((path, name))
    return files, [("dataset_info.json", _manifest("new", NEW))]


def _contents(folder: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.relative_to(folder).as_posix().startswith(".recordforge")
    }


NEW_FILES = {**NEW, "dataset_info.json": _manifest("new", NEW)}


def _readers_see(folder: pathlib.Path) -> str:
    """What a reader makes of the folder: 'old', 'new', 'refused' or 'none'."""
    try:
        dataset = open_dataset(str(folder))
    except UsageError as error:
        return "refused" if "being replaced" in str(error) else "none"
    return dataset.manifest.name


class CallCounter:
    """Counts calls to filesystem operations and raises Killed at call number `kill_at`."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.calls = 0

    def wrap(self, function):
        def counted(*args, **kwargs):
            self.calls += 1
            if self.calls == self.kill_at:
                raise Killed(f"killed at call {self.calls}: {function.__name__}")
            return function(*args, **kwargs)

        return counted


_SWAP_CALLS = [
    (os, "replace"),
    (os, "rename"),
    (os, "remove"),
    (os, "makedirs"),
    (staging_module, "_write_local"),
    (swap, "exchange"),
    (shutil, "rmtree"),
]
_JOURNAL_CALLS = [
    (FileSystems, "rename"),
    (FileSystems, "delete"),
    (FileSystems, "create"),
    (FileSystems, "mkdirs"),
]


def _commit_killed_at(kill_at, staging, files, documents, monkeypatch, calls) -> CallCounter:
    counter = CallCounter(kill_at)
    with monkeypatch.context() as patch:
        for owner, name in calls:
            patch.setattr(owner, name, counter.wrap(getattr(owner, name)))
        try:
            commit(
                staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True
            )
        except Killed:
            pass
    return counter


@pytest.mark.parametrize("before", ["missing", "empty", "old dataset"])
def test_swap_commit_puts_the_new_dataset_in_place(tmp_path, before):
    out = tmp_path / "out"
    if before == "empty":
        out.mkdir(mode=0o750)
    elif before == "old dataset":
        _write_old(out)
        out.chmod(0o750)
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    commit(staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True)
    assert _contents(out) == NEW_FILES
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no working folder left beside it
    if before != "missing":
        assert (out.stat().st_mode & 0o777) == 0o750  # the replaced folder's permissions


def test_a_swap_killed_at_every_step_shows_old_or_new_and_recovery_finishes_it(
    tmp_path, monkeypatch
):
    """At every filesystem call of a SWAP commit: readers see the old dataset or the new one,
    never a mix, and recovery (what the next run does first) finishes the commit."""
    # How many calls a whole commit makes.
    probe = tmp_path / "probe"
    _write_old(probe / "out")
    staging = swap_staging(str(probe / "out"))
    total = _commit_killed_at(
        None, staging, *_stage_new(staging, probe), monkeypatch, _SWAP_CALLS
    ).calls
    assert total >= 8
    seen = set()
    for kill_at in range(1, total + 1):
        root = tmp_path / f"k{kill_at}"
        old = _write_old(root / "out")
        staging = swap_staging(str(root / "out"))
        _commit_killed_at(kill_at, staging, *_stage_new(staging, root), monkeypatch, _SWAP_CALLS)
        seen_now = _readers_see(root / "out")
        seen.add(seen_now)
        assert seen_now in ("old", "new"), kill_at
        assert _contents(root / "out") == (old if seen_now == "old" else NEW_FILES), kill_at
        journaled = os.path.exists(staging.journal)
        recover(staging)
        if journaled or seen_now == "new":  # the commit had begun: it is finished
            assert _contents(root / "out") == NEW_FILES, kill_at
            assert sorted(os.listdir(root)) == ["out"], kill_at
        else:  # killed before its journal: nothing to finish, the staged work stays
            assert _contents(root / "out") == old, kill_at
    assert seen == {"old", "new"}  # the kills fell on both sides of the exchange


def test_a_journal_commit_killed_at_every_step_is_refused_then_rolled_forward(
    tmp_path, monkeypatch
):
    """JOURNAL (here on a local folder): before the journal, the old dataset; from it until
    the manifest, readers refuse; after it, the new one; recovery always ends at the new one."""
    probe = tmp_path / "probe"
    _write_old(probe / "out")
    staging = journal_staging(str(probe / "out"))
    total = _commit_killed_at(
        None, staging, *_stage_new(staging, probe), monkeypatch, _JOURNAL_CALLS
    ).calls
    assert total >= 6
    seen = set()
    for kill_at in range(1, total + 1):
        root = tmp_path / f"k{kill_at}"
        old = _write_old(root / "out")
        staging = journal_staging(str(root / "out"))
        _commit_killed_at(kill_at, staging, *_stage_new(staging, root), monkeypatch, _JOURNAL_CALLS)
        seen_now = _readers_see(root / "out")
        seen.add(seen_now)
        assert seen_now in ("old", "refused", "new"), kill_at
        if seen_now == "old":
            assert _contents(root / "out") == old, kill_at
        elif seen_now == "new":
            assert _contents(root / "out") == NEW_FILES, kill_at
        else:
            assert interrupted_commit(str(root / "out"))["run_id"] == "r1"
        journaled = os.path.exists(staging.journal)
        recover(staging)
        if journaled or seen_now == "new":
            assert _contents(root / "out") == NEW_FILES, kill_at
            assert sorted(os.listdir(root / "out")) == sorted(NEW_FILES), kill_at
        else:
            assert _contents(root / "out") == old, kill_at
    assert seen == {"old", "refused", "new"}


def test_the_swap_moves_back_a_file_that_appeared_during_the_run(tmp_path):
    out = tmp_path / "out"
    _write_old(out)
    (out / "errors").mkdir()
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    (out / "errors" / "notes.txt").write_text("mine")  # while the run was writing
    commit(staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True)
    assert _contents(out) == {**NEW_FILES, "errors/notes.txt": b"mine"}


def test_choose_staging_falls_back_to_the_journal_where_the_swap_cannot_serve(tmp_path):
    out = tmp_path / "out"
    assert choose_staging(str(out)).mode == SWAP
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    out.mkdir()
    linked = choose_staging(str(link))
    assert (linked.mode, linked.target) == (SWAP, str(out))  # the folder, not the link
    assert choose_staging("gs://bucket/out").mode == JOURNAL
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]).returncode:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        staged = choose_staging(str(mount))
        assert (staged.mode, staged.reason) == (JOURNAL, "the output folder is a mount point")
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_the_exchange_probe_of_a_killed_run_is_removed_by_the_next(tmp_path):
    # A run killed (SIGKILL) while it tested whether the folder can be exchanged left its probe
    # folder beside the output, and no later run removed it.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    probes = {
        "dead": f".out.recordforge-probe-{dead.pid}@{host}-k1ll3d_",
        "alive": f".out.recordforge-probe-{os.getpid()}@{host}-runn1ng",
        "elsewhere": f".out.recordforge-probe-{dead.pid}@not-{host}-x",
        "unnamed": ".out.recordforge-probe-abc123",  # made before probes named their process
        "other output": f".other.recordforge-probe-{dead.pid}@{host}-y",
    }
    for name in probes.values():
        (tmp_path / name / "a").mkdir(parents=True)
    assert choose_staging(str(tmp_path / "out")).mode == SWAP
    left = {path.name for path in tmp_path.iterdir()}
    assert left == {name for what, name in probes.items() if what != "dead"}


def test_readers_refuse_an_interrupted_journal_commit_with_one_line(tmp_path, cli):
    out = tmp_path / "out"
    _write_old(out)
    staging = journal_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    journal = {
        "format_version": 1,
        "run_id": "r9",
        "run_key": "k",
        "mode": JOURNAL,
        "manifest": "dataset_info.json",
        "digest": staging_module.digest(documents[-1][1]),
        "old_files": sorted(OLD) + ["dataset_info.json"],
        "files": [list(pair) for pair in files],
        "documents": [],
    }
    (out / ".recordforge-commit.json").write_text(json.dumps(journal))
    with pytest.raises(UsageError, match="the commit of run r9 into it was interrupted"):
        open_dataset(str(out))
    for command in ("verify", "inspect"):
        result = cli(command, out)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "run the conversion again" in result.stderr


# --- the lock ---------------------------------------------------------------------------------


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_local_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    lock = str(tmp_path / ".out.recordforge-lock")
    mine = LockHolder.this_process("run-a")
    assert acquire_lock(lock, mine) is None
    with pytest.raises(LockHeld, match=r"run run-a \(pid \d+ on .*started"):
        acquire_lock(lock, LockHolder.this_process("run-b"))
    release_lock(lock, "run-b")  # not its lock: nothing happens
    assert read_lock(lock).run_id == "run-a"
    release_lock(lock, "run-a")
    assert not os.path.exists(lock)

    dead = LockHolder("run-dead", socket.gethostname(), _dead_pid(), "2026-01-01T00:00:00+00:00")
    pathlib.Path(lock).write_bytes(dead.to_bytes())
    assert acquire_lock(lock, LockHolder.this_process("run-c")) == dead
    assert read_lock(lock).run_id == "run-c"
    os.remove(lock)

    # Never judged stale: another host's, or a run handed to a runner (its launcher exits).
    for holder in (
        LockHolder("run-far", "another-host", _dead_pid(), "2026-01-01T00:00:00+00:00"),
        LockHolder("run-sent", socket.gethostname(), _dead_pid(), "x", detached=True),
    ):
        pathlib.Path(lock).write_bytes(holder.to_bytes())
        with pytest.raises(LockHeld, match=holder.run_id):
            acquire_lock(lock, LockHolder.this_process("run-d"))
    # A lock being written (no holder readable yet) is a run that is starting.
    pathlib.Path(lock).write_bytes(b"")
    with pytest.raises(LockHeld, match="a run that is starting"):
        acquire_lock(lock, LockHolder.this_process("run-e"))


def test_of_many_runs_taking_over_one_stale_lock_exactly_one_wins(tmp_path):
    lock = str(tmp_path / ".out.recordforge-lock")
    for _ in range(20):
        dead = LockHolder("dead", socket.gethostname(), _dead_pid(), "x")
        pathlib.Path(lock).write_bytes(dead.to_bytes())
        winners, barrier = [], threading.Barrier(8)

        def contend(i, winners=winners, barrier=barrier):
            barrier.wait()
            try:
                acquire_lock(lock, LockHolder.this_process(f"run-{i}"))
                winners.append(i)
            except LockHeld:
                pass

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1, winners
        assert read_lock(lock).run_id == f"run-{winners[0]}"
        assert sorted(os.listdir(tmp_path)) == [".out.recordforge-lock"]  # nothing left aside
        os.remove(lock)


def test_a_lock_held_by_a_killed_process_not_yet_reaped_is_taken_over(tmp_path):
    # A run killed with its parent (`timeout -s KILL`) stays a zombie until something reaps
    # it; its pid still answers kill(0), so the next run was refused as "another conversion
    # is writing this output" for as long as the zombie lasted.
    lock = str(tmp_path / ".out.recordforge-lock")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while _state(ended.pid) != b"Z":  # exited, not yet waited for
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        zombie = LockHolder("run-killed", socket.gethostname(), ended.pid, "x")
        pathlib.Path(lock).write_bytes(zombie.to_bytes())
        assert acquire_lock(lock, LockHolder.this_process("run-next")) == zombie
        assert read_lock(lock).run_id == "run-next"
    finally:
        ended.wait()


def test_a_lock_that_could_not_be_written_is_not_left_behind(tmp_path, monkeypatch):
    # A full disk while writing the lock left it empty: the next run was refused for 30 s as
    # "another conversion is writing this output" though none ran (a tester's finding).
    lock = str(tmp_path / ".out.recordforge-lock")

    def full(fd):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", full)
        with pytest.raises(OSError):
            acquire_lock(lock, LockHolder.this_process("run-failed"))
    assert not os.path.exists(lock)
    assert acquire_lock(lock, LockHolder.this_process("run-next")) is None
    assert read_lock(lock).run_id == "run-next"


def _state(pid: int) -> bytes:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rindex(b")") + 2 :].split()[0]
