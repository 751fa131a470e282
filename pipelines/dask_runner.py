"""Beam pipelines on a dask.distributed cluster, as fused stages and one-step exchanges (Beam 2.77).

Beam's own DaskRunner (apache_beam/runners/dask) turns every transform into a dask.bag layer and
every GroupByKey into a bag shuffle. For a pipeline like recordforge's that made thousands of
tasks for a few thousand images (a shuffle's tasks grow with partitions², and a Flatten adds
its inputs' partitions up), and, before recordforge's fixes, mixed a multi-output DoFn's
outputs, dropped what `finish_bundle` emits, recomputed side inputs per task and computed only
the last branch. This runner keeps Beam's overrides (Create, Reshuffle, GroupByKey, Flatten as
placeholders) and translates the graph itself, as FnApiRunner does:

- **Stages.** Consecutive ParDos with no exchange between them run as one dask task per
  partition (a stage), each DoFn one bundle over the partition, outputs kept apart by tag. A
  ParDo reading a Flatten runs inside each of the Flatten's producers' stages. A ParDo joins its
  producer's stage unless one of its side inputs is computed from that stage (it would wait on
  itself); then it starts a stage of its own over the producer's partitions, where they are.
- **Exchanges.** A GroupByKey (its window reification is the identity in the global window) or
  a Reshuffle is one repartition: each producing task groups its output by key (the key's
  deterministic Beam encoding, as Beam's own shuffles group), a small index of the keys goes
  to the launcher, which then chooses the number of partitions from the data (one per key, up
  to `partitions` = 2 per worker thread or --dask_npartitions; a Reshuffle one per element up
  to the same) and sends each producer's groups for a partition in one small task.
- **Side inputs** are computed once per run, from the producing tasks' outputs, and handed to
  every task that reads them.
- Every stage runs, whether or not anything reads its outputs (Beam's computes only the last
  branch); nothing but the keys' indexes comes back to the launcher.

The launcher drives the run from a thread (`_Driver`): it submits each stage once its inputs
are known, and an exchange's consumers once its indexes are in; `wait_until_finish` waits for
every task and raises the first failure (a lost worker as dask's KilledWorker).

Beam's keeps no metrics; here each task counts into a metrics container per transform whose
counters reach the launcher while the job runs (pipelines/dask_metrics.py), so
`result.metrics()` works.

Like Beam's, it runs batch pipelines in the global window only, which is all recordforge uses.
The Beam internals it builds on come from recordforge.transforms.internals, which checks the
Beam release.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
import pickle
import queue
import threading
import uuid

import apache_beam as beam
from apache_beam import DoFn, pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.transforms.window import GlobalWindow
from dask.sizeof import sizeof

from recordforge.pipelines.dask_metrics import DaskMetrics, TaskCounters, TaskMetrics, new_topic
from recordforge.transforms.core.records import SpilledPiece
from recordforge.transforms.internals import (
    BeamDaskRunner,
    DaskCreate,
    DaskFlattenTransform,
    DaskGroupAlsoByWindow,
    DaskGroupByKeyOnly,
    DaskOptions,
    DaskReshuffle,
    DoFnContext,
    DoFnInvoker,
    DoFnSignature,
    OutputHandler,
    Receiver,
    SideInputMap,
    WindowedValue,
    dask_bag_kwargs,
    dask_overrides,
    side_input_view,
)

# Partitions per worker thread for an exchange's output and a Create: enough that the tasks of
# a stage even out over the workers, few enough that each is worth its scheduling.
PARTITIONS_PER_THREAD = 2


# --- the plan: stages, exchanges, where each PCollection is computed ------------------------


@dataclasses.dataclass
class _Step:
    """One ParDo inside a stage: its DoFn runs as one bundle over the stage's partition."""

    fn: DoFn
    label: str
    full_label: str
    args: tuple
    kwargs: dict
    main: int  # the local collection it reads
    sides: tuple[int, ...]  # indexes into the stage's side inputs
    outputs: dict  # output tag -> local collection


