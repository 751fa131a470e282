"""Fault injection on real runs of the `recordforge` program (issue 14, requirement 7).

Every fault lands on a conversion that replaces a previous dataset (`--overwrite`), and after each
the invariant is checked: the output folder holds the previous dataset or the new one, byte for
byte, never a mix; `verify` finds nothing wrong; no record is lost (`num_inputs == num_records +
errors.count`); and a rerun with `--resume` completes with the new dataset, byte-identical to an
uninterrupted run. Faults: a SIGKILL at each filesystem call of the commit (strace's syscall
injection), SIGKILLs at random moments of whole runs, SIGINT/SIGTERM, a worker process killed
mid-bundle (FnApiRunner's multi-process mode, and a Dask worker), a filesystem that fills up.
Cloud Storage faults are in tests/test_faults_gcs.py.

The `slow` tests run many trials (`pytest -m slow tests/test_faults.py`); the default run has a
few of each. Set RECORDFORGE_FAULT_TALLY=FILE to have each test add its outcomes to FILE (JSON
lines), the figures of the README's "Reliability" section.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import time

import pytest
from conftest import RECORDFORGE, make_image
from test_runners import servers  # noqa: F401  (a fixture: starts and stops server processes)

from recordforge.pipelines.verify import verify_dataset
from recordforge.transforms.internals import WORKER_MODULE
from recordforge.worker_forks import FORK_SERVER_FLAG

STRACE = shutil.which("strace")
ARGS = (
    "--name",
    "pets",
    "--splits",
    "train=0.8,validation=0.2",
    "--write-index",
    "--min-shard-mb",
    "0.1",
    "--max-shard-mb",
    "0.2",
)
MULTI = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


# --- the data and the two datasets ------------------------------------------------------------


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> pathlib.Path:
    """root/<class>/<file>: 400 JPEGs of varied sizes (about 2-40 KB) in 4 classes, 2 bad."""
    root = tmp_path_factory.mktemp("faults") / "photos"
    rng = random.Random(11)
    for index in range(400):
        size = (rng.randint(40, 400), rng.randint(40, 300))
        make_image(root / f"c{index % 4}" / f"{index:04d}.jpg", "JPEG", size=size, seed=index)
    (root / "c0" / "broken.jpg").write_bytes(b"\xff\xd8 not a picture")
    (root / "c1" / "empty.jpg").write_bytes(b"")
    return root


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _without_created(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files, the manifest's `created` time left out (it is the only byte that differs
    between two runs of the same inputs and options)."""
    out = dict(files)
    for name in ("dataset_info.json", "recordforge.json"):
        if name in out:
            document = json.loads(out[name])
            document.pop("created", None)
            out[name] = json.dumps(document, sort_keys=True).encode()
    return out


def convert(photos, out, *extra, check=True, timeout=600) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [RECORDFORGE, "convert", str(photos), "-o", str(out), *ARGS, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def new(photos, tmp_path_factory) -> dict:
    """An uninterrupted run's dataset (what every fault must end in), and how long it worked:
    from the moment its working folder appeared (the program has started, the lock is taken)
    to its end."""
    out = tmp_path_factory.mktemp("new") / "out"
    process = _start(photos, out)
    work = out.parent / f".{out.name}.recordforge"
    while not work.exists() and process.poll() is None:
        time.sleep(0.005)
    started = time.monotonic()
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    seconds = time.monotonic() - started
    files = _files(out)
    assert sum(".tfrecord-" in name and not name.endswith(".idx") for name in files) >= 6
    return {"files": files, "seconds": seconds}


@pytest.fixture(scope="module")
def old(photos, tmp_path_factory) -> dict[str, bytes]:
    """The previous dataset each fault's run replaces: other options, other shard names."""
    out = tmp_path_factory.mktemp("old") / "out"
    subprocess.run(
        [RECORDFORGE, "convert", str(photos), "-o", str(out), "--name", "old", "--num-shards", "2"],
        check=True,
        capture_output=True,
        env=ENV,
    )
    return _files(out)


def _place(files: dict[str, bytes], folder: pathlib.Path) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def check_invariant(out: pathlib.Path, old: dict, new: dict) -> str:
    """'old' or 'new': what the folder holds, whole and verified; fails on anything else."""
    files = _files(out)
    if files == old:
        state = "old"
    elif _without_created(files) == _without_created(new["files"]):
        state = "new"
    else:
        pytest.fail(f"{out} holds neither dataset: {_differences(files, new['files'])}")
    report = verify_dataset(str(out))
    assert report.ok and not report.findings.warnings, [f.message for f in report.findings.listed]
    info = json.loads(files["dataset_info.json"])
    assert info["num_inputs"] == info["num_records"] + info["errors"]["count"]  # nothing lost
    return state


def _differences(found: dict[str, bytes], new: dict[str, bytes]) -> str:
    """How a folder's files differ from the new dataset's, in a few words."""
    found, new = _without_created(found), _without_created(new)
    changed = sorted(name for name in found.keys() & new.keys() if found[name] != new[name])
    missing, extra = sorted(new.keys() - found.keys()), sorted(found.keys() - new.keys())
    return f"other bytes in {changed}, missing {missing}, extra {extra}"


def resume_completes(photos, out, new) -> None:
    result = convert(photos, out, "--overwrite", "--resume")
    assert "Traceback" not in result.stderr
    assert check_invariant(out, {}, new) == "new"
    assert sorted(os.listdir(out.parent)) == ["out"]  # no working folder, no lock left


def tally(fault: str, **outcome) -> None:
    """Add one trial's outcome to $RECORDFORGE_FAULT_TALLY (JSON lines), if set."""
    path = os.environ.get("RECORDFORGE_FAULT_TALLY")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"fault": fault, **outcome}) + "\n")


