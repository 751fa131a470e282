"""How much of a killed run's work `--resume` skips (issue 14, requirement 4).

For each trial: an uninterrupted conversion (timed), then the same conversion SIGKILLed (its whole
process group) once a given fraction of its shards is staged, then `--resume` (timed). The
resumed dataset must be byte-identical to the uninterrupted one (apart from the manifest's
`created`). Reports the shards kept and the resume's time against a full run's.

    python -m benchmarks.resume --image-mb 40 --kill-at 0.7 --trials 3

Needs the `recordforge` program on PATH (or --program). Writes JSON to --json (default stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import datagen


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    for name in ("dataset_info.json", "recordforge.json"):
        if name in files:
            document = json.loads(files[name])
            document.pop("created", None)
            files[name] = json.dumps(document, sort_keys=True).encode()
    return files


def _staged(out: pathlib.Path) -> int:
    parts = out.parent / f".{out.name}.recordforge" / "parts"
    try:
        return sum(name.endswith(".part.json") for name in os.listdir(parts))
    except FileNotFoundError:
        return 0


def _timed(command: list[str]) -> float:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr}")
    return time.monotonic() - started


def _killed_at(command: list[str], out: pathlib.Path, shards: int) -> tuple[float, int]:
    """Run `command`, SIGKILL it once `shards` shards are staged; (seconds run, shards staged)."""
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    while process.poll() is None:
        if _staged(out) >= shards:
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    process.wait()
    if process.returncode != -signal.SIGKILL:
        sys.exit("the run ended before it was killed")
    return time.monotonic() - started, _staged(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-mb", type=float, default=40)
    parser.add_argument("--max-shard-mb", type=float, default=2)
    parser.add_argument("--kill-at", type=float, default=0.7, help="fraction of shards staged")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default="benchmarks/data")
    parser.add_argument("--program", default=shutil.which("recordforge") or "recordforge")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    images = datagen.images(args.data_dir, args.seed, args.image_mb, log=print)
    options = ["--name", "photos", "--splits", "train=0.8,validation=0.2"]
    options += ["--max-shard-mb", str(args.max_shard_mb), "--min-shard-mb", "0.1"]
    trials = []
    with tempfile.TemporaryDirectory() as scratch:
        for trial in range(args.trials):
            base = pathlib.Path(scratch) / str(trial)
            whole, out = base / "whole" / "out", base / "killed" / "out"
            command = [args.program, "convert", images.folder, *options]
            full = _timed([*command, "-o", str(whole)])
            info = json.loads((whole / "dataset_info.json").read_bytes())
            shards = sum(len(split["shards"]) for split in info["splits"].values())
            ran, staged = _killed_at([*command, "-o", str(out)], out, round(shards * args.kill_at))
            resumed = _timed([*command, "-o", str(out), "--resume"])
            if _files(out) != _files(whole):
                sys.exit("the resumed dataset differs from the uninterrupted one")
            trials.append(
                {
                    "shards": shards,
                    "staged_when_killed": staged,
                    "full_seconds": round(full, 2),
                    "killed_after_seconds": round(ran, 2),
                    "resume_seconds": round(resumed, 2),
                    "byte_identical": True,
                }
            )
            print(json.dumps(trials[-1]), file=sys.stderr)
    result = {
        "images": images.files,
        "image_bytes": images.bytes,
        "options": options,
        "kill_at": args.kill_at,
        "trials": trials,
    }
    text = json.dumps(result, indent=1) + "\n"
    if args.json:
        pathlib.Path(args.json).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
