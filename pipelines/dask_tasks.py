"""What the Dask runner runs on the workers: a stage over a partition, picks, side inputs."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pickle
import threading

import apache_beam as beam
from apache_beam import DoFn
from apache_beam.transforms.window import GlobalWindow
from dask.sizeof import sizeof

from recordforge.pipelines.dask_metrics import TaskMetrics
from recordforge.pipelines.dask_plan import GROUP, SPREAD, Step
from recordforge.transforms.core.records import SpilledPiece
from recordforge.transforms.internals import (
    DoFnContext,
    DoFnInvoker,
    DoFnSignature,
    OutputHandler,
    Receiver,
    SideInputMap,
    WindowedValue,
)


class _ListReceiver(Receiver):
    def __init__(self, values: list) -> None:
        self.values = values

    def receive(self, windowed_value: WindowedValue) -> None:
        self.values.append(windowed_value.value)


class _TaggedReceivers(dict):
    def __init__(self, outputs: dict) -> None:
        super().__init__()
        self._outputs = outputs

    def __missing__(self, tag):
        # A tag the transform did not declare is dropped, as Beam drops it.
        self[tag] = _ListReceiver(self._outputs.get(tag, []))
        return self[tag]


def _windowed(value) -> WindowedValue:
    return WindowedValue(value, 0, (GlobalWindow(),))


def _run_bundle(step: Step, items: list, side_values: list, side_views: list) -> dict:
    """One DoFn over one partition as one Beam bundle; its outputs by tag, in emission order."""
    outputs = {tag: [] for tag in step.outputs}
    receivers = _TaggedReceivers(outputs)
    handler = OutputHandler(
        window_fn=None,
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )
    side_inputs = [
        SideInputMap(*side_views[i], [_windowed(v) for v in side_values[i]]) for i in step.sides
    ]
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(step.fn),
        handler,
        context=DoFnContext(step.label, state=None),
        side_inputs=side_inputs,
        input_args=list(step.args),
        input_kwargs=step.kwargs,
        user_state_context=None,
        bundle_finalizer_param=DoFn.BundleFinalizerParam(),
    )
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(_windowed(item))
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return outputs


@dataclasses.dataclass
class Program:
    """What a stage's tasks run (pickled into each task: DoFns are a few KB each)."""

    steps: list[Step]
    side_views: list
    exports: tuple[int, ...]
    splits: tuple  # (exchange id, local, kind)
    topic: str | None  # the run's metrics events
    index_topic: str | None  # the run's exchange indexes, for the launcher
    run: str = ""  # the run's id, by which `running_stage_tasks` counts its tasks


# A spilled piece weighs what it parked, not its reference: the shards that exchanges balance
# (and dask's memory accounting) see the records' bytes.
sizeof.register(SpilledPiece)(lambda piece: piece.length)

# An exchange's index lists each producer's key hashes up to this many keys; beyond, keys are
# dealt to partitions by hash and only their number matters.
_INDEX_KEYS = 256
_KEY_CODER = None


def _key_bytes(key) -> bytes:
    """A key's identity across processes: its deterministic Beam encoding (what Beam's own
    shuffles group by), pickled for types that encoding does not cover."""
    global _KEY_CODER
    if _KEY_CODER is None:
        _KEY_CODER = beam.coders.FastPrimitivesCoder().as_deterministic_coder("GroupByKey")
    try:
        return _KEY_CODER.encode(key)
    except Exception:  # noqa: BLE001  (any type the coder refuses)
        return b"\xff" + pickle.dumps(key, protocol=5)


def _key_hash(encoded: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=8).digest(), "big")


def _group(elements: list) -> dict:
    """(key, value) pairs grouped: {key hash: {encoded key: (key, [values])}}."""
    groups: dict = {}
    for key, value in elements:
        encoded = _key_bytes(key)
        bucket = groups.setdefault(_key_hash(encoded), {})
        group = bucket.get(encoded)
        if group is None:
            bucket[encoded] = (key, [value])
        else:
            group[1].append(value)
    return groups


# The stage tasks running in this worker process, by run id. Cancelling a dask future does not
# stop a task that has started: a stopped run's launcher asks the workers for these
# (`running_stage_tasks`) and waits for them before it cleans up, so that no task of it writes
# into the output's working folder after the run has ended.
_RUNNING: collections.Counter = collections.Counter()
_RUNNING_LOCK = threading.Lock()


def running_stage_tasks(run: str) -> int:
    """How many stage tasks of `run` this worker process is running (Client.run asks it)."""
    with _RUNNING_LOCK:
        return _RUNNING[run]


