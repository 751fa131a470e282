"""The benchmark: generate (or reuse) the data, run every method side by side, check, report.

    python -m benchmarks [--image-mb 300] [--csv-rows 1000000] [--repeats 3] [--large] ...

See benchmarks/README.md for what is measured and how to read the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

from benchmarks import datagen, measure, report
from benchmarks.dask_cluster import DaskCluster

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS_SCRIPT = os.path.join(HERE, "methods.py")
DEFAULT_DATA_DIR = os.path.join(HERE, "data")
DEFAULT_JSON = os.path.join(HERE, "results", "latest.json")
DASK = "recordforge-dask"


@dataclass(frozen=True)
class Method:
    key: str  # tutorial, beam, recordforge, recordforge-mp, recordforge-default, raw
    label: str
    kind: str  # "script" (a function in methods.py) or "recordforge"
    script: str = ""  # methods.py's method name
    beam_args: tuple[str, ...] = ()
    opt_in: bool = False  # run only when --methods names it


@dataclass
class Case:
    name: str  # images, csv, images-default (the default set, with --large)
    description: str
    source: str
    expected_records: int
    input_bytes: int
    methods: list[Method]
    dataset: dict
    results: dict = field(default_factory=dict)  # method key -> list of run dicts


# recordforge in this process, whatever it would choose by itself.
IN_PROCESS = ("--workers", "1")

# Images only: the same conversion with every image decoded, resized and re-encoded (issue 16).
RESIZE = ("--resize", "224x224")


def methods_for(kind: str, workers: int) -> list[Method]:
    multi = (f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing")
    resizing = []
    if kind == "images":
        size = RESIZE[1]
        resizing = [
            Method(
                "recordforge-resize",
                f"3 recordforge --resize {size}",
                "recordforge",
                "",
                (*IN_PROCESS, *RESIZE),
            ),
            Method(
                "recordforge-mp-resize",
                f"3 recordforge --resize {size}, {workers} processes",
                "recordforge",
                "",
                (*multi, *RESIZE),
            ),
        ]
    return [
        Method("tutorial", "1 tutorial way (Python loop)", "script", f"tutorial-{kind}"),
        Method("beam", "2 naive Beam pipeline", "script", f"beam-{kind}"),
        Method("recordforge", "3 recordforge, in-process", "recordforge", "", IN_PROCESS),
        Method("recordforge-mp", f"3 recordforge, {workers} processes", "recordforge", "", multi),
        # No runner option: where it runs is recordforge's choice (pipelines/local_workers.py).
        Method("recordforge-default", "3 recordforge, default (chosen)", "recordforge"),
        # `--runner dask` on a scheduler and `workers` one-thread workers the harness starts on
        # 127.0.0.1 (benchmarks/dask_cluster.py); the address is added when it runs.
        Method(
            "recordforge-dask",
            f"3 recordforge, Dask, {workers} workers",
            "recordforge",
            opt_in=True,
        ),
        *resizing,
        Method("raw", "4 raw limit (read + frame)", "script", f"raw-{kind}"),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark recordforge against the tutorial way, a naive Beam pipeline and "
        "the raw read-and-frame limit, on generated images and a generated CSV.",
    )
    parser.add_argument("--image-mb", type=float, default=300, help="image set size (MB, 10^6)")
    parser.add_argument(
        "--large",
        action="store_true",
        help="use the large image set (--large-image-mb) and also run recordforge on the "
        "default set, to compare peak memory",
    )
    parser.add_argument("--large-image-mb", type=float, default=3000)
    parser.add_argument(
        "--csv-rows",
        type=int,
        default=1_000_000,
        help="CSV data rows (the issue's size)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", choices=("images", "csv"), help="run one case only (default: both)"
    )
    parser.add_argument(
        "--methods",
        help="comma-separated subset of tutorial,beam,recordforge,recordforge-mp,"
        "recordforge-default,recordforge-resize,recordforge-mp-resize (images only),raw; and "
        "recordforge-dask (only when named: a Dask cluster of --workers one-thread workers on "
        "127.0.0.1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="recordforge's multi-process worker count, and the Dask cluster's workers",
    )
    parser.add_argument(
        "--plan-files",
        type=int,
        default=0,
        help="also time `recordforge plan` on this many tiny image files (hard links)",
    )
    parser.add_argument(
        "--plan-rows",
        type=int,
        default=1_000_000,
        help="time `recordforge plan` on a CSV of this many rows (0: don't)",
    )
    parser.add_argument("--plan-repeats", type=int, default=1, help="runs of each plan timing")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="generated data (cached)")
    parser.add_argument(
        "--work-dir",
        help="where each run's output and log go, in a new folder removed at the end "
        "(default: DATA_DIR/runs)",
    )
    parser.add_argument("--keep-outputs", action="store_true", help="keep the converted data")
    parser.add_argument("--json", default=DEFAULT_JSON, help="where the JSON results go")
    return parser


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    selected = set(args.methods.split(",")) if args.methods else None
    known = {m.key for m in methods_for("images", args.workers)}
    if selected and not selected <= known:
        raise SystemExit(f"unknown methods: {', '.join(sorted(selected - known))}")
    args.data_dir = os.path.abspath(args.data_dir)
    os.makedirs(args.data_dir, exist_ok=True)
    parent = os.path.abspath(args.work_dir or os.path.join(args.data_dir, "runs"))
    os.makedirs(parent, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="bench-", dir=parent)

    machine = report.machine_facts()
    cases = _cases(args, selected)
    plan_sources = []  # (name, source, inputs)
    if args.plan_rows:
        plan_table = datagen.table(args.data_dir, args.seed, args.plan_rows, log=log)
        plan_sources.append(("csv", plan_table.path, plan_table.rows))
    if args.plan_files:
        folder = datagen.tiny_files(args.data_dir, args.plan_files, log=log)
        plan_sources.append(("tiny-files", folder, args.plan_files))
    for source in [c.source for c in cases] + [source for _, source, _ in plan_sources]:
        _warm_page_cache(source)

    total = args.repeats * sum(len(c.methods) for c in cases)
    done = 0
    with contextlib.ExitStack() as stack:
        cluster = None
        if any(m.key == DASK for c in cases for m in c.methods):
            cluster = stack.enter_context(DaskCluster(args.workers, work_dir, log=log))
        for repeat in range(args.repeats):
            for case in cases:
                # Rotate the order each repeat, so no method always runs first (or after
                # another).
                order = (
                    case.methods[repeat % len(case.methods) :]
                    + case.methods[: repeat % len(case.methods)]
                )
                for method in order:
                    done += 1
                    log(f"[{done}/{total}] {case.name}: {method.label} (repeat {repeat + 1})")
                    result = _run_method(case, method, repeat, work_dir, args.keep_outputs, cluster)
                    case.results.setdefault(method.key, []).append(result)
                    log(f"    {report.run_line(result)}")

    plans = [_time_plan(*source, args, work_dir) for source in plan_sources]

    results = report.build(
        cases=cases,
        plans=plans,
        machine=machine,
        config={
            "argv": sys.argv[1:] if argv is None else list(argv),
            "seed": args.seed,
            "image_mb": args.large_image_mb if args.large else args.image_mb,
            "default_image_mb": args.image_mb,
            "large": args.large,
            "csv_rows": args.csv_rows,
            "repeats": args.repeats,
            "plan_rows": args.plan_rows,
            "plan_files": args.plan_files,
            "plan_repeats": args.plan_repeats,
            "workers": args.workers,
            "methods": sorted(
                selected or {m.key for m in methods_for("images", args.workers) if not m.opt_in}
            ),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    )
    results["machine"]["load_average_after"] = list(os.getloadavg())
    print(report.table(results))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nJSON: {args.json}")
    if not args.keep_outputs:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if results["complete"] else 1


def _cases(args, selected: set[str] | None) -> list[Case]:
    cases = []

    def keep(methods: list[Method]) -> list[Method]:
        return [m for m in methods if (not m.opt_in if selected is None else m.key in selected)]

    if args.only in (None, "images"):
        sets = [("images", args.large_image_mb if args.large else args.image_mb)]
        if args.large:
            sets.append(("images-default", args.image_mb))
        for name, megabytes in sets:
            images = datagen.images(args.data_dir, args.seed, megabytes, log=log)
            methods = keep(methods_for("images", args.workers))
            if name == "images-default":
                methods = [m for m in methods if m.kind == "recordforge"]
            cases.append(
                Case(
                    name=name,
                    description=(
                        f"{images.files:,} images ({images.jpeg:,} JPEG, {images.png:,} PNG) in "
                        f"{images.classes} class folders, {images.bytes / 1e6:,.1f} MB, "
                        f"{images.bytes / images.files / 1e3:,.0f} KB on average"
                    ),
                    source=images.folder,
                    expected_records=images.files,
                    input_bytes=images.bytes,
                    methods=methods,
                    dataset={"kind": "images", "folder": images.folder, **images.meta},
                )
            )
    if args.only in (None, "csv"):
        table = datagen.table(args.data_dir, args.seed, args.csv_rows, log=log)
        cases.append(
            Case(
                name="csv",
                description=(
                    f"{table.rows:,} rows x {table.meta['columns']} columns, "
                    f"{table.bytes / 1e6:,.1f} MB, {table.meta['empty_cells']:,} empty cells"
                ),
                source=table.path,
                expected_records=table.rows,
                input_bytes=table.bytes,
                methods=keep(methods_for("csv", args.workers)),
                dataset={"kind": "csv", "path": table.path, **table.meta},
            )
        )
    return [c for c in cases if c.methods]


def _warm_page_cache(source: str) -> None:
    """Read every input once, so that no method pays for the first read from disk."""
    paths = [source] if os.path.isfile(source) else []
    for root, _, files in os.walk(source):
        paths += [os.path.join(root, name) for name in files]
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def _settle_disk() -> None:
    """Write back what earlier methods left dirty in the page cache, before the next one starts.

    Otherwise a method pays for the write-back of the gigabytes the method before it wrote
    (the kernel flushes dirty pages after 30 s or past a share of memory, whoever made them),
    and its figure depends on which method ran just before it.
    """
    os.sync()


def _run_method(
    case: Case,
    method: Method,
    repeat: int,
    work_dir: str,
    keep: bool,
    cluster: DaskCluster | None = None,
) -> dict:
    name = f"{case.name}-{method.key}-r{repeat + 1}"
    output = os.path.join(work_dir, name)
    report_path = os.path.join(work_dir, name + ".report.json")
    log_path = os.path.join(work_dir, name + ".log")
    on_cluster = method.key == DASK
    if method.kind == "recordforge":
        args = ["convert", case.source, "--output", output, *method.beam_args]
        if on_cluster:
            args += ["--runner", "dask", "--dask_client_address", cluster.address]
        command = [sys.executable, METHODS_SCRIPT, "recordforge", "--report", report_path, *args]
        shown = ["recordforge", *args]
    else:
        command = [
            sys.executable,
            METHODS_SCRIPT,
            method.script,
            "--input",
            case.source,
            "--output",
            output,
            "--report",
            report_path,
        ]
        shown = ["python", "benchmarks/methods.py", *command[2:]]
    _settle_disk()
    load = os.getloadavg()[0]
    cluster_cpu = cluster.cpu_s() if on_cluster else 0.0
    run = measure.run(command, log_path, report_path, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    on_cluster_facts = {}
    if on_cluster:
        # The scheduler's and workers' CPU is the run's too, though not in its process tree.
        cluster_cpu = round(cluster.cpu_s() - cluster_cpu, 3)
        on_cluster_facts = {
            "launcher_cpu_s": run.cpu_s,
            "cluster_cpu_s": cluster_cpu,
            "cluster_rss_mb": round(cluster.rss_mb(), 1),
            "first_on_cluster": cluster.runs == 0,
        }
        run.cpu_s = round(run.cpu_s + cluster_cpu, 3)
        cluster.runs += 1
    counted = measure.count_output(method.kind, output) if run.exit_code == 0 else {}
    problems = []
    if run.exit_code != 0:
        problems.append(f"exit status {run.exit_code}")
    elif counted.get("error"):
        problems.append(counted["error"])
    elif counted.get("records") != case.expected_records:
        problems.append(f"wrote {counted.get('records')} records, expected {case.expected_records}")
    elif (
        case.dataset["kind"] == "images"
        and RESIZE[0] not in method.beam_args
        and counted["payload_bytes"] < case.input_bytes
    ):
        # Every record embeds its image's bytes: records that hold less lost something (resized
        # images are smaller: their count is checked).
        problems.append(
            f"records hold {counted['payload_bytes']:,} bytes, less than the "
            f"{case.input_bytes:,} bytes of the images"
        )
    result = run.to_dict()
    if not problems:
        result.pop("log")
    result.update(
        command=shown,
        repeat=repeat + 1,
        load_1m_before=round(load, 2),
        records=counted.get("records"),
        payload_bytes=counted.get("payload_bytes"),
        output_files=counted.get("files"),
        expected_records=case.expected_records,
        complete=not problems,
        problem="; ".join(problems) or None,
        # Unrounded: on a minute dataset a rounded MB/s is 0.0 and its ratio is lost.
        records_per_s=case.expected_records / run.wall_s,
        mb_per_s=case.input_bytes / 1e6 / run.wall_s,
        **on_cluster_facts,
    )
    if run.startup_s is not None and run.wall_s > run.startup_s:
        # Informational: the throughput once the interpreter and imports are ready.
        result["mb_per_s_after_startup"] = case.input_bytes / 1e6 / (run.wall_s - run.startup_s)
    if not keep:
        shutil.rmtree(output, ignore_errors=True)
    return result


def _time_plan(name: str, source: str, expected: int, args, work_dir: str) -> dict:
    runs = []
    for repeat in range(args.plan_repeats):
        log(f"plan on {name} ({expected:,} inputs), repeat {repeat + 1}")
        base = os.path.join(work_dir, f"plan-{name}-r{repeat + 1}")
        _settle_disk()
        command = [
            sys.executable,
            METHODS_SCRIPT,
            "recordforge",
            "--report",
            base + ".report.json",
            "plan",
            source,
            "--json",
        ]
        run = measure.run(command, base + ".log", base + ".report.json", stdout=base + ".json")
        seen = None
        try:
            with open(base + ".json") as f:
                seen = json.load(f).get("num_inputs")
        except (OSError, ValueError):
            pass
        result = run.to_dict()
        complete = run.exit_code == 0 and seen == expected
        if complete:
            result.pop("log")
        result.update(
            repeat=repeat + 1,
            num_inputs=seen,
            expected_inputs=expected,
            complete=complete,
            problem=None if complete else f"exit {run.exit_code}, {seen} inputs seen",
        )
        log(f"    {report.run_line(result)}")
        runs.append(result)
    return {
        "name": name,
        "source": source,
        "inputs": expected,
        "command": ["recordforge", "plan", source, "--json"],
        "runs": runs,
    }