def _records_lost(out: pathlib.Path) -> int:
    info = json.loads((out / "dataset_info.json").read_bytes())
    return info["num_inputs"] - info["num_records"] - info["errors"]["count"]


def _start(photos, out, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        [RECORDFORGE, "convert", str(photos), "-o", str(out), *ARGS, "--overwrite", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,  # its own process group, as a terminal's job
    )


def _staged_parts(out: pathlib.Path) -> int:
    parts = out.parent / f".{out.name}.recordforge" / "parts"
    try:
        return sum(name.endswith(".part.json") for name in os.listdir(parts))
    except FileNotFoundError:
        return 0


def _wait_for_parts(process: subprocess.Popen, out: pathlib.Path, count: int) -> bool:
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if _staged_parts(out) >= count:
            return True
        time.sleep(0.01)
    return False


def _running(pid: int) -> bool:
    """Whether a process exists and is not a zombie (dead, not yet reaped by init)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), ()):
            found.append(child)
            pending.append(child)
    return found


# --- a SIGKILL at each filesystem call of the commit ------------------------------------------

_TRACED = "rename,renameat,renameat2,unlink,unlinkat,rmdir"


def _commit_calls(photos, tmp_path, old) -> list[tuple[str, int]]:
    """The commit's filesystem calls, in order, as (system call, its invocation number in the
    thread that made it): what strace's `inject=CALL:signal=KILL:when=N` takes (it counts each
    system call separately, per thread). Found by a run under strace that logs them. The
    in-process runner does all its work, the commit included, in the program's main thread."""
    out = tmp_path / "count" / "out"
    _place(old, out)
    log = tmp_path / "strace.log"
    command = [STRACE, "-f", "-qq", "-e", "signal=none", "-e", f"trace={_TRACED}", "-o", str(log)]
    subprocess.run(
        [*command, RECORDFORGE, "convert", str(photos), "-o", str(out), *ARGS, "--overwrite"],
        check=True,
        capture_output=True,
        env=ENV,
    )
    # "PID  call(...)": strace pads the pid to 5 columns, so split on any run of spaces.
    lines = [line.split(None, 1) for line in log.read_text().splitlines()]
    # The thread that made the commit's exchange (the one of the staged dataset folder).
    main = next(pid for pid, call in lines if "RENAME_EXCHANGE" in call and "/dataset" in call)
    seen, calls = {}, []
    for pid, call in lines:
        # Beam's own temporary folder is removed by whichever thread gets there first.
        if pid != main or call.startswith(("+++", "---")) or "beam-pipeline-temp" in call:
            continue
        name = call.split("(", 1)[0]
        seen[name] = seen.get(name, 0) + 1
        calls.append((name, seen[name], call))
    first = next(i for i, (_, _, call) in enumerate(calls) if "/dataset/" in call)
    assert any("RENAME_EXCHANGE" in call for _, _, call in calls[first:]), calls[first:]
    return [(name, number) for name, number, _ in calls[first:]]