@dataclasses.dataclass(eq=False)
class _Stage:
    """Tasks that each run `steps` over one partition of the stage's input.

    Local collections are numbered within the stage; 0 is the input partition.
    """

    id: int
    name: str
    source: object  # _CreateSource | _ExchangeSource | _PiecesSource
    steps: list[_Step] = dataclasses.field(default_factory=list)
    sides: list = dataclasses.field(default_factory=list)  # side input PCollections
    side_views: list = dataclasses.field(default_factory=list)  # (view class, options) each
    exports: set[int] = dataclasses.field(default_factory=set)  # read by other stages
    splits: list = dataclasses.field(default_factory=list)  # (exchange id, local, kind)
    locals: int = 1

    def new_local(self) -> int:
        self.locals += 1
        return self.locals - 1


@dataclasses.dataclass(eq=False)
class _Piece:
    """A PCollection, or the part of one (a Flatten's inputs), computed in a stage."""

    stage: _Stage
    local: int


@dataclasses.dataclass
class _CreateSource:
    values: list


@dataclasses.dataclass
class _ExchangeSource:
    exchange: _Exchange


@dataclasses.dataclass
class _PiecesSource:
    """The partitions of other stages' collections, read where they are."""

    pieces: list[_Piece]


@dataclasses.dataclass(eq=False)
class _Exchange:
    id: int
    kind: str  # "group" (GroupByKey) or "spread" (Reshuffle)
    pieces: list[_Piece]


_GROUP, _SPREAD = "group", "spread"


def _short(full_label: str) -> str:
    """A transform's own name: `ListInputs/MatchFiles/ParDo(_MatchFilesFn)` -> `MatchFiles`."""
    parts = [p for p in full_label.split("/") if not p.startswith("ParDo(")] or [full_label]
    return parts[-1]


