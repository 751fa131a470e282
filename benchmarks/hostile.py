"""Figures for hostile inputs (README, "Reliability: hostile inputs"): fuzzing counts and the cost
of the writer's image checks.

    python -m benchmarks.hostile fuzz --images 20000 --csv 20000     # counts, as JSON
    python -m benchmarks.hostile cost --data-dir benchmarks/data     # µs per image, per check

`fuzz` damages valid images (every format the probe accepts) and CSV files the way the tests in
tests/test_fuzz_inputs.py do, from fixed seeds, and counts what happened: refused with a reason,
accepted (then decoded with TensorFlow, which must agree on the size and channels), or a crash
(any other exception: there must be none). `cost` times the checks the writer adds on the
benchmark's own images (benchmarks/datagen.py), CPU time, best of several passes.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import random
import sys
import time

from PIL import Image, ImageDraw

from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.integrity import check_pixels, check_structure
from recordforge.transforms.core.images.probe import probe_image_bytes
from recordforge.transforms.core.tables.rows import CsvEnd, read_csv_rows
from recordforge.transforms.core.tables.stream import CsvReadFailure

_MUTATIONS = ("flip", "random", "ff", "zero", "delete", "insert", "cut")


def _picture(fmt: str, mode: str, size: tuple[int, int], seed: int, **save) -> bytes:
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(8):
        x, y = rng.randrange(size[0] - 1), rng.randrange(size[1] - 1)
        box = (x, y, rng.randint(x + 1, size[0]), rng.randint(y + 1, size[1]))
        draw.rectangle(box, fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    image.convert(mode).save(out, fmt, **save)
    return out.getvalue()


def seed_images() -> list[tuple[str, bytes]]:
    cases = [
        ("JPEG", "RGB", {}),
        ("JPEG", "RGB", {"progressive": True}),
        ("JPEG", "L", {}),
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {"interlace": 1}),
        ("GIF", "P", {}),
        ("BMP", "RGB", {}),
        ("WEBP", "RGB", {}),
        ("WEBP", "RGBA", {"lossless": True}),
    ]
    return [
        (fmt.lower(), _picture(fmt, mode, (96, 64), i, **kw))
        for i, (fmt, mode, kw) in enumerate(cases)
    ]


def mutate(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(_MUTATIONS)
    size = rng.randint(1, 600)
    at = rng.randrange(len(data))
    out = bytearray(data)
    if kind == "flip":
        for _ in range(1 + size % 8):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind in ("random", "ff", "zero"):
        fill = {"random": rng.randbytes(size), "ff": b"\xff" * size, "zero": bytes(size)}[kind]
        out[at : at + size] = fill[: len(out) - at]
    elif kind == "delete":
        del out[at : at + size]
    elif kind == "insert":
        out[at:at] = rng.randbytes(size)
    else:
        del out[at:]
    return bytes(out)


def fuzz_images(count: int, seed: int = 0, keep: str | None = None) -> dict:
    """Counts what happens to `count` mutated images (and every cut of the seeds); `keep`: a
    folder where the inputs accepted wrongly are written, to look at or make tests of."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    rng = random.Random(seed)
    seeds = seed_images()
    counts: collections.Counter = collections.Counter()
    by_format: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    cut_inputs = [(fmt, data[:cut]) for fmt, data in seeds for cut in range(len(data) + 1)]
    mutants = ((fmt, mutate(data, rng)) for fmt, data in (rng.choice(seeds) for _ in range(count)))
    for number, (fmt, data) in enumerate([*cut_inputs, *mutants]):
        counts["tried"] += 1
        try:
            facts = probe_image_bytes(data)
            check_structure(data)
        except InputError:
            counts["refused"] += 1
            by_format[fmt]["refused"] += 1
            continue
        except Exception:  # noqa: BLE001  (what is counted: there must be none)
            counts["crashes"] += 1
            continue
        counts["accepted"] += 1
        by_format[fmt]["accepted"] += 1
        try:
            shape = tuple(tf.io.decode_image(data, expand_animations=False).shape)
        except tf.errors.InvalidArgumentError:
            counts["accepted_but_tensorflow_fails"] += 1
            _keep(keep, f"tf_{number}.{fmt}", data)
            continue
        if shape != (facts.height, facts.width, facts.channels):
            counts["accepted_with_other_facts"] += 1
            _keep(keep, f"facts_{number}.{fmt}", data)
    keys = ("tried", "refused", "accepted", "crashes", "accepted_but_tensorflow_fails")
    keys += ("accepted_with_other_facts",)
    return {
        "inputs": {key: counts[key] for key in keys},  # every count, 0 included
        "cut_at_every_offset": len(cut_inputs),
        "by_format": {fmt: dict(c) for fmt, c in sorted(by_format.items())},
    }