def _kill_at_call(photos, out, call: tuple[str, int]) -> subprocess.CompletedProcess:
    name, number = call
    return subprocess.run(
        [STRACE, "-f", "-qq", "-o", "/dev/null", "-e", "signal=none", "-e", f"trace={name}"]
        + ["-e", f"inject={name}:signal=KILL:when={number}"]
        + [RECORDFORGE, "convert", str(photos), "-o", str(out), *ARGS, "--overwrite"],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )


def _kill_each_commit_step(photos, tmp_path, old, new, every: bool) -> None:
    if STRACE is None:
        pytest.fail("strace is not installed (apt-get install strace)")
    calls = _commit_calls(photos, tmp_path, old)
    exchange = next(i for i, (name, _) in enumerate(calls) if name == "renameat2")
    points = list(range(len(calls)))
    if not every:  # the first call, the exchange (killed on entry: before it), the last
        points = sorted({0, exchange, len(calls) - 1})
    states = []
    for point in points:
        out = tmp_path / f"at{point}" / "out"
        _place(old, out)
        killed = _kill_at_call(photos, out, calls[point])
        assert killed.returncode != 0, f"{calls[point]} ({point} of {len(calls)}): not killed"
        state = check_invariant(out, old, new)
        states.append(state)
        tally("kill at a commit step", trial=point, outcome=state, lost=_records_lost(out))
        resume_completes(photos, out, new)
    assert "old" in states and "new" in states, states  # kills fell before and after the swap


def test_a_sigkill_at_commit_steps_leaves_old_or_new_and_resume_finishes(
    photos, tmp_path, old, new
):
    _kill_each_commit_step(photos, tmp_path, old, new, every=False)


@pytest.mark.slow
def test_a_sigkill_at_every_commit_step_leaves_old_or_new_and_resume_finishes(
    photos, tmp_path, old, new
):
    _kill_each_commit_step(photos, tmp_path, old, new, every=True)


def _convert_with_fault(
    photos, out, call: str, fault: str, *extra: str, path=None
) -> subprocess.CompletedProcess:
    """A conversion over `out` with strace making `call` fail (`fault`: "EIO", "EBUSY:when=2"),
    only on `path` when given."""
    if STRACE is None:
        pytest.fail("strace is not installed (apt-get install strace)")
    only = ["-P", str(path)] if path is not None else []
    return subprocess.run(
        [STRACE, "-f", "-qq", "-o", "/dev/null", "-e", "signal=none", *only]
        + ["-e", f"trace={call}", "-e", f"inject={call}:error={fault}"]
        + [RECORDFORGE, "convert", str(photos), "-o", str(out), *ARGS, "--overwrite", *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )


def test_a_failure_after_the_swap_says_the_new_dataset_is_in_place(photos, tmp_path, old, new):
    # An I/O error while the old copy was deleted, after the swap, was reported as "OUT is as
    # it was; ... staged shards kept", while OUT held the new dataset.
    out = tmp_path / "out"
    _place(old, out)
    shard = next(name for name in sorted(old) if ".tfrecord-" in name and "/" not in name)
    swapped_out = out.parent / f".{out.name}.recordforge" / "dataset" / shard
    result = _convert_with_fault(photos, out, "unlink", "EIO", path=swapped_out)
    # The run's dataset is in place: it succeeded, with a warning (it exited 1, "the
    # conversion failed", and a traceback; a tester's finding).
    assert result.returncode == 0, result.stderr
    assert check_invariant(out, old, new) == "new"
    assert "is as it was" not in result.stderr and "Traceback" not in result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warning.startswith(f"recordforge: warning: the new dataset is in place in {out}, ")
    assert "(EIO)" in warning and "the next run into it finishes that" in warning
    assert result.stdout.startswith("Converted ")
    convert(photos, out, "--overwrite")  # finishes the cleanup first
    assert not swapped_out.parent.parent.exists()
    assert check_invariant(out, old, new) == "new"


@pytest.mark.parametrize(
    ("call", "fault"),
    [("renameat2", "EIO:when=2"), ("mkdir", "EACCES:when=9"), ("rename", "EACCES:when=5")],
    ids=["exchange-eio", "mkdir-eacces", "rename-eacces"],
)
def test_a_system_call_refused_is_one_line_and_leaves_the_previous_dataset(
    photos, tmp_path, old, new, call, fault
):
    # Any errno but a full disk's ended in Beam's 80-150-line traceback (a tester's finding).
    out = tmp_path / "out"
    _place(old, out)
    result = _convert_with_fault(photos, out, call, fault)
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert "Traceback" not in result.stderr, result.stderr
    assert line.startswith("recordforge: failed: the system refused a file operation "), line
    assert f"({fault.split(':')[0]}); {out} is as it was" in line, line
    assert check_invariant(out, old, new) == "old"
    again = tmp_path / "again" / "out"  # a fresh folder: the first run's commit is not redone
    _place(old, again)
    verbose = _convert_with_fault(photos, again, call, fault, "-v")
    assert "Traceback" in verbose.stderr  # -v shows it


def test_a_working_folder_that_cannot_be_removed_is_said(photos, tmp_path, old, new):
    # An rmdir refused after the commit left an empty working folder without a word, exit 0.
    out = tmp_path / "out"
    _place(old, out)
    result = _convert_with_fault(photos, out, "rmdir", "EBUSY:when=2")
    assert result.returncode == 0, result.stderr
    assert check_invariant(out, old, new) == "new"
    work = out.parent / f".{out.name}.recordforge"
    assert work.exists()
    assert (
        f"recordforge: the working folder {work} could not be removed; the next run into {out} "
        "removes it"
    ) in result.stderr.splitlines(), result.stderr
    convert(photos, out, "--overwrite")
    assert not work.exists()


def test_a_previous_manifest_that_cannot_be_read_is_one_line(photos, tmp_path, old, new):
    # A bare 40-line traceback and no recordforge line at all (a tester's finding).
    out = tmp_path / "out"
    _place(old, out)
    manifest = out / "dataset_info.json"
    result = _convert_with_fault(photos, out, "openat", "EACCES", path=manifest)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"recordforge: error: cannot prepare the output folder {str(out)!r}: Permission denied "
        f"({manifest})"
    ]
    assert check_invariant(out, old, new) == "old"