class _Planner(PipelineVisitor):
    """Turns the (overridden) pipeline into stages and exchanges, in topological order."""

    def __init__(self) -> None:
        self.stages: list[_Stage] = []
        self.exchanges: list[_Exchange] = []
        self._pieces: dict[int, list[_Piece]] = {}  # id(PCollection) -> where it is computed
        self._keep: list = []  # the PCollections keyed by id, kept alive while planning

    def _where(self, pcoll) -> list[_Piece]:
        return self._pieces[id(pcoll)]

    def _set(self, pcoll, pieces: list[_Piece]) -> None:
        self._keep.append(pcoll)
        self._pieces[id(pcoll)] = pieces

    def _new_stage(self, name: str, source) -> _Stage:
        stage = _Stage(len(self.stages), name, source)
        self.stages.append(stage)
        return stage

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [v for v in node.inputs if not isinstance(v, pvalue.PBegin)]
        outputs = node.outputs
        name = _short(node.full_label)
        if isinstance(transform, DaskCreate):
            stage = self._new_stage(name, _CreateSource(list(transform.values)))
            self._set(outputs[None], [_Piece(stage, 0)])
        elif isinstance(transform, DaskFlattenTransform):
            self._set(outputs[None], [p for v in inputs for p in self._where(v)])
        elif isinstance(transform, (DaskGroupByKeyOnly, DaskReshuffle)):
            kind = _GROUP if isinstance(transform, DaskGroupByKeyOnly) else _SPREAD
            exchange = _Exchange(len(self.exchanges), kind, self._where(inputs[0]))
            self.exchanges.append(exchange)
            for piece in exchange.pieces:
                piece.stage.splits.append((exchange.id, piece.local, kind))
            stage = self._new_stage(name, _ExchangeSource(exchange))
            self._set(outputs[None], [_Piece(stage, 0)])
        elif type(transform) is beam.ParDo and isinstance(
            transform.fn, beam.GroupByKey.ReifyWindows
        ):
            # In the global window a value's window is known: nothing to carry to the group.
            self._set(outputs[None], self._where(inputs[0]))
        elif type(transform) is beam.ParDo:
            self._pardo(node, self._where(inputs[0]))
        elif isinstance(transform, DaskGroupAlsoByWindow) or len(inputs) == 1:
            # The group is complete already (global window); as in Beam's, other primitives
            # pass their input on.
            for pcoll in outputs.values():
                self._set(pcoll, self._where(inputs[0]))
        else:
            raise NotImplementedError(
                f"the Dask runner cannot run {type(transform).__name__} ({node.full_label})"
            )

    def _pardo(self, node: AppliedPTransform, pieces: list[_Piece]) -> None:
        sides = [side.pvalue for side in node.side_inputs]
        side_pieces = [p for side in sides for p in self._where(side)]
        side_stages = {p.stage for p in side_pieces}
        fused = all(not self._reaches(side_stages, piece.stage) for piece in pieces)
        if not fused:
            # A side input is computed from the producer's stage: a stage of its own, over the
            # producer's partitions.
            for piece in pieces:
                piece.stage.exports.add(piece.local)
            stage = self._new_stage(_short(node.full_label), _PiecesSource(pieces))
            pieces = [_Piece(stage, 0)]
        results: dict = {tag: [] for tag in node.outputs}
        for piece in pieces:
            stage = piece.stage
            side_indexes = []
            for side, view in zip(sides, node.side_inputs, strict=True):
                if any(known is side for known in stage.sides):
                    side_indexes.append(next(i for i, s in enumerate(stage.sides) if s is side))
                else:
                    stage.sides.append(side)
                    stage.side_views.append(side_input_view(view))
                    side_indexes.append(len(stage.sides) - 1)
            # With placeholders where side inputs go, as Beam's DoFn invoker takes them.
            args, kwargs = node.transform.args, node.transform.kwargs
            step = _Step(
                fn=node.transform.fn,
                label=node.transform.label,
                full_label=node.full_label,
                args=tuple(args),
                kwargs=kwargs,
                main=piece.local,
                sides=tuple(side_indexes),
                outputs={tag: stage.new_local() for tag in node.outputs},
            )
            if not stage.steps:  # named after what it does, for dask's dashboard and task stream
                stage.name = _short(node.full_label)
            stage.steps.append(step)
            for tag, local in step.outputs.items():
                results[tag].append(_Piece(stage, local))
        for tag, pcoll in node.outputs.items():
            self._set(pcoll, results[tag])
        for side in sides:
            for piece in self._where(side):
                piece.stage.exports.add(piece.local)

    def _upstream(self, stage: _Stage) -> set[_Stage]:
        """The stages whose outputs `stage` reads: its input's and its side inputs'."""
        source = stage.source
        pieces = list(source.pieces) if isinstance(source, _PiecesSource) else []
        if isinstance(source, _ExchangeSource):
            pieces += source.exchange.pieces
        for side in stage.sides:
            pieces += self._where(side)
        return {p.stage for p in pieces}

    def _reaches(self, stages: set[_Stage], target: _Stage) -> bool:
        """Whether any of `stages` is `target` or reads (transitively) from it."""
        seen, todo = set(), list(stages)
        while todo:
            stage = todo.pop()
            if stage is target:
                return True
            if stage.id not in seen:
                seen.add(stage.id)
                todo.extend(self._upstream(stage))
        return False

    def side_pieces(self, pcoll) -> list[_Piece]:
        return self._where(pcoll)


# --- what runs on the workers ---------------------------------------------------------------


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


def _run_bundle(step: _Step, items: list, side_values: list, side_views: list) -> dict:
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
        SideInputMap(view_class, view_options, [_windowed(v) for v in side_values[i]])
        for i, (view_class, view_options) in ((i, side_views[i]) for i in step.sides)
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
class _Program:
    """What a stage's tasks run (pickled into each task: DoFns are a few KB each)."""

    steps: list[_Step]
    side_views: list
    exports: tuple[int, ...]
    splits: tuple  # (exchange id, local, kind)
    topic: str | None  # the run's metrics events
    index_topic: str | None  # the run's exchange indexes, for the launcher


# A spilled piece weighs what it parked, not its reference: the shards that exchanges balance
# (and dask's memory accounting) see the records' bytes.
sizeof.register(SpilledPiece)(lambda piece: piece.length)

