"""`recordforge reshard` on one large TFRecord file: time and peak memory.

    python -m benchmarks.reshard --gb 3 --record-kb 100 [--gzip] [--workers 2] [--json PATH]

Generates (once, cached in --data-dir) one TFRecord file of tf.train.Examples of about
--record-kb each (an id, a label, a few floats, a bytes payload of varied size), runs
`recordforge reshard FILE --output OUT` in a fresh process while sampling the memory of its
process tree (benchmarks/measure.py), reads every output record back (both CRCs) and prints the
figures as JSON. The memory a run needs should follow the shard size (--max-shard-mb), not the
input's size: run it at two sizes to see.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import sys
import tempfile

from benchmarks.measure import count_output, run

MIB = 1 << 20


def generate(path: str, total_bytes: int, record_bytes: int, seed: int, compress: bool) -> int:
    """Write records until the file holds `total_bytes` of them; returns how many."""
    from recordforge.schemas import codec
    from recordforge.transforms.core.tfrecord.framing import frame_record

    rng = random.Random(seed)
    # Payloads are slices of one random block: varied, incompressible, cheap to make.
    block = rng.randbytes(4 * record_bytes + 4096)
    count = written = 0
    opener = gzip.open if compress else open
    with opener(path + ".part", "wb") as out:
        while written < total_bytes:
            size = rng.randint(record_bytes // 2, record_bytes * 3 // 2)
            start = rng.randrange(len(block) - size)
            features = {
                "id": ("int64", [count]),
                "label": ("int64", [rng.randrange(1000)]),
                "scores": ("float", [rng.random() for _ in range(4)]),
                "payload": ("bytes", [block[start : start + size]]),
            }
            framed = frame_record(codec.serialize(codec.build_example(features)))
            out.write(framed)
            written += len(framed)
            count += 1
    os.replace(path + ".part", path)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reshard")
    parser.add_argument("--gb", type=float, default=3.0, help="input size in GB (default 3)")
    parser.add_argument("--record-kb", type=float, default=100, help="mean record size, KB")
    parser.add_argument("--gzip", action="store_true", help="a gzip-compressed input")
    parser.add_argument("--max-shard-mb", type=float, default=200)
    parser.add_argument("--workers", type=int, default=0, help="FnApiRunner worker processes")
    parser.add_argument("--data-dir", default="benchmarks/data/reshard")
    parser.add_argument("--work-dir", help="where the output goes (default: a temporary folder)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    os.makedirs(args.data_dir, exist_ok=True)
    suffix = ".gz" if args.gzip else ""
    name = f"records-{args.gb:g}gb-{args.record_kb:g}kb-seed{args.seed}.tfrecord{suffix}"
    source = os.path.join(args.data_dir, name)
    meta_path = source + ".json"
    if not os.path.exists(source) or not os.path.exists(meta_path):
        print(f"generating {source} ...", file=sys.stderr)
        records = generate(
            source, int(args.gb * 1e9), int(args.record_kb * 1000), args.seed, args.gzip
        )
        with open(meta_path, "w") as f:
            json.dump({"records": records}, f)
    with open(meta_path) as f:
        expected = json.load(f)["records"]

    work = args.work_dir or tempfile.mkdtemp(prefix="rf-reshard-bench-")
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "recordforge",
        "reshard",
        source,
        "--output",
        out,
        "--max-shard-mb",
        str(args.max_shard_mb),
        "-q",
    ]
    if args.workers:
        command += [
            f"--direct_num_workers={args.workers}",
            "--direct_running_mode=multi_processing",
        ]
    measured = run(command, os.path.join(work, "reshard.log"), os.path.join(work, "report.json"))
    counted = count_output("recordforge", out)
    input_bytes = os.path.getsize(source)
    result = {
        "input": {"file": name, "bytes": input_bytes, "records": expected, "gzip": args.gzip},
        "max_shard_mb": args.max_shard_mb,
        "workers": args.workers,
        **measured.to_dict(),
        "output": counted,
        "records_per_s": round(expected / measured.wall_s, 1),
        "mb_per_s": round(input_bytes / MIB / measured.wall_s, 1),
    }
    result.pop("log", None)
    if measured.exit_code != 0 or counted.get("records") != expected:
        result["log"] = measured.log
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if measured.exit_code == 0 and counted.get("records") == expected else 1


if __name__ == "__main__":
    sys.exit(main())