def test_a_refused_run_that_finished_an_interrupted_commit_says_so(photos, tmp_path, old, new):
    # Killed past its commit point (the journal written) and before the swap, a run leaves its
    # commit for the next run to finish; one refused for want of --overwrite finished it
    # without a word, its one line saying only that the folder was not empty.
    if STRACE is None:
        pytest.fail("strace is not installed (apt-get install strace)")
    calls = _commit_calls(photos, tmp_path, old)
    exchange = next(i for i, (name, _) in enumerate(calls) if name == "renameat2")
    out = tmp_path / "cut" / "out"
    _place(old, out)
    assert _kill_at_call(photos, out, calls[exchange]).returncode != 0
    refused = convert(photos, out, check=False)
    assert refused.returncode == 2, refused.stderr
    assert "use --overwrite" in refused.stderr
    assert "finished the interrupted commit of run" in refused.stderr
    assert check_invariant(out, old, new) == "new"


# --- SIGKILLs at random moments ---------------------------------------------------------------


def _random_kills(photos, tmp_path, old, new, trials: int, seed: int, extra=()) -> list[str]:
    rng = random.Random(seed)
    states = []
    for trial in range(trials):
        out = tmp_path / f"t{trial}" / "out"
        _place(old, out)
        process = _start(photos, out, *extra)
        # A moment while the run works (its start, importing Beam, changes nothing on disk).
        work = out.parent / f".{out.name}.recordforge"
        while not work.exists() and process.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, new["seconds"] * 1.1))
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        state = check_invariant(out, old, new)
        states.append(state)
        tally(
            "random SIGKILL" + (" (2 worker processes)" if extra else ""),
            trial=trial,
            outcome=state,
            staged=_staged_parts(out),
            lost=_records_lost(out),
        )
        resume_completes(photos, out, new)
    return states


def test_random_sigkills_leave_old_or_new(photos, tmp_path, old, new):
    _random_kills(photos, tmp_path, old, new, trials=2, seed=1)


@pytest.mark.slow
def test_many_random_sigkills_leave_old_or_new(photos, tmp_path, old, new):
    states = _random_kills(photos, tmp_path, old, new, trials=40, seed=2)
    assert "old" in states


@pytest.mark.slow
def test_many_random_sigkills_of_multi_process_runs_leave_old_or_new(photos, tmp_path, old, new):
    _random_kills(photos, tmp_path, old, new, trials=15, seed=3, extra=MULTI)