def run_stage(program: Program, source, *side_values) -> dict:
    """One task: the stage's steps over one partition; returns the exported collections and
    the exchanges' inputs, grouped (`_group`) or as they are (a Reshuffle). The exchanges'
    indexes go to the launcher as an event, sooner than a task of their own would."""
    with _RUNNING_LOCK:
        _RUNNING[program.run] += 1
    try:
        return _run_stage(program, source, *side_values)
    finally:
        with _RUNNING_LOCK:
            _RUNNING[program.run] -= 1
            if not _RUNNING[program.run]:
                del _RUNNING[program.run]


def _run_stage(program: Program, source, *side_values) -> dict:
    collections = {0: _input_of(source)}
    side_values = [
        value[1]["exports"][value[2]] if isinstance(value, tuple) else value
        for value in side_values
    ]
    last_read = {}
    for i, step in enumerate(program.steps):
        last_read[step.main] = i
    keep = set(program.exports) | {local for _, local, _ in program.splits}
    with TaskMetrics(program.topic) as metrics:
        for i, step in enumerate(program.steps):
            items = collections[step.main]
            if last_read.get(step.main) == i and step.main not in keep:
                del collections[step.main]  # read by no later step: freed as it is consumed
            with metrics.step(step.full_label):
                outputs = _run_bundle(step, items, side_values, program.side_views)
            for tag, local in step.outputs.items():
                collections[local] = outputs[tag]
    result = {
        "exports": {local: collections[local] for local in program.exports},
        "splits": {
            (exchange, local): _group(collections[local]) if kind == GROUP else collections[local]
            for exchange, local, kind in program.splits
        },
    }
    if program.splits and program.index_topic is not None:
        import distributed

        try:
            worker = distributed.get_worker()
        except ValueError:  # not on a dask worker: the launcher asks with a task instead
            return result
        index = [(split, exchange_index(result, split, kind)) for *split, kind in program.splits]
        event = {"task": worker.get_current_task(), "index": index, "size": sizeof(result)}
        worker.log_event(program.index_topic, event)
    return result


def _input_of(source) -> list:
    kind, parts = source
    if kind == "values":
        return parts
    if kind == "pieces":  # [(stage result, local)]
        return [value for result, local in parts for value in result["exports"][local]]
    parts = [_whole_split(part) if isinstance(part, tuple) else part for part in parts]
    if kind == SPREAD:  # [[element]]
        return [value for part in parts for value in part]
    merged: dict = {}  # GROUP: [{encoded key: (key, [values])}]
    for part in parts:
        for encoded, (key, values) in part.items():
            group = merged.get(encoded)
            if group is None:
                merged[encoded] = (key, list(values))
            else:
                group[1].extend(values)
    return list(merged.values())


def _whole_split(part: tuple):
    """("whole", producer's result, split): all of the producer's input to an exchange, taken
    without a pick (one output partition, small results)."""
    _, result, split = part
    data = result["splits"][split]
    if isinstance(data, list):
        return data
    return {encoded: group for groups in data.values() for encoded, group in groups.items()}


def exchange_index(result: dict, split, kind: str):
    """What the launcher needs to partition an exchange: each key hash with the size of its
    values (None when there are many keys), or the number of elements."""
    data = result["splits"][tuple(split)]
    if kind == GROUP:
        if len(data) > _INDEX_KEYS:
            return None
        return [(hashed, sizeof(list(groups.values()))) for hashed, groups in sorted(data.items())]
    return len(data)


def pick(result: dict, split: tuple, kind: str, share):
    """One producer's part of one output partition: the groups of the keys in `share`
    (("keys", hashes) or ("mod", partition, count)), or every `share[1]`-th element from
    `share[0]` (a Reshuffle)."""
    data = result["splits"][split]
    if kind == SPREAD:
        start, step = share
        return data[start::step]
    if share[0] == "mod":
        _, partition, count = share
        hashes = [hashed for hashed in data if hashed % count == partition]
    else:
        hashes = share[1]
    groups = {}
    for hashed in hashes:
        groups.update(data.get(hashed, {}))
    return groups


def side_input_values(locals_: list[int], *results) -> list:
    """A side input's values: every producing task's part, in order."""
    return [
        value
        for result, local in zip(results, locals_, strict=True)
        for value in result["exports"][local]
    ]


def warm_up() -> None:
    """Loads the modules a stage runs (Beam, recordforge's transforms) on a worker before its
    first task needs them."""
    import recordforge.transforms.convert  # noqa: F401
