"""The commit protocol's and the lock's fault-handling branches (transforms/staging.py,
transforms/lock.py), on local folders.

Written for mutation testing (docs/testing.md, issue 18 item 3): tests/test_commit.py kills
commits at every step; these add what its scenarios did not reach: where stagings put their
files, a staged folder left by an earlier attempt, files that appear in the output during a
run (at its top, among old files, under names the new dataset has), metadata the old and new
datasets share, what `recover` returns, refusals in words, and the lock's own corners (an
unreadable lock past its grace, a holder of another user, the lock file's mode, its message).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import uuid

import google_crc32c
import pytest
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem
from gcs_traffic import proxied_emulator
from test_commit import NEW, NEW_FILES, OLD, _contents, _manifest, _stage_new, _write_old

from recordforge.transforms import lock as lock_module
from recordforge.transforms import staging as staging_module
from recordforge.transforms.core.files import swap
from recordforge.transforms.lock import LockHeld, LockHolder, acquire_lock, read_lock, release_lock
from recordforge.transforms.staging import (
    CommitError,
    commit,
    committed_files,
    default_staging,
    journal_staging,
    recover,
    swap_staging,
)


class Killed(BaseException):
    """The process "died" here."""


# --- where a run works ------------------------------------------------------------------------


def test_a_swap_staging_works_and_locks_beside_the_output(tmp_path):
    staging = swap_staging(str(tmp_path / "out"))
    assert staging.target == str(tmp_path / "out")
    assert staging.work == str(tmp_path / ".out.recordforge")
    assert staging.lock == str(tmp_path / ".out.recordforge-lock")
    assert staging.journal == str(tmp_path / ".out.recordforge" / "commit.json")


@pytest.mark.parametrize("output", ["/data/out", "gs://bucket/out"])
def test_a_journal_staging_works_and_locks_inside_the_output(output):
    staging = journal_staging(output, reason="a mount point")
    assert (staging.output, staging.target, staging.reason) == (output, output, "a mount point")
    assert staging.work == f"{output}/.recordforge-staging"
    assert staging.lock == f"{output}/.recordforge-lock"
    assert staging.journal == f"{output}/.recordforge-commit.json"
    assert staging.dataset == f"{output}/.recordforge-staging/dataset"
    assert default_staging(output) == journal_staging(output)


# --- what a dataset's manifest lists ------------------------------------------------------------


def test_committed_files_are_the_manifests_shards_indexes_and_errors(tmp_path):
    manifest = json.loads(_manifest("old", OLD, errors=("errors/write.jsonl",)))
    manifest["splits"]["train"]["shards"][0]["index"] = "index/old-train.idx"
    (tmp_path / "dataset_info.json").write_text(json.dumps(manifest))
    assert committed_files(str(tmp_path)) == (
        "dataset_info.json",
        sorted([*OLD, "dataset_info.json", "errors/write.jsonl", "index/old-train.idx"]),
    )
    # With --tfds, recordforge's manifest is recordforge.json, and TFDS's files are beside it.
    os.rename(tmp_path / "dataset_info.json", tmp_path / "recordforge.json")
    assert committed_files(str(tmp_path)) == (
        "recordforge.json",
        sorted(
            [
                *OLD,
                "recordforge.json",
                "errors/write.jsonl",
                "index/old-train.idx",
                "dataset_info.json",  # TFDS's DatasetInfo
                "features.json",
                "image.class.label.labels.txt",  # TFDS's class names, of either label key
                "label.labels.txt",
            ]
        ),
    )
    assert committed_files(str(tmp_path / "nothing")) == (None, [])


# --- the swap -----------------------------------------------------------------------------------


def test_a_commit_finds_the_staged_folder_of_an_earlier_attempt(tmp_path):
    out = tmp_path / "out"
    _write_old(out)
    staging = swap_staging(str(out))
    os.makedirs(staging.dataset)  # an attempt that died before it used the folder
    files, documents = _stage_new(staging, tmp_path)
    commit(staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True)
    assert _contents(out) == NEW_FILES


def test_a_swap_killed_before_the_exchange_is_finished_by_recover(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(out)
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)

    def killed(first, second):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(swap, "exchange", killed)
        with pytest.raises(Killed):
            commit(
                staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True
            )
    monkeypatch.chdir(tmp_path)  # a path taken relative to the working directory finds nothing
    finished = recover(swap_staging(str(out)))
    assert (finished["run_id"], finished["run_key"]) == ("r1", "k1")
    assert _contents(out) == NEW_FILES
    assert recover(swap_staging(str(out))) is None  # nothing left to finish


def test_a_swap_journal_whose_manifest_is_nowhere_is_refused_in_words(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(out)
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(swap, "exchange", lambda first, second: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            commit(
                staging, run_id="r7", run_key="k1", files=files, documents=documents, replace=True
            )
    os.remove(os.path.join(staging.dataset, "dataset_info.json"))
    with pytest.raises(CommitError) as raised:
        recover(swap_staging(str(out)))
    assert str(raised.value) == (
        f"the interrupted commit of run r7 cannot be finished: neither {out} nor "
        f"{staging.dataset} holds its manifest; look at both, keep what you need and delete "
        f"{staging.work}"
    )


def test_files_that_appeared_during_the_run_are_moved_back_wherever_they_are(tmp_path, caplog):
    out = tmp_path / "out"
    _write_old(out)
    for i in range(12):  # more old files in the top folder, among the ones that appear
        (out / f"old-train.tfrecord-{i:05d}-of-00012").write_bytes(b"o")
    listed = {**OLD, **{f"old-train.tfrecord-{i:05d}-of-00012": b"o" for i in range(12)}}
    (out / "dataset_info.json").write_bytes(_manifest("old", listed))
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    files.append((_staged_errors(staging), "errors/write.jsonl"))
    appeared = {f"notes-{i}.txt": f"mine {i}".encode() for i in range(12)}
    appeared["errors/notes.txt"] = b"also mine"  # into a folder the new dataset has too
    for name, data in appeared.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(data)
    with caplog.at_level(logging.WARNING):
        commit(staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True)
    assert _contents(out) == {**NEW_FILES, "errors/write.jsonl": b"{}\n", **appeared}
    moved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("moved")]
    assert sorted(moved) == sorted(
        f"moved {name} back into {out}: it appeared during the run" for name in appeared
    )


def _staged_errors(staging) -> str:
    path = os.path.join(staging.parts, "errors.attempt")
    pathlib.Path(path).write_bytes(b"{}\n")
    return path


def test_a_file_that_appeared_under_a_new_datasets_name_is_reported(tmp_path, caplog):
    out = tmp_path / "out"
    _write_old(out)
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    name = sorted(NEW)[0]
    (out / name).write_bytes(b"a user's bytes")
    notes = {f"notes-{i}.txt": f"mine {i}".encode() for i in range(12)}  # listed around it
    for note, data in notes.items():
        (out / note).write_bytes(data)
    with caplog.at_level(logging.WARNING):
        commit(staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True)
    assert (out / name).read_bytes() == NEW[name]
    assert {note: (out / note).read_bytes() for note in notes} == notes
    messages = [r.getMessage() for r in caplog.records]
    old_copy = os.path.join(staging.dataset, name)
    assert f"left {old_copy}: not recordforge's, and {out / name} exists" in messages


def test_moving_a_staged_file_again_is_done_only_when_it_arrived(tmp_path):
    final = tmp_path / "final"
    final.write_bytes(b"moved before")
    staging_module._move_into(str(tmp_path / "gone"), str(final))  # done already
    with pytest.raises(FileNotFoundError):
        staging_module._move_into(str(tmp_path / "gone"), str(tmp_path / "never"))


# --- the journal --------------------------------------------------------------------------------


def _journal_commit_killed_at(kill_at, staging, files, documents, monkeypatch) -> int:
    calls = 0

    def counted(function):
        def call(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == kill_at:
                raise Killed
            return function(*args, **kwargs)

        return call

    with monkeypatch.context() as patch:
        for name in ("rename", "delete", "create", "mkdirs"):
            patch.setattr(FileSystems, name, counted(getattr(FileSystems, name)))
        try:
            commit(
                staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True
            )
        except Killed:
            pass
    return calls


def _tfds_dataset(out: pathlib.Path, shards: dict[str, bytes], tag: str) -> dict[str, bytes]:
    """A dataset written with --tfds: recordforge.json, TFDS's dataset_info.json and
    features.json beside it. Returns its files."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        **shards,
        "dataset_info.json": f'{{"tfds": "{tag}"}}\n'.encode(),
        "features.json": f'{{"features": "{tag}"}}\n'.encode(),
        "recordforge.json": _manifest(tag, shards),
    }
    for name, data in files.items():
        (out / name).write_bytes(data)
    return files