# --- stops: SIGINT (a terminal's Ctrl-C: the whole process group) and SIGTERM ----------------


@pytest.mark.parametrize(
    ("signum", "group", "extra"),
    [
        (signal.SIGINT, True, ()),
        (signal.SIGTERM, False, ()),
        (signal.SIGINT, True, MULTI),
        (signal.SIGTERM, False, MULTI),
        # GNU timeout signals its child, then its process group: the child twice. The second
        # was taken for "stopped again" (exit at once, working folder and lock left).
        (signal.SIGTERM, "twice", MULTI),
    ],
    ids=["ctrl-c", "sigterm", "ctrl-c-2-workers", "sigterm-2-workers", "sigterm-as-timeout"],
)
def test_a_stop_exits_with_one_line_keeps_the_staged_work_and_resume_finishes(
    photos, tmp_path, old, new, signum, group, extra
):
    out = tmp_path / "out"
    _place(old, out)
    process = _start(photos, out, *extra)
    assert _wait_for_parts(process, out, 2), process.communicate()[1]
    workers = _descendants(process.pid)
    if group == "twice":
        process.send_signal(signum)
        time.sleep(0.01)  # after the watcher took the first
        os.killpg(process.pid, signum)
    elif group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    lines = stderr.strip().splitlines()
    assert lines and "Traceback" not in stderr, stderr
    name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else "SIGTERM"
    assert re.search(
        rf"^recordforge: stopped by {re.escape(name)}; {re.escape(str(out))} is as it was; "
        r"\d+ staged shards?, .* kept in .*: add --resume to continue$",
        lines[-1],
    ), stderr
    # Before it, only the run's progress lines.
    assert all(
        line.startswith(("recordforge: converting", "recordforge: wrote")) for line in lines[:-1]
    )
    alive = [pid for pid in workers if _running(pid)]
    assert not alive, f"worker processes left running: {alive}"
    assert not (out.parent / ".out.recordforge-lock").exists()
    state = check_invariant(out, old, new)
    tally(f"{name}{' (2 worker processes)' if extra else ''}", outcome=state, lost=0)
    resumed = convert(photos, out, "--overwrite", "--resume")
    assert re.search(r"resuming run \w+: \d+ staged shards", resumed.stderr), resumed.stderr
    assert resumed.stderr.count("staged by an earlier run") >= 2, resumed.stderr
    assert check_invariant(out, {}, new) == "new"


# --- a worker process killed mid-bundle -------------------------------------------------------


