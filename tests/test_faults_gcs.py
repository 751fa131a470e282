"""gs:// under faults: the storage service failing for a while, runs racing for the lock, a run
killed at each step of its journal commit. Against the storage emulator on 127.0.0.1, behind a
proxy (tests/gcs_traffic.py) that injects the errors and enforces generation preconditions
(ifGenerationMatch), which the emulator ignores and Cloud Storage does not.

The invariant after each fault (tests/test_faults.py): the output holds the previous dataset or
the new one, or readers refuse it while a commit is being rolled forward; `verify` is clean on
what they read; no record is lost; a rerun (with `--resume`) completes.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from conftest import RECORDFORGE
from gcs_traffic import proxied_emulator
from test_faults import _without_created, tally
from test_gcs import OPTIONS, download, upload

from recordforge.pipelines.dataset import open_dataset
from recordforge.pipelines.verify import verify_dataset
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.lock import LockHeld, LockHolder, acquire_lock, read_lock


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """The emulator behind a proxy that enforces preconditions and injects faults; this process
    and the programs it starts talk to the proxy. Yields (emulator, faults)."""
    with proxied_emulator(tmp_path_factory.mktemp("gcs-faults"), preconditions=True) as (
        emulator,
        _,
        faults,
    ):
        yield emulator, faults


@pytest.fixture
def bucket(proxied):
    emulator, faults = proxied
    faults.clear()
    name = f"rf-{uuid.uuid4().hex[:12]}"
    emulator.client().create_bucket(name)
    return name


def _run(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RECORDFORGE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _wait_for_object(emulator, bucket: str, name: str, process: subprocess.Popen) -> None:
    """Until `name` exists, asked of the emulator itself (not through the failing proxy)."""
    query = urllib.parse.urlencode({"prefix": name})
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        with urllib.request.urlopen(f"{emulator.endpoint}/storage/v1/b/{bucket}/o?{query}") as r:
            if json.loads(r.read()).get("items"):
                return
        time.sleep(0.05)
    pytest.fail(f"{name} never appeared: {process.communicate()[1]}")


def _dataset(proxied, bucket) -> dict[str, bytes]:
    emulator, _ = proxied
    return {k: v for k, v in download(emulator, bucket, "out").items() if not k.startswith(".")}


def _counts(files: dict[str, bytes]) -> list:
    info = json.loads(files["dataset_info.json"])
    return [info["num_inputs"], info["num_records"]]


def _state(proxied, bucket, old, new) -> str:
    """'old', 'new' or 'refused' (a commit to roll forward), checked; fails on anything else.
    Old and new are byte for byte (the manifest's `created` time aside)."""
    output = f"gs://{bucket}/out"
    try:
        dataset = open_dataset(output)
    except UsageError as error:
        assert "being replaced" in str(error), error
        return "refused"
    files = _dataset(proxied, bucket)
    if files == old:
        state = "old"
    else:
        found, wanted = _without_created(files), _without_created(new)
        changed = sorted(n for n in found.keys() | wanted.keys() if found.get(n) != wanted.get(n))
        if changed:
            info = json.loads(files["dataset_info.json"]) if "dataset_info.json" in files else {}
            counts = [info.get(k) for k in ("num_inputs", "num_records")]
            pytest.fail(
                f"neither the previous dataset nor the new one: {changed} differ "
                f"(inputs, records: {counts}; the new dataset's: {_counts(new)})"
            )
        state = "new"
    report = verify_dataset(output)
    # A commit killed while it cleaned up leaves its working folder: a warning, nothing more.
    assert report.ok, [f.message for f in report.findings.listed]
    assert set(report.findings.by_check) <= {"temp_folder"}, report.findings.by_check
    assert dataset.manifest.counts_add_up()
    return state


@pytest.fixture
def old_and_new(proxied, bucket, photo_folder):
    """gs://bucket/out holding a previous dataset; the files of the new one (what an
    uninterrupted run with OPTIONS writes there, made first)."""
    emulator, _ = proxied
    upload(emulator, photo_folder, bucket, "in/photos")
    args = ("convert", f"gs://{bucket}/in/photos", "-o", f"gs://{bucket}/out", "--overwrite")
    result = _run(*args, *OPTIONS)
    assert result.returncode == 0, result.stderr
    new = _dataset(proxied, bucket)
    result = _run(*args, "--name", "old")
    assert result.returncode == 0, result.stderr
    return _dataset(proxied, bucket), new


def test_storage_errors_for_a_while_leave_old_or_new_and_a_rerun_completes(
    proxied, bucket, old_and_new
):
    """503s mid-read (an image's download while probing, another's while writing its shard) and
    mid-write (a staged shard's upload), once each, then every write for 4 s: each run must end
    with the new dataset, byte for byte, every input counted; a rerun with --resume completes.
    Shown to catch: a 503 mid-read taken for end-of-file; a shard upload's 503 swallowed, unretried.
    """
    _storage_errors(proxied, bucket, old_and_new, every=False)


@pytest.mark.slow
def test_storage_errors_of_every_kind_leave_old_or_new_and_a_rerun_completes(
    proxied, bucket, old_and_new
):
    _storage_errors(proxied, bucket, old_and_new, every=True)


class _MidReadAndWrite:
    """A fault rule (gcs_traffic.Faults' `when`): a 503, once each, for the first download of
    two input images (the probe reads them), the second download of two others (the shard
    writer reads them) and an upload request of two staged shards. `hit` lists them by stage."""

    def __init__(self) -> None:
        self.downloads: collections.Counter = collections.Counter()
        self.hit: dict[str, list[str]] = {"probe": [], "write": [], "upload": []}

    def __call__(self, method: str, path: str) -> bool:
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        if method == "GET" and "media" in query.get("alt", ()) and "/o/in/photos/" in url.path:
            key = url.path
            self.downloads[key] += 1
            stage = {1: "probe", 2: "write"}.get(self.downloads[key])
        elif method == "PUT" and ".tfrecord-" in query.get("upload_id", [""])[0]:
            key, stage = query["upload_id"][0], "upload"  # the emulator's id names the object
        else:
            return False
        if stage is None or len(self.hit[stage]) == 2 or any(key in k for k in self.hit.values()):
            return False  # a retry of a request answered 503 goes through
        self.hit[stage].append(key)
        return True


def _storage_errors(proxied, bucket, old_and_new, every: bool) -> None:
    _, faults = proxied
    old, new = old_and_new
    args = ("convert", f"gs://{bucket}/in/photos", "-o", f"gs://{bucket}/out", *OPTIONS)
    mid_read_and_write = _MidReadAndWrite()
    # (what is refused, for how long (None: as the rule says), whether the run must succeed)
    rounds = [
        (mid_read_and_write, None, True),
        (lambda method, path: method in ("POST", "PUT", "PATCH", "DELETE"), 4, True),
    ]
    if every:  # every request for 2 s: the run may give up, with one line
        rounds.append((lambda method, path: True, 2, False))
    for when, seconds, must_succeed in rounds:
        process = subprocess.Popen(
            [RECORDFORGE, *args, "--overwrite"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        _wait_for_object(proxied[0], bucket, "out/.recordforge-staging/run.json", process)
        before = faults.failed
        faults.fail(503, seconds=seconds, when=when)  # from the moment the run starts working
        _, stderr = process.communicate(timeout=600)
        faults.clear()
        assert faults.failed > before, "no request was refused: the fault missed the run"
        state = _state(proxied, bucket, old, new)
        tally("storage errors (503) for a while", outcome=state, exit=process.returncode, lost=0)
        assert "Traceback" not in stderr, stderr
        if must_succeed:
            assert (process.returncode, state) == (0, "new"), (
                f"exit status {process.returncode}, the {state} dataset in place:\n{stderr}"
            )
        elif process.returncode:
            assert stderr.strip().splitlines()[-1].startswith("recordforge: failed: "), stderr
        rerun = _run(*args, "--overwrite", "--resume")
        assert rerun.returncode == 0, rerun.stderr
        assert _state(proxied, bucket, old, new) == "new"
        old = _dataset(proxied, bucket)  # the next round replaces this one
    hit = {stage: len(keys) for stage, keys in mid_read_and_write.hit.items()}
    assert hit == {"probe": 2, "write": 2, "upload": 2}, hit


def test_of_runs_racing_for_a_gs_lock_exactly_one_wins(proxied, bucket):
    lock = f"gs://{bucket}/out/.recordforge-lock"
    for _ in range(5):
        winners, barrier = [], threading.Barrier(6)

        def contend(i, winners=winners, barrier=barrier):
            barrier.wait()
            try:
                acquire_lock(lock, LockHolder.this_process(f"run-{i}", detached=True))
                winners.append(i)
            except LockHeld:
                pass

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1, winners
        assert read_lock(lock).run_id == f"run-{winners[0]}"
        proxied[0].client().bucket(bucket).blob("out/.recordforge-lock").delete()


class _ListingsAfter:
    """A fault rule: every listing of the objects under `prefix` after the first `allowed`."""

    def __init__(self, bucket: str, prefix: str, allowed: int) -> None:
        self.path, self.prefix, self.allowed, self.seen = f"/b/{bucket}/o", prefix, allowed, 0

    def __call__(self, method: str, path: str) -> bool:
        url = urllib.parse.urlsplit(path)
        prefix = urllib.parse.parse_qs(url.query).get("prefix", [""])[0]
        if (
            method != "GET"
            or not url.path.endswith(self.path)
            or not prefix.startswith(self.prefix)
        ):
            return False
        self.seen += 1
        return self.seen > self.allowed


def test_an_input_listing_refused_fails_the_run_and_keeps_the_previous_dataset(
    proxied, bucket, old_and_new
):
    """The input folder's listing refused (403) from its first, second, ... listing on: the
    preflight's look, or the pipeline's own listing of the inputs. Each run must fail with one
    line naming the listing, and leave the previous dataset. Shown to catch: a listing error
    taken for an empty folder, which committed a dataset of 0 records over the previous one
    (exit 0, 'no errors')."""
    _, faults = proxied
    old, _ = old_and_new
    args = ("convert", f"gs://{bucket}/in/photos", "-o", f"gs://{bucket}/out", "--overwrite")
    lines = []
    for allowed in range(10):
        rule = _ListingsAfter(bucket, "in/photos", allowed)
        faults.fail(403, when=rule)
        result = _run(*args, *OPTIONS)
        faults.clear()
        if rule.seen <= allowed:  # past the run's last listing: nothing was refused
            assert result.returncode == 0, result.stderr
            break
        assert result.returncode in (1, 2), result.stdout + result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert f"cannot list gs://{bucket}/in/photos/**: 403 " in line, result.stderr
        assert line.startswith(("recordforge: failed: ", "recordforge: error: input ")), line
        assert _dataset(proxied, bucket) == old
        lines.append(line)
    # The pipeline's own listing was among those refused, not only the preflight's.
    assert any(line.endswith("is as it was; nothing staged was kept") for line in lines), lines


def test_a_second_run_into_a_locked_gs_output_is_refused_naming_the_first(proxied, bucket):
    emulator, _ = proxied
    holder = LockHolder("run-elsewhere", "another-host", 4242, "2026-01-01T00:00:00+00:00")
    emulator.client().bucket(bucket).blob("out/.recordforge-lock").upload_from_string(
        holder.to_bytes()
    )
    emulator.client().bucket(bucket).blob("in/x.csv").upload_from_string(b"a,b\n1,2\n")
    result = _run("convert", f"gs://{bucket}/in/x.csv", "-o", f"gs://{bucket}/out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "recordforge: error: another conversion is writing this output: run run-elsewhere (pid "
        f"4242 on another-host, started 2026-01-01T00:00:00+00:00) holds gs://{bucket}/out/"
        ".recordforge-lock; wait for it, or, if it is no longer running, delete that file"
    ]


# The CLI, killed (SIGKILL) at the Nth Beam FileSystems call of its journal commit: a test-only
# hook in this wrapper (strace cannot tell one HTTP request from another).
_KILLED_IN_COMMIT = """
import os, signal, sys
from apache_beam.io.filesystems import FileSystems
import recordforge.transforms.staging as staging
kill_at, calls = int(os.environ["KILL_AT"]), []
def counted(name, function):
    def call(*args, **kwargs):
        calls.append(name)
        if len(calls) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)
    return staticmethod(call)
real_commit = staging.commit
def commit(*args, **kwargs):
    for name in ("rename", "delete", "create"):
        setattr(FileSystems, name, counted(name, getattr(FileSystems, name)))
    real_commit(*args, **kwargs)
    print(f"commit calls: {','.join(calls)}", file=sys.stderr)
import recordforge.transforms.commit
recordforge.transforms.commit.commit = commit
from recordforge.pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _killed_in_commit(args, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _KILLED_IN_COMMIT, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "KILL_AT": str(kill_at)},
    )


def test_a_journal_commit_killed_at_steps_is_refused_then_rolled_forward(
    proxied, bucket, old_and_new
):
    _kill_journal_commit(proxied, bucket, old_and_new, every=False)


@pytest.mark.slow
def test_a_journal_commit_killed_at_every_step_is_refused_then_rolled_forward(
    proxied, bucket, old_and_new
):
    _kill_journal_commit(proxied, bucket, old_and_new, every=True)


def _kill_journal_commit(proxied, bucket, old_and_new, every: bool) -> None:
    old, new = old_and_new
    args = ("convert", f"gs://{bucket}/in/photos", "-o", f"gs://{bucket}/out", *OPTIONS)
    counted = _killed_in_commit([*args, "--overwrite", "--name", "old"], 0)  # no kill: count
    assert counted.returncode == 0, counted.stderr
    calls = counted.stderr.rsplit("commit calls: ", 1)[1].split()[0].split(",")
    total = len(calls)
    assert total >= 6, calls
    old = _dataset(proxied, bucket)
    states = []
    # create (the manifest), create + rename (the journal), delete (the old metadata), ...
    journal = calls.index("rename") + 1  # the call that puts the journal in place
    # By default: just after the journal is in place, halfway through the rest, the last call.
    points = range(1, total + 1) if every else [journal + 1, (journal + 1 + total) // 2, total]
    for kill_at in points:
        killed = _killed_in_commit([*args, "--overwrite"], kill_at)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        state = _state(proxied, bucket, old, new)
        states.append(state)
        tally("gs:// kill at a journal commit step", trial=kill_at, outcome=state, lost=0)
        # The next run (here a --resume with the same options) finishes the commit first.
        rerun = _run(*args, "--overwrite", "--resume")
        assert rerun.returncode == 0, rerun.stderr
        assert _state(proxied, bucket, old, new) == "new"
        _put_back(proxied[0], bucket, old)  # the previous dataset again, for the next kill
    assert ({"old", "refused", "new"} if every else {"refused", "new"}) <= set(states), states


def _put_back(emulator, bucket: str, files: dict[str, bytes]) -> None:
    """gs://bucket/out holding exactly `files`."""
    client = emulator.client().bucket(bucket)
    for blob in emulator.client().list_blobs(bucket, prefix="out/"):
        blob.delete()
    for name, data in files.items():
        client.blob(f"out/{name}").upload_from_string(data)