def test_a_tfds_journal_commit_sharing_names_with_the_old_dataset_killed_at_every_step(
    tmp_path, monkeypatch
):
    """Old and new datasets written with --tfds share their three metadata names and a shard's
    name. Killed at every step and rolled forward, the commit ends as the new dataset; and from
    the moment shards change until its manifest, no old metadata file is there for TFDS to
    read."""
    shared = sorted(NEW)[0]
    old_shards = {shared: b"old bytes", "old-train.tfrecord-00001-of-00002": b"o1"}
    new_files = {
        **NEW,
        "dataset_info.json": b'{"tfds": "new"}\n',
        "features.json": b'{"features": "new"}\n',
        "recordforge.json": _manifest("new", NEW),
    }
    for kill_at in range(1, 80):
        out = tmp_path / f"out{kill_at}"
        old_files = _tfds_dataset(out, old_shards, "old")
        staging = journal_staging(str(out))
        files, _ = _stage_new(staging, tmp_path)
        documents = [
            ("features.json", new_files["features.json"]),
            ("dataset_info.json", new_files["dataset_info.json"]),
            ("recordforge.json", new_files["recordforge.json"]),
        ]
        calls = _journal_commit_killed_at(kill_at, staging, files, documents, monkeypatch)
        now = _contents(out)
        shards_changed = any(now.get(name) == data for name, data in NEW.items())
        if shards_changed and now.get("recordforge.json") != new_files["recordforge.json"]:
            # Shards are changing: the old metadata went first (step 3 of the commit).
            for name in ("dataset_info.json", "features.json", "recordforge.json"):
                assert now.get(name) in (None, new_files[name]), (kill_at, name)
        journaled = os.path.exists(staging.journal)
        recover(journal_staging(str(out)))
        assert _contents(out) in (old_files, new_files), f"killed at call {kill_at}"
        if journaled:  # rolled forward
            assert _contents(out) == new_files, f"killed at call {kill_at}"
        if calls < kill_at:
            assert _contents(out) == new_files
            break
    else:
        pytest.fail("the commit made more calls than tried")