# An exchange with one output partition takes its producers' results whole (no pick tasks)
# when together they are no larger than this.
_WHOLE_BYTES = 1 << 20
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


def _run_stage(program: _Program, source, *side_values) -> dict:
    """One task: the stage's steps over one partition; returns the exported collections and
    the exchanges' inputs, grouped (`_group`) or as they are (a Reshuffle). The exchanges'
    indexes go to the launcher as an event, sooner than a task of their own would."""
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
            (exchange, local): _group(collections[local]) if kind == _GROUP else collections[local]
            for exchange, local, kind in program.splits
        },
    }
    if program.splits and program.index_topic is not None:
        import distributed

        try:
            worker = distributed.get_worker()
        except ValueError:  # not on a dask worker: the launcher asks with a task instead
            return result
        index = [(split, _index(result, split, kind)) for *split, kind in program.splits]
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
    if kind == _SPREAD:  # [[element]]
        return [value for part in parts for value in part]
    merged: dict = {}  # _GROUP: [{encoded key: (key, [values])}]
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


def _index(result: dict, split, kind: str):
    """What the launcher needs to partition an exchange: each key hash with the size of its
    values (None when there are many keys), or the number of elements."""
    data = result["splits"][tuple(split)]
    if kind == _GROUP:
        if len(data) > _INDEX_KEYS:
            return None
        return [(hashed, sizeof(list(groups.values()))) for hashed, groups in sorted(data.items())]
    return len(data)


def _pick(result: dict, split: tuple, kind: str, share):
    """One producer's part of one output partition: the groups of the keys in `share`
    (("keys", hashes) or ("mod", partition, count)), or every `share[1]`-th element from
    `share[0]` (a Reshuffle)."""
    data = result["splits"][split]
    if kind == _SPREAD:
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


def _side(locals_: list[int], *results) -> list:
    """A side input's values: every producing task's part, in order."""
    return [
        value
        for result, local in zip(results, locals_, strict=True)
        for value in result["exports"][local]
    ]


def _warm_up() -> None:
    """Loads the modules a stage runs (Beam, recordforge's transforms) on a worker before its
    first task needs them."""
    import recordforge.transforms.convert  # noqa: F401


# --- the launcher's side ------------------------------------------------------------------