def _keep(folder: str | None, name: str, data: bytes) -> None:
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


_CSV_SCHEMA = CsvSchema(
    (
        ColumnSpec("id", "id", "int64"),
        ColumnSpec("x", "x", "float"),
        ColumnSpec("name", "name", "bytes"),
        ColumnSpec("tags", "tags", "int64", is_list=True),
    )
)
_CSV = b"id,x,name,tags\n" + b"".join(
    b'%d,%d.5,"name, %d\n""quoted""",1;%d\n' % (i, i, i, i)
    if i % 3 == 0
    else b"%d,%d,n%d,\n" % (i, i, i)
    for i in range(1, 40)
)
_CSV_PIECES = [b'"', b",", b"\n", b"\r", b";", b"\x00", b"\xff", b"a", b"1", b"\xef\xbb\xbf"]


def fuzz_csv(count: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    inputs = [_CSV[:cut] for cut in range(len(_CSV) + 1)]
    for _ in range(count):
        data = bytearray(_CSV)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(data) + 1)
            piece = rng.choice(_CSV_PIECES) * rng.randint(1, 3)
            action = rng.choice(("insert", "delete", "replace", "cut"))
            if action == "insert":
                data[at:at] = piece
            elif action == "delete":
                del data[at : at + rng.randint(1, 20)]
            elif action == "replace":
                data[at : at + len(piece)] = piece
            else:
                del data[at:]
        inputs.append(bytes(data))
    for data in inputs:
        counts["tried"] += 1
        try:
            *items, end = read_csv_rows(
                io.BytesIO(data), _CSV_SCHEMA, source_name="f", block_size=64
            )
        except InputError:
            counts["file_refused"] += 1
            continue
        except CsvReadFailure as failure:
            counts["disagreements" if "where the file holds" in failure.reason else "stopped"] += 1
            continue
        except Exception:  # noqa: BLE001
            counts["crashes"] += 1
            continue
        counts["read_to_the_end"] += 1
        counts["rows"] += len(items)
        counts["row_errors"] += sum(1 for item in items if hasattr(item, "error"))
        if not isinstance(end, CsvEnd) or end.rows != len(items):
            counts["rows_lost"] += 1
    keys = ("tried", "file_refused", "read_to_the_end", "stopped", "crashes", "disagreements")
    keys += ("rows", "row_errors", "rows_lost")
    return {"inputs": {key: counts[key] for key in keys}, "cut_at_every_offset": len(_CSV) + 1}


def cost(data_dir: str, passes: int = 5) -> dict:
    """µs of CPU per image for the probe, the structure checks and --check-pixels, by format,
    on the benchmark's generated photos."""
    photos = []
    for folder, _, names in os.walk(data_dir):
        if "/photos" in folder:
            for name in sorted(names):
                with open(os.path.join(folder, name), "rb") as f:
                    photos.append(f.read())
    if not photos:
        raise SystemExit(f"no benchmark photos under {data_dir}: run `python -m benchmarks` first")
    by_format = collections.defaultdict(list)
    for data in photos:
        by_format["png" if data.startswith(b"\x89PNG") else "jpeg"].append(data)
    result = {}
    for fmt, items in sorted(by_format.items()):
        items = items[:400]
        megabytes = sum(len(d) for d in items) / 1e6
        timings = {}
        for name, check in (
            ("probe", probe_image_bytes),
            ("structure", check_structure),
            ("pixels", check_pixels),
        ):
            best = float("inf")
            for _ in range(passes if name != "pixels" else 1):
                started = time.process_time()
                for data in items:
                    check(data)
                best = min(best, time.process_time() - started)
            timings[f"{name}_us_per_image"] = round(best / len(items) * 1e6, 1)
        result[fmt] = {"images": len(items), "mean_kb": round(megabytes * 1000 / len(items), 1)}
        result[fmt].update(timings)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fuzz = commands.add_parser("fuzz")
    fuzz.add_argument("--images", type=int, default=20_000)
    fuzz.add_argument("--csv", type=int, default=20_000)
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--keep", help="a folder for the images accepted wrongly")
    timing = commands.add_parser("cost")
    timing.add_argument("--data-dir", default="benchmarks/data")
    args = parser.parse_args(argv)
    if args.command == "fuzz":
        report = {
            "images": fuzz_images(args.images, args.seed, args.keep),
            "csv": fuzz_csv(args.csv, args.seed),
        }
    else:
        report = cost(args.data_dir)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