@pytest.mark.parametrize("victim", ["a worker", "the fork server"])
def test_a_worker_process_killed_mid_bundle_leaves_old_and_resume_finishes(
    photos, tmp_path, old, new, victim
):
    out = tmp_path / "out"
    _place(old, out)
    process = _start(photos, out, *MULTI)
    assert _wait_for_parts(process, out, 1), process.communicate()[1]
    # The runner's worker processes are forked by recordforge's fork server, a child of the
    # launcher running recordforge's worker entry point.
    server = [
        pid
        for pid in _descendants(process.pid)
        if _parent(pid) == process.pid
        and f"{WORKER_MODULE}\0{FORK_SERVER_FLAG}".encode()
        in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(server) == 1, "no fork server found"
    workers = [pid for pid in _descendants(server[0]) if _parent(pid) == server[0]]
    assert workers, "no worker process found"
    os.kill(workers[0] if victim == "a worker" else server[0], signal.SIGKILL)
    _, stderr = process.communicate(timeout=300)
    state = check_invariant(out, old, new)
    if process.returncode:
        lines = stderr.strip().splitlines()
        assert "Traceback" not in stderr, stderr
        assert lines[-1].startswith("recordforge: failed: the runner lost a worker process"), stderr
    alive = [pid for pid in [*server, *workers] if _running(pid)]
    assert not alive, f"worker processes left running: {alive}"
    tally(f"{victim} process killed mid-bundle", outcome=state, exit=process.returncode, lost=0)
    resume_completes(photos, out, new)


def _parent(pid: int) -> int:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


# --- a filesystem that fills up ---------------------------------------------------------------


@pytest.fixture
def small_filesystem(tmp_path, old, new):
    """A tmpfs (root only) with room for the previous dataset and half the new one, mounted at
    tmp_path/disk; unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    room = sum(map(len, old.values())) + sum(map(len, new["files"].values())) // 2
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={room // 1024}k", "tmpfs", str(disk)],
        capture_output=True,
    )
    if mounted.returncode:
        yield None
        return
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_disk_fails_with_one_line_and_leaves_the_previous_dataset(
    photos, small_filesystem, tmp_path, old, new
):
    if small_filesystem is None:
        pytest.skip("cannot mount a tmpfs here (not root); see docs/design.md")
    out = small_filesystem / "out"
    _place(old, out)  # the new dataset cannot be staged beside it
    result = convert(photos, out, "--overwrite", check=False)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    disk = re.escape(str(small_filesystem))
    assert re.match(
        rf"recordforge: failed: out of disk space while writing .* at {disk}/\S+; "
        rf"{re.escape(str(out))} is as it was; ",
        lines[-1],
    ), lines[-1]
    assert check_invariant(out, old, new) == "old"
    tally("disk full (small tmpfs)", outcome="old", lost=0)
    # With room again (the filesystem grown), a rerun completes.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_filesystem)], check=True)
    resume_completes(photos, out, new)


# --- a Dask worker killed mid-run ---------------------------------------------------------------


def _writing_process(candidates: dict[int, list[int]], out: pathlib.Path) -> int | None:
    """Of `candidates` ({process group: its processes}), the group of a process that has a
    staged shard file open (it is writing that shard), else None."""
    parts = f"{out.parent}/.{out.name}.recordforge/parts/"
    for group, pids in candidates.items():
        for pid in pids:
            with contextlib.suppress(OSError):  # a process or file gone meanwhile
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    name = target.rsplit("/", 1)[-1]
                    if target.startswith(parts) and ".tfrecord-" in name:
                        if not name.endswith(".part.json"):
                            return group
    return None


def _dask_run_writing_a_shard(servers, tmp_path, photos, old, env=None):  # noqa: F811
    """A run over `old` on a scheduler and two workers (tests/test_runners.py), caught while a
    worker writes a shard once a first shard is staged: (the run's process, its output folder,
    the writing worker's process group: `dask worker`, the nanny, and the worker it started)."""
    from test_runners import dask_cluster

    port, (_, *workers) = dask_cluster(servers, tmp_path, env)
    groups = {w.process.pid: [w.process.pid, *_descendants(w.process.pid)] for w in workers}
    out = tmp_path / "run" / "out"
    # A shard is open only while it is written: on a loaded machine the scan of the workers'
    # files can miss every one, so a run not caught writing is not the test's case; it is
    # started again over the old dataset.
    for _ in range(3):
        shutil.rmtree(out.parent, ignore_errors=True)
        _place(old, out)
        process = _start(
            photos, out, "--runner", "dask", "--dask_client_address", f"127.0.0.1:{port}"
        )
        assert _wait_for_parts(process, out, 1), process.communicate()[1]
        writing = None
        while writing is None and process.poll() is None:
            writing = _writing_process(groups, out)
        if writing is not None:
            return process, out, writing
        process.communicate()
    raise AssertionError("three runs ended before a worker was seen writing a shard")


def _working_files(out: pathlib.Path) -> set[str]:
    work = out.parent / f".{out.name}.recordforge"
    return {str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()}


def test_a_stopped_dask_run_waits_for_its_running_tasks_before_it_cleans_up(
    photos,
    old,
    new,
    tmp_path,
    servers,  # noqa: F811  (the fixture imported above)
):
    """Cancelling a dask future does not stop a task that has started. A run stopped (SIGTERM)
    while a worker wrote a shard said 'nothing staged was kept' and let go of the folder, and
    the task went on writing its shard and part record into the working folder afterwards,
    where the next run could be working. The worker writing a shard is frozen (SIGSTOP) while
    the launcher is stopped and let go on 5 s later: the launcher must wait for its task, and
    nothing may appear in the working folder once it has exited.
    Shown to catch: a launcher that exits while its task still runs (part files appeared after
    its exit)."""
    process, out, writing = _dask_run_writing_a_shard(servers, tmp_path, photos, old)
    os.killpg(writing, signal.SIGSTOP)
    try:
        process.send_signal(signal.SIGTERM)
        # A launcher that does not wait for the task exits meanwhile; one that waits cannot.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    finally:
        os.killpg(writing, signal.SIGCONT)
    _, stderr = process.communicate(timeout=300)
    at_exit = _working_files(out)
    time.sleep(3)  # what a task left running would write meanwhile
    assert _working_files(out) == at_exit, stderr
    assert "Traceback" not in stderr, stderr
    assert process.returncode == 128 + signal.SIGTERM, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"recordforge: stopped by SIGTERM; {out} is as it was; "), stderr
    if last.endswith("nothing staged was kept"):
        assert not any(".tfrecord-" in name for name in at_exit), (at_exit, stderr)
    assert check_invariant(out, old, new) == "old"
    resume_completes(photos, out, new)


def test_a_dask_run_whose_scheduler_is_lost_fails_in_one_line_and_keeps_the_dataset(
    photos,
    old,
    new,
    tmp_path,
    servers,  # noqa: F811  (the fixture imported above)
):
    """The scheduler killed once the run has staged a shard: one line saying so, exit 1, the
    previous dataset as it was, and a rerun completes. Shown to catch: the lost scheduler
    reported as a traceback, followed by the dask client's own reconnection errors."""
    from test_runners import dask_cluster

    port, (scheduler, *_) = dask_cluster(servers, tmp_path)
    out = tmp_path / "run" / "out"
    _place(old, out)
    process = _start(photos, out, "--runner", "dask", "--dask_client_address", f"127.0.0.1:{port}")
    assert _wait_for_parts(process, out, 1), process.communicate()[1]
    os.killpg(scheduler.process.pid, signal.SIGKILL)
    _, stderr = process.communicate(timeout=300)
    lines = stderr.strip().splitlines()
    assert process.returncode == 1, stderr
    assert re.match(
        r"recordforge: failed: the runner lost its Dask scheduler \(FutureCancelledError: .*"
        rf"scheduler-connection-lost.*\); {re.escape(str(out))} is as it was; ",
        lines[-1],
    ), stderr
    progress = ("recordforge: converting", "recordforge: progress", "recordforge: wrote")
    assert all(line.startswith(progress) for line in lines[:-1]), stderr
    assert check_invariant(out, old, new) == "old"
    resume_completes(photos, out, new)


@pytest.mark.parametrize("gives_up", [False, True], ids=["dask-retries", "dask-gives-up"])
def test_a_dask_worker_killed_while_writing_a_shard_leaves_old_or_new_and_resume_finishes(
    photos,
    old,
    new,
    tmp_path,
    servers,  # noqa: F811  (the fixture imported above)
    gives_up,
):
    """A scheduler and two workers on 127.0.0.1 (as in tests/test_runners.py); once the run has
    staged its first shard, the worker that is writing a shard is killed, its whole process
    group (its nanny too). By default Dask runs the lost worker's tasks again on the other one:
    the run must succeed with the new dataset, byte for byte. With allowed-failures=0
    (`gives_up`) Dask gives the task up: the run must fail with one line and leave the previous
    dataset byte for byte. Either way `--resume` then completes.
    Shown to catch: a retry appending to the killed attempt's shard file; a swallowed KilledWorker.
    """
    from test_runners import server_env

    env = server_env()
    if gives_up:  # a task whose worker dies while it runs it is not run again
        env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = "0"
    process, out, writing = _dask_run_writing_a_shard(servers, tmp_path, photos, old, env)
    os.killpg(writing, signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)
    state = check_invariant(out, old, new)
    tally("a Dask worker killed mid-run", outcome=state, exit=process.returncode, lost=0)
    assert "Traceback" not in stderr, stderr
    outcome = f"exit status {process.returncode}, the {state} dataset in place; stderr:\n{stderr}"
    if not gives_up:
        assert (process.returncode, state) == (0, "new"), outcome
    else:
        assert (process.returncode, state) == (1, "old"), outcome
        lines = stderr.strip().splitlines()
        assert re.match(
            r"recordforge: failed: the runner lost a worker process \(KilledWorker: .*\); "
            rf"{re.escape(str(out))} is as it was; ",
            lines[-1],
        ), stderr
        # Besides progress, it may say it waits for its tasks still running on the other worker.
        said = ("recordforge: converting", "recordforge: progress", "recordforge: wrote")
        said += ("recordforge: waiting for",)
        assert all(line.startswith(said) for line in lines[:-1]), stderr
    resume_completes(photos, out, new)