class _Driver(threading.Thread):
    """Submits the stages and exchanges as their inputs become known; holds every task.

    It waits on one queue: tasks done (their futures' callbacks) and exchange indexes (the
    tasks' events). An index that has not come by the time its task is done is asked for with
    a task.
    """

    def __init__(
        self, client, threads: dict, planner: _Planner, partitions: int, partition_size, topic: str
    ):
        super().__init__(name="recordforge-dask", daemon=True)
        self._client = client
        # One entry per worker thread ({address: threads}), workers in turn: where new
        # partitions go.
        self._slots = [
            address
            for turn in range(max(threads.values(), default=0))
            for address in sorted(threads)
            if threads[address] > turn
        ] or [None]
        self._planner = planner
        self._partitions = partitions
        self._partition_size = partition_size
        self._topic = topic
        self._run = uuid.uuid4().hex[:12]
        self._index_topic = f"recordforge-index-{self._run}"
        self._queue: queue.Queue = queue.Queue()
        self._results: dict[int, list] = {}  # stage id -> its tasks' futures
        self._tasks: dict[str, tuple[_Stage, int]] = {}  # a stage task's key -> (stage, task)
        self._index_tasks: dict[str, tuple] = {}  # an index task's key -> (stage, task, split)
        self._exchange_parts: dict[int, list[list]] = {}  # exchange id -> per partition picks
        self._indexes: dict[int, dict] = {}  # exchange id -> {(piece, task): index}
        self._sides: dict[int, object] = {}  # id(PCollection) -> the side input's future
        self._sizes: dict[str, int] = {}  # a stage task's key -> its result's size (bytes)
        self._futures: list = []
        self._finished = 0
        self._lock = threading.Lock()
        self._stopped = False
        self.error: BaseException | None = None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            futures = list(self._futures)
        self._client.cancel(futures)
        self._queue.put(("stopped", None))

    def run(self) -> None:
        self._client.subscribe_topic(self._index_topic, self._index_event)
        try:
            self._drive()
        except BaseException as error:  # noqa: BLE001  (handed to wait_until_finish)
            self.error = error
            with self._lock:
                futures = list(self._futures)
            self._client.cancel(futures)
        finally:
            self._client.unsubscribe_topic(self._index_topic)

    def _index_event(self, event) -> None:
        self._queue.put(("index", event[1]))

    def _submit(
        self, name: str, function, *args, stage: _Stage | None = None, task: int = 0, where=None
    ):
        with self._lock:
            if self._stopped:
                raise RuntimeError("the run was cancelled")
            key = f"{name}-{self._run}-{len(self._futures)}"
            if stage is not None:
                self._tasks[key] = (stage, task)
            placed = {"workers": [where], "allow_other_workers": True} if where else {}
            future = self._client.submit(function, *args, key=key, pure=False, **placed)
            self._futures.append(future)
        future.add_done_callback(lambda done: self._queue.put(("done", done)))
        return future

    def _drive(self) -> None:
        stages = list(self._planner.stages)
        while True:
            for stage in list(stages):
                if self._ready(stage):
                    self._submit_stage(stage)
                    stages.remove(stage)
            if not stages:
                break
            self._handle(*self._queue.get())
        while self._finished < len(self._futures):
            self._handle(*self._queue.get())
        with self._lock:  # the run is over: its results may leave the workers' memory
            self._futures.clear()
        self._results.clear()
        self._sides.clear()

    def _handle(self, kind: str, item) -> None:
        if kind == "stopped":
            raise RuntimeError("the run was cancelled")
        if kind == "index":
            where = self._tasks.get(item["task"])
            if where is not None:
                self._sizes[item["task"]] = item["size"]
                for split, index in item["index"]:
                    self._add_index(*where, tuple(split), index)
            return
        future = item
        self._finished += 1
        if future.status != "finished":
            future.result()  # raises the task's error (KilledWorker for a lost worker)
            raise RuntimeError(f"a dask task was {future.status}")
        asked = self._index_tasks.pop(future.key, None)
        if asked is not None:
            self._add_index(*asked, future.result())
            return
        where = self._tasks.get(future.key)
        if where is None:
            return
        stage, task = where
        for exchange_id, local, kind in stage.splits:
            if not self._has_index(stage, task, exchange_id, local):
                # Its event has not come (not on a dask worker?): a task asks.
                index = self._submit("index", _index, future, (exchange_id, local), kind)
                self._index_tasks[index.key] = (stage, task, (exchange_id, local))

    def _has_index(self, stage: _Stage, task: int, exchange_id: int, local: int) -> bool:
        exchange = self._planner.exchanges[exchange_id]
        known = self._indexes.get(exchange_id, {})
        return exchange_id in self._exchange_parts or all(
            (n, task) in known
            for n, piece in enumerate(exchange.pieces)
            if piece.stage is stage and piece.local == local
        )

    def _add_index(self, stage: _Stage, task: int, split: tuple, index) -> None:
        exchange_id, local = split
        if exchange_id in self._exchange_parts:
            return  # decided already (a task run again sends its index again)
        exchange = self._planner.exchanges[exchange_id]
        known = self._indexes.setdefault(exchange_id, {})
        for n, piece in enumerate(exchange.pieces):
            if piece.stage is stage and piece.local == local:
                known[(n, task)] = index
        positions = self._positions(exchange)
        if positions is not None and all(p in known for p in positions):
            self._exchange(exchange, [known[p] for p in positions])

    def _positions(self, exchange: _Exchange) -> list | None:
        """(piece, task) of each producing task, in order; None while some are not known."""
        if any(p.stage.id not in self._results for p in exchange.pieces):
            return None
        return [
            (n, task)
            for n, piece in enumerate(exchange.pieces)
            for task in range(len(self._results[piece.stage.id]))
        ]

    def _ready(self, stage: _Stage) -> bool:
        source = stage.source
        pieces = []
        if isinstance(source, _ExchangeSource):
            if source.exchange.id not in self._exchange_parts:
                return False
        elif isinstance(source, _PiecesSource):
            pieces += source.pieces
        for side in stage.sides:
            pieces += self._planner.side_pieces(side)
        return all(p.stage.id in self._results for p in pieces)

    def _side_future(self, pcoll):
        future = self._sides.get(id(pcoll))
        if future is None:
            pairs = [
                (result, piece.local)
                for piece in self._planner.side_pieces(pcoll)
                for result in self._results[piece.stage.id]
            ]
            if len(pairs) == 1:
                # One producing task (a global combine's): its tasks take the value from its
                # result, without a task in between.
                future = ("whole", *pairs[0])
            else:
                locals_ = [local for _, local in pairs]
                future = self._submit("side", _side, locals_, *[r for r, _ in pairs])
            self._sides[id(pcoll)] = future
        return future

    def _submit_stage(self, stage: _Stage) -> None:
        source = stage.source
        if isinstance(source, _CreateSource):
            sources = [("values", chunk) for chunk in self._chunks(source.values)]
        elif isinstance(source, _ExchangeSource):
            kind = source.exchange.kind
            sources = [(kind, parts) for parts in self._exchange_parts[source.exchange.id]]
        else:
            sources = [
                ("pieces", [(result, piece.local)])
                for piece in source.pieces
                for result in self._results[piece.stage.id]
            ]
        program = _Program(
            steps=stage.steps,
            side_views=stage.side_views,
            exports=tuple(sorted(stage.exports)),
            splits=tuple(stage.splits),
            topic=self._topic,
            index_topic=self._index_topic,
        )
        sides = [self._side_future(side) for side in stage.sides]
        # A new partitioning (an exchange's, a Create's) is dealt out over the workers' threads
        # (dask would run them where their inputs are: all on one worker after a one-task
        # stage); a stage over other stages' partitions runs where those are.
        spread = len(sources) > 1 and not isinstance(source, _PiecesSource)
        self._results[stage.id] = [
            self._submit(
                stage.name,
                _run_stage,
                program,
                source,
                *sides,
                stage=stage,
                task=i,
                where=self._slots[i % len(self._slots)] if spread else None,
            )
            for i, source in enumerate(sources)
        ]
        # Indexes that came before this stage's partners in an exchange were submitted.
        for exchange_id, _, _ in stage.splits:
            known = self._indexes.get(exchange_id)
            exchange = self._planner.exchanges[exchange_id]
            positions = self._positions(exchange)
            if known and positions is not None and all(p in known for p in positions):
                if exchange_id not in self._exchange_parts:
                    self._exchange(exchange, [known[p] for p in positions])

    def _producer_pairs(self, exchange: _Exchange) -> list:
        return [
            (result, (exchange.id, piece.local))
            for piece in exchange.pieces
            for result in self._results[piece.stage.id]
        ]

    def _exchange(self, exchange: _Exchange, index: list) -> None:
        """The exchange's output partitions, chosen from its data; each a list of picks."""
        producers = self._producer_pairs(exchange)
        if exchange.kind == _GROUP and any(keys is None for keys in index):
            shares = [("mod", j, self._partitions) for j in range(self._partitions)]
        elif exchange.kind == _GROUP:
            weights: dict[int, int] = {}
            for keys in index:
                for hashed, weight in keys:
                    weights[hashed] = weights.get(hashed, 0) + weight
            shares = [("keys", frozenset(keys)) for keys in self._balanced(weights)]
        else:
            count = self._count(sum(index))
            shares = [("deal", j, count) for j in range(count)]
        if len(shares) == 1 and self._small(producers):
            # All to one partition: the producers' results go whole, without picks.
            self._exchange_parts[exchange.id] = [
                [("whole", result, split) for result, split in producers]
            ]
            return
        if exchange.kind == _GROUP:
            parts = [
                [
                    self._submit("pick", _pick, result, split, _GROUP, share)
                    for result, split in producers
                ]
                for share in shares
            ]
        else:
            count = len(shares)
            parts = [[] for _ in range(count)]
            offset = 0
            for (result, split), size in zip(producers, index, strict=True):
                # This producer's element k goes to partition (offset + k) % count: elements
                # dealt out in turn, whoever produced them.
                for target in range(count):
                    start = (target - offset) % count
                    if start < size:
                        parts[target].append(
                            self._submit("pick", _pick, result, split, _SPREAD, (start, count))
                        )
                offset += size
        self._exchange_parts[exchange.id] = parts

    def _balanced(self, weights: dict[int, int]) -> list[list[int]]:
        """Keys (hashes) in partitions of about equal weight: one per key up to the partition
        count, else the heaviest first, each to the lightest partition."""
        count = self._count(len(weights))
        loads = [(0, j) for j in range(count)]
        shares: list[list[int]] = [[] for _ in range(count)]
        for hashed in sorted(weights, key=lambda h: (-weights[h], h)):
            load, j = heapq.heappop(loads)
            shares[j].append(hashed)
            heapq.heappush(loads, (load + weights[hashed], j))
        return shares

    def _small(self, producers: list) -> bool:
        sizes = [self._sizes.get(result.key) for result, _ in producers]
        return None not in sizes and sum(sizes) <= _WHOLE_BYTES

    def _count(self, items: int) -> int:
        if self._partition_size:
            return max(1, math.ceil(items / self._partition_size))
        return max(1, min(items, self._partitions))

    def _chunks(self, values: list) -> list[list]:
        count, n = self._count(len(values)), len(values)
        return [values[i * n // count : (i + 1) * n // count] for i in range(count)]


class DaskRunner(BeamDaskRunner):
    """Runs a batch pipeline on a dask.distributed cluster (--dask_client_address)."""

    # Read by pipelines/assembly.py: the graph is translated from the Python objects, so
    # Beam's proto round trip before a run (for runners it thinks are not portable) is skipped.
    test_runner_api = False

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist

        dask_options = options.view_as(DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_kwargs = dask_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        # Each worker loads Beam and recordforge's transforms while the launcher plans, rather
        # than when its first task arrives.
        ddist.fire_and_forget(
            [
                client.submit(_warm_up, key=f"warm-up-{uuid.uuid4().hex}", workers=[address])
                for address in client.nthreads()
            ]
        )
        pipeline.replace_all(dask_overrides())
        threads = client.nthreads()
        partitions = bag_kwargs.get("npartitions") or PARTITIONS_PER_THREAD * max(
            1, sum(threads.values())
        )
        topic = new_topic()
        counters = TaskCounters()
        # Subscribed before the work is sent: the scheduler forwards every event of the run.
        client.subscribe_topic(topic, counters.add)
        planner = _Planner()
        pipeline.visit(planner)
        driver = _Driver(
            client, threads, planner, partitions, bag_kwargs.get("partition_size"), topic
        )
        driver.start()
        return DaskRunnerResult(client, driver, counters)


class DaskRunnerResult(PipelineResult):
    """The run's state, its first failure, and its metrics (Beam's raises NotImplementedError):
    the counters of finished and running tasks, live while the run goes on."""

    def __init__(self, client, driver: _Driver, counters: TaskCounters) -> None:
        super().__init__(PipelineState.RUNNING)
        self.client = client
        self._driver = driver
        self.counters = counters

    def wait_until_finish(self, duration=None) -> str:
        self._driver.join(None if duration is None else duration / 1000)
        if self._driver.is_alive():
            return self._state
        if self._driver.error is not None:
            self._state = PipelineState.FAILED
            raise self._driver.error
        if self._state == PipelineState.RUNNING:
            self._state = PipelineState.DONE
        return self._state

    def cancel(self) -> str:
        self._state = PipelineState.CANCELLING
        self._driver.stop()
        self._driver.join()
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> DaskMetrics:
        return self.counters.results()