def test_a_journal_commit_stages_its_documents_in_its_working_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    staging = journal_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    documents = [("features.json", b"{}\n"), *documents]

    def killed(paths):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(staging_module, "roll_forward", lambda staging, journal: None)
        commit(staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True)
    assert sorted(os.listdir(staging.dataset)) == ["dataset_info.json", "features.json"]
    assert (pathlib.Path(staging.dataset) / "features.json").read_bytes() == b"{}\n"
    assert os.listdir(elsewhere) == []
    journal = json.loads(pathlib.Path(staging.journal).read_text())
    assert (journal["run_id"], journal["run_key"]) == ("r1", "k1")
    assert recover(journal_staging(str(out)))["run_key"] == "k1"
    assert _contents(out) == {**NEW_FILES, "features.json": b"{}\n"}


def test_a_deletion_that_fails_is_raised_unless_the_file_is_gone(tmp_path, monkeypatch):
    there, gone = tmp_path / "there", tmp_path / "gone"
    there.write_bytes(b"x")

    def failing(paths):
        raise BeamIOError("delete failed", {path: OSError("no") for path in paths})

    monkeypatch.setattr(FileSystems, "delete", failing)
    with pytest.raises(BeamIOError):
        staging_module._delete_if_there([str(there)])
    staging_module._delete_if_there([str(gone)])  # failed, but nothing is left: fine


def test_a_journal_that_does_not_parse_is_refused_in_words(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".recordforge-commit.json").write_text("{not json")
    with pytest.raises(CommitError) as raised:
        recover(journal_staging(str(out)))
    assert str(raised.value) == (
        f"{out}/.recordforge-commit.json is not a recordforge commit journal; move it away"
    )


def test_recover_without_a_journal_finishes_nothing(tmp_path):
    assert recover(swap_staging(str(tmp_path / "out"))) is None


# --- the journal as written: a later run (or version) finishes it from these fields ----------


def _killed(*args):
    raise Killed


def test_a_swap_journal_on_disk(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(out)
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(swap, "exchange", _killed)
        with pytest.raises(Killed):
            commit(
                staging, run_id="r1", run_key="k1", files=files, documents=documents, replace=True
            )
    manifest = documents[-1][1]
    assert json.loads(pathlib.Path(staging.journal).read_bytes()) == {
        "format_version": 1,
        "run_id": "r1",
        "run_key": "k1",
        "mode": "swap",
        "manifest": "dataset_info.json",
        "digest": {"bytes": len(manifest), "crc32c": google_crc32c.value(manifest)},
        "old_files": sorted([*OLD, "dataset_info.json"]),
        "target": os.path.realpath(out),
    }


def test_a_journal_commits_journal_on_disk(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(out)
    staging = journal_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(staging_module, "roll_forward", _killed)
        with pytest.raises(Killed):
            commit(
                staging, run_id="r2", run_key="k2", files=files, documents=documents, replace=True
            )
    manifest = documents[-1][1]
    assert json.loads((out / ".recordforge-commit.json").read_bytes()) == {
        "format_version": 1,
        "run_id": "r2",
        "run_key": "k2",
        "mode": "journal",
        "manifest": "dataset_info.json",
        "digest": {"bytes": len(manifest), "crc32c": google_crc32c.value(manifest)},
        "old_files": sorted([*OLD, "dataset_info.json"]),
        "files": [[source, name] for source, name in files],
        "documents": [[f"{staging.dataset}/dataset_info.json", "dataset_info.json"]],
    }


def test_a_journal_whose_manifest_is_in_place_is_only_cleanup(tmp_path, monkeypatch):
    """Once the manifest is in place the new dataset is complete: finishing the journal deletes
    it and the working folder, and touches nothing in the output (docs/design.md)."""
    out = tmp_path / "out"
    _write_old(out)
    staging = journal_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    delete_if_there = staging_module._delete_if_there

    def killed_at_the_journal(paths):
        paths = list(paths)
        if paths == [staging.journal]:
            raise Killed
        delete_if_there(paths)

    with monkeypatch.context() as patch:
        patch.setattr(staging_module, "_delete_if_there", killed_at_the_journal)
        with pytest.raises(Killed):
            commit(
                staging, run_id="r3", run_key="k3", files=files, documents=documents, replace=True
            )
    assert _contents(out) == NEW_FILES and os.path.exists(staging.journal)
    assert staging_module.interrupted_commit(str(out)) is None  # readers read
    # A file put in the output since, under a name the old dataset had: not the commit's to delete.
    old_name = sorted(OLD)[0]
    (out / old_name).write_bytes(b"someone's")
    monkeypatch.chdir(tmp_path)  # a manifest path taken relative to it finds nothing
    assert recover(journal_staging(str(out)))["run_id"] == "r3"
    assert _contents(out) == {**NEW_FILES, old_name: b"someone's"}
    assert not os.path.exists(staging.journal) and not os.path.exists(staging.work)


def test_a_working_folder_that_cannot_be_removed_does_not_fail_a_done_swap(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(out)
    staging = swap_staging(str(out))
    files, documents = _stage_new(staging, tmp_path)
    stuck = pathlib.Path(staging.spill) / "stuck"
    stuck.parent.mkdir(parents=True)
    stuck.write_bytes(b"x")
    unlink = os.unlink

    def refused(path, *args, **kwargs):
        if os.path.basename(path) == "stuck":
            raise PermissionError(13, "Permission denied", path)
        return unlink(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "unlink", refused)
        commit(staging, run_id="r4", run_key="k4", files=files, documents=documents, replace=True)
    assert _contents(out) == NEW_FILES  # committed; the leftover stays where it was
    assert stuck.read_bytes() == b"x"
    assert not os.path.exists(staging.journal)


# --- the lock ---------------------------------------------------------------------------------


def test_a_lock_holder_as_written_and_described():
    holder = LockHolder.this_process("run-a")
    assert (holder.run_id, holder.host, holder.pid) == ("run-a", socket.gethostname(), os.getpid())
    assert holder.detached is False
    assert holder.started.endswith("+00:00") and "T" in holder.started
    data = holder.to_bytes()
    assert data.endswith(b"}\n") and list(json.loads(data)) == sorted(json.loads(data))
    assert LockHolder.from_bytes(data) == holder
    assert holder.describe() == (
        f"run run-a (pid {os.getpid()} on {socket.gethostname()}, started {holder.started})"
    )
    sent = LockHolder("run-b", "h", 7, "2026-01-01T00:00:00+00:00", detached=True)
    assert sent.describe() == "run run-b (pid 7 on h, started 2026-01-01T00:00:00+00:00, " + (
        "handed to a runner)"
    )
    assert LockHolder.this_process("run-c", detached=True).detached is True


def test_a_lock_held_names_its_holder_and_file(tmp_path):
    lock = str(tmp_path / ".out.recordforge-lock")
    mine = LockHolder.this_process("run-a")
    acquire_lock(lock, mine)
    with pytest.raises(LockHeld) as raised:
        acquire_lock(lock, LockHolder.this_process("run-b"))
    assert raised.value.holder == mine
    assert str(raised.value) == (
        f"another conversion is writing this output: {mine.describe()} holds {lock}; wait "
        "for it, or, if it is no longer running, delete that file"
    )
    assert oct(os.stat(lock).st_mode & 0o777) == oct(0o644 & ~_umask())
    pathlib.Path(lock).write_bytes(b"")  # being written: a run that is starting
    with pytest.raises(LockHeld) as raised:
        acquire_lock(lock, LockHolder.this_process("run-b"))
    assert raised.value.holder is None
    assert str(raised.value) == (
        f"another conversion is writing this output: a run that is starting holds {lock}; "
        "wait for it, or, if it is no longer running, delete that file"
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_unreadable_lock_past_its_grace_is_taken_over(tmp_path, monkeypatch):
    lock = tmp_path / ".out.recordforge-lock"
    lock.write_bytes(b"\xff not a holder")
    written = os.stat(lock).st_mtime
    # Exactly 30 seconds old: still within its grace (a run that is starting).
    monkeypatch.setattr(lock_module.time, "time", lambda: written + 29.999)
    with pytest.raises(LockHeld, match="a run that is starting"):
        acquire_lock(str(lock), LockHolder.this_process("run-a"))
    monkeypatch.setattr(lock_module.time, "time", lambda: written + 30)
    assert acquire_lock(str(lock), LockHolder.this_process("run-a")) is None
    assert read_lock(str(lock)).run_id == "run-a"


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_holder_of_another_user_is_alive(monkeypatch):
    def not_permitted(pid, signal):
        raise PermissionError

    monkeypatch.setattr(lock_module.os, "kill", not_permitted)
    assert not LockHolder("r", socket.gethostname(), 12345, "x").is_stale()


def test_judging_a_live_holder_sends_it_no_signal():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not LockHolder("r", socket.gethostname(), process.pid, "x").is_stale()
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=1)  # still running: not hung up on, not killed
    finally:
        process.kill()
        process.wait()


def test_a_lock_released_meanwhile_is_taken(tmp_path, monkeypatch):
    """The lock existed when creating it failed and was gone when read: try again, take it."""
    lock = str(tmp_path / ".out.recordforge-lock")
    pathlib.Path(lock).write_bytes(LockHolder.this_process("run-gone").to_bytes())
    read = lock_module._FileLock.read

    def read_after_release(self):
        os.remove(lock)
        monkeypatch.setattr(lock_module._FileLock, "read", read)
        return read(self)

    monkeypatch.setattr(lock_module._FileLock, "read", read_after_release)
    assert acquire_lock(lock, LockHolder.this_process("run-a")) is None
    assert read_lock(lock).run_id == "run-a"


def test_a_lock_that_cannot_be_taken_over_in_five_attempts_is_held(tmp_path, monkeypatch):
    lock = str(tmp_path / ".out.recordforge-lock")
    dead = LockHolder("run-dead", socket.gethostname(), 2**22 + 12345, "x")
    pathlib.Path(lock).write_bytes(dead.to_bytes())
    monkeypatch.setattr(lock_module._FileLock, "remove", lambda self, seen: False)
    with pytest.raises(LockHeld) as raised:
        acquire_lock(lock, LockHolder.this_process("run-a"))
    assert raised.value.holder is None and lock in str(raised.value)


def test_reading_and_releasing_a_lock_that_is_not_there_or_unreadable(tmp_path):
    lock = tmp_path / ".out.recordforge-lock"
    assert read_lock(str(lock)) is None
    release_lock(str(lock), "run-a")
    lock.write_bytes(b"not a holder")
    assert read_lock(str(lock)) is None
    release_lock(str(lock), "run-a")  # nobody's: left alone
    assert lock.read_bytes() == b"not a holder"


def test_a_lock_file_is_removed_only_while_it_holds_what_was_read(tmp_path, monkeypatch):
    lock = tmp_path / ".out.recordforge-lock"
    store = lock_module._FileLock(str(lock))
    assert store.remove(b"anything") is False  # not there
    lock.write_bytes(b"new holder")
    assert store.remove(b"old holder") is False and lock.exists()
    assert store.remove(b"new holder") is True and not lock.exists()
    # A lock named without a folder: its folder is the working directory.
    monkeypatch.chdir(tmp_path)
    bare = lock_module._FileLock(".bare-lock")
    (tmp_path / ".bare-lock").write_bytes(b"x")
    assert bare.remove(b"x") is True and not (tmp_path / ".bare-lock").exists()


def test_a_lock_that_is_a_folder_is_an_error_not_a_free_lock(tmp_path):
    lock = tmp_path / ".out.recordforge-lock"
    lock.mkdir()
    with pytest.raises(OSError):
        read_lock(str(lock))


# --- the lock on Cloud Storage (the emulator, behind a proxy enforcing preconditions) ----------


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """(emulator, bucket): this process talks to the proxy."""
    with proxied_emulator(tmp_path_factory.mktemp("gcs-lock"), preconditions=True) as (
        emulator,
        _,
        _,
    ):
        bucket = f"rf-{uuid.uuid4().hex[:12]}"
        emulator.client().create_bucket(bucket)
        yield emulator, bucket


def test_a_gs_lock_is_taken_refused_released_and_taken_over(gcs):
    emulator, bucket = gcs
    lock = f"gs://{bucket}/out-{uuid.uuid4().hex[:6]}/.recordforge-lock"
    blob = emulator.client().bucket(bucket).blob(lock.split("/", 3)[3])
    assert read_lock(lock) is None
    mine = LockHolder.this_process("run-a", detached=True)
    assert acquire_lock(lock, mine) is None
    assert blob.download_as_bytes() == mine.to_bytes()
    with pytest.raises(LockHeld) as raised:
        acquire_lock(lock, LockHolder.this_process("run-b"))
    assert raised.value.holder == mine and lock in str(raised.value)
    release_lock(lock, "run-b")  # not its lock
    assert read_lock(lock) == mine
    release_lock(lock, "run-a")
    assert read_lock(lock) is None and not blob.exists()
    # A dead process of this host: taken over.
    dead = LockHolder("run-dead", socket.gethostname(), _dead_pid(), "2026-01-01T00:00:00+00:00")
    blob.upload_from_string(dead.to_bytes())
    assert acquire_lock(lock, LockHolder.this_process("run-c")) == dead
    assert read_lock(lock).run_id == "run-c"
    # Unreadable and just written: a run that is starting.
    blob.upload_from_string(b"\xff")
    with pytest.raises(LockHeld, match="a run that is starting"):
        acquire_lock(lock, LockHolder.this_process("run-d"))
    blob.delete()


def test_a_gs_lock_object_is_created_once_read_and_removed(gcs):
    emulator, bucket = gcs
    name = f"out-{uuid.uuid4().hex[:6]}/.recordforge-lock"
    blob = emulator.client().bucket(bucket).blob(name)
    store = lock_module._GcsLock(f"gs://{bucket}/{name}")
    assert store.read() is None
    assert store.create(b"first") is True and store.create(b"second") is False
    holder, generation, age = store.read()
    assert holder is None and 0 <= age < 30 and blob.download_as_bytes() == b"first"
    assert store.remove(generation) is True and not blob.exists()
    assert store.remove(generation) is False  # gone


def test_a_gs_lock_taken_meanwhile_is_not_released(gcs, monkeypatch):
    """A release deletes the lock it read, never one another run wrote since."""
    emulator, bucket = gcs
    name = f"out-{uuid.uuid4().hex[:6]}/.recordforge-lock"
    lock = f"gs://{bucket}/{name}"
    blob = emulator.client().bucket(bucket).blob(name)
    assert acquire_lock(lock, LockHolder.this_process("run-a")) is None
    theirs = LockHolder.this_process("run-b")
    parse = lock_module._parse

    def replaced_after_reading(data):
        blob.upload_from_string(theirs.to_bytes())  # run-b's, written between read and delete
        monkeypatch.setattr(lock_module, "_parse", parse)
        return parse(data)

    monkeypatch.setattr(lock_module, "_parse", replaced_after_reading)
    release_lock(lock, "run-a")
    assert read_lock(lock) == theirs
    blob.delete()


def test_an_unreadable_gs_lock_past_its_grace_is_taken_over(gcs, monkeypatch):
    emulator, bucket = gcs
    name = f"out-{uuid.uuid4().hex[:6]}/.recordforge-lock"
    lock = f"gs://{bucket}/{name}"
    blob = emulator.client().bucket(bucket).blob(name)
    blob.upload_from_string(b"\xff")
    blob.reload()
    written = blob.updated.timestamp()
    monkeypatch.setattr(lock_module.time, "time", lambda: written + 29.9)
    with pytest.raises(LockHeld, match="a run that is starting"):
        acquire_lock(lock, LockHolder.this_process("run-a"))
    monkeypatch.setattr(lock_module.time, "time", lambda: written + 30)
    assert acquire_lock(lock, LockHolder.this_process("run-a")) is None
    assert read_lock(lock).run_id == "run-a"
    blob.delete()


def test_a_local_folder_exists_only_as_a_folder(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    assert staging_module.folder_exists(str(tmp_path)) is True
    assert staging_module.folder_exists(str(tmp_path / "file")) is False
    assert staging_module.folder_exists(str(tmp_path / "missing")) is False


def test_an_object_store_folder_exists_when_an_object_is_under_it(gcs):
    emulator, bucket = gcs
    folder = f"out-{uuid.uuid4().hex[:6]}"
    assert staging_module.folder_exists(f"gs://{bucket}/{folder}") is False
    emulator.client().bucket(bucket).blob(f"{folder}/deep/x").upload_from_string(b"x")
    assert staging_module.folder_exists(f"gs://{bucket}/{folder}/") is True
    assert staging_module.folder_exists(f"gs://{bucket}/{folder}/deep") is True
    assert staging_module.folder_exists(f"gs://{bucket}/{folder[:-1]}") is False
    # Only the slashes at its end are dropped: a folder named ...X is not ... .
    emulator.client().bucket(bucket).blob(f"{folder}X/x").upload_from_string(b"x")
    assert staging_module.folder_exists(f"gs://{bucket}/{folder}X") is True
    assert staging_module.folder_exists(f"gs://{bucket}/{folder}XX") is False


# --- the lock on another object store (checked, then written, through Beam's FileSystems) ------


class _PrefixedLocalFileSystem(LocalFileSystem):
    """A Beam filesystem for `rftestfs://` paths, kept in a local folder (`root`): what the lock
    does on a store without conditional writes (s3://, ...), without one. Beam finds it by its
    scheme among FileSystem's subclasses; no other test uses that scheme."""

    root = ""
    # Object stores report a missing object as an error of their own, not FileNotFoundError.
    missing_as_beam_error = False

    @classmethod
    def scheme(cls):
        return "rftestfs"

    def _local(self, path: str) -> str:
        if not path.startswith("rftestfs://"):
            return path  # already translated (delete matches what it deletes)
        return os.path.join(self.root, path[len("rftestfs://") :])

    def create(self, path, *args, **kwargs):
        os.makedirs(os.path.dirname(self._local(path)), exist_ok=True)
        return super().create(self._local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        if self.missing_as_beam_error and not os.path.lexists(self._local(path)):
            raise BeamIOError("Not found", {path: OSError(f"404 {path}")})
        return super().open(self._local(path), *args, **kwargs)

    def exists(self, path):
        return super().exists(self._local(path))

    def delete(self, paths):
        return super().delete([self._local(path) for path in paths])

    def match(self, patterns, limits=None):
        return super().match([self._local(pattern) for pattern in patterns], limits)


def test_a_lock_on_a_store_without_conditional_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(_PrefixedLocalFileSystem, "root", str(tmp_path))
    lock = "rftestfs://bucket/out/.recordforge-lock"
    local = tmp_path / "bucket/out/.recordforge-lock"
    assert read_lock(lock) is None
    mine = LockHolder.this_process("run-a")
    assert acquire_lock(lock, mine) is None
    assert local.read_bytes() == mine.to_bytes()
    with pytest.raises(LockHeld) as raised:
        acquire_lock(lock, LockHolder.this_process("run-b"))
    assert raised.value.holder == mine
    assert local.read_bytes() == mine.to_bytes()  # checked, not overwritten
    holder, token, age = lock_module._FileLock(lock).read()
    # A store gives no age: an unreadable lock there is taken as past its grace.
    assert (holder, token, age) == (mine, mine.to_bytes(), lock_module._UNREADABLE_GRACE_SECONDS)
    release_lock(lock, "run-b")  # not its holder: left alone
    assert local.read_bytes() == mine.to_bytes()
    release_lock(lock, "run-a")
    assert not local.exists() and read_lock(lock) is None
    dead = LockHolder("run-dead", socket.gethostname(), _dead_pid(), "x")
    local.write_bytes(dead.to_bytes())
    assert acquire_lock(lock, LockHolder.this_process("run-c")) == dead
    assert read_lock(lock).run_id == "run-c"
    # Unreadable: on a store its age is unknown, taken as past the grace: taken over.
    local.write_bytes(b"\xff")
    assert acquire_lock(lock, LockHolder.this_process("run-d")) is None
    assert read_lock(lock).run_id == "run-d"


def test_a_lock_on_a_store_that_fails_to_read(tmp_path, monkeypatch):
    monkeypatch.setattr(_PrefixedLocalFileSystem, "root", str(tmp_path))
    lock = "rftestfs://bucket/out/.recordforge-lock"
    local = tmp_path / "bucket/out/.recordforge-lock"
    local.mkdir(parents=True)  # there, but unreadable: an error, not a free lock
    with pytest.raises(OSError):
        read_lock(lock)
    with pytest.raises(OSError):
        acquire_lock(lock, LockHolder.this_process("run-a"))
    local.rmdir()
    # A store's error for a lock that is not there (or was deleted meanwhile): no lock.
    monkeypatch.setattr(_PrefixedLocalFileSystem, "missing_as_beam_error", True)
    assert read_lock(lock) is None
    release_lock(lock, "run-a")
    assert acquire_lock(lock, LockHolder.this_process("run-a")) is None
    assert read_lock(lock).run_id == "run-a"
