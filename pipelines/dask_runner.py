"""The Dask runner: recordforge's translation of a Beam pipeline driven from the launcher."""

from __future__ import annotations

import heapq
import logging
import math
import queue
import threading
import time
import uuid

from apache_beam.runners.runner import PipelineResult, PipelineState

from recordforge.pipelines import dask_tasks
from recordforge.pipelines.dask_metrics import DaskMetrics, TaskCounters, new_topic
from recordforge.pipelines.dask_plan import (
    GROUP,
    SPREAD,
    CreateSource,
    Exchange,
    ExchangeSource,
    PiecesSource,
    Planner,
    Stage,
)
from recordforge.transforms.internals import (
    BeamDaskRunner,
    DaskOptions,
    dask_bag_kwargs,
    dask_overrides,
)

LOGGER = logging.getLogger("recordforge")
# How long a stopped or failed run waits for its tasks that had started to end on the workers.
RUNNING_TASKS_TIMEOUT = 300.0

# Partitions per worker thread for an exchange's output and a Create: enough that the tasks of
# a stage even out over the workers, few enough that each is worth its scheduling.
PARTITIONS_PER_THREAD = 2
# An exchange with one output partition takes its producers' results whole (no pick tasks)
# when together they are no larger than this.
_WHOLE_BYTES = 1 << 20


class _Driver(threading.Thread):
    """Drives a run from the launcher: submits each stage once its inputs are known, and an
    exchange's consumers once its indexes are in; holds every task.

    It waits on one queue: tasks done (their futures' callbacks) and exchange indexes (the
    tasks' events). An index that has not come by the time its task is done is asked for with
    a task. Every stage runs, whether or not anything reads its outputs (Beam's translation
    computes only the last branch); nothing but the exchanges' indexes comes back to the
    launcher. `DaskRunnerResult.wait_until_finish` waits for it and raises its first failure (a
    lost worker as dask's KilledWorker).
    """

    def __init__(
        self, client, threads: dict, planner: Planner, partitions: int, partition_size, topic: str
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
        self._tasks: dict[str, tuple[Stage, int]] = {}  # a stage task's key -> (stage, task)
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
            self.wait_for_running_tasks()
        finally:
            self._client.unsubscribe_topic(self._index_topic)

    def wait_for_running_tasks(self, timeout: float = RUNNING_TASKS_TIMEOUT) -> None:
        """Wait until no task of this run runs on the workers: a cancelled future's task that
        had started goes on (dask cannot stop it), and would write into the output's working
        folder after the launcher has cleaned it up and let another run take it."""
        deadline = time.monotonic() + timeout
        said = False
        while True:
            if self._client.status != "running":  # the scheduler is lost: it cannot be asked
                return
            try:
                running = sum(self._client.run(dask_tasks.running_stage_tasks, self._run).values())
            except Exception:  # noqa: BLE001  (the cluster is gone: no task of it runs on)
                return
            if not running:
                return
            if time.monotonic() > deadline:
                LOGGER.warning(
                    "%s of this run's tasks still run on the Dask workers after %.0f s; "
                    "they may write into the output's working folder until they end",
                    running,
                    timeout,
                )
                return
            if not said:
                LOGGER.warning(
                    "waiting for %s of this run's tasks to end on the Dask workers "
                    "(dask cannot stop a task that has started)",
                    running,
                )
                said = True
            time.sleep(0.1)

    def _index_event(self, event) -> None:
        self._queue.put(("index", event[1]))

    def _submit(
        self, name: str, function, *args, stage: Stage | None = None, task: int = 0, where=None
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
                index = self._submit(
                    "index", dask_tasks.exchange_index, future, (exchange_id, local), kind
                )
                self._index_tasks[index.key] = (stage, task, (exchange_id, local))

    def _has_index(self, stage: Stage, task: int, exchange_id: int, local: int) -> bool:
        exchange = self._planner.exchanges[exchange_id]
        known = self._indexes.get(exchange_id, {})
        return exchange_id in self._exchange_parts or all(
            (n, task) in known
            for n, piece in enumerate(exchange.pieces)
            if piece.stage is stage and piece.local == local
        )

    def _add_index(self, stage: Stage, task: int, split: tuple, index) -> None:
        exchange_id, local = split
        if exchange_id in self._exchange_parts:
            return  # decided already (a task run again sends its index again)
        exchange = self._planner.exchanges[exchange_id]
        known = self._indexes.setdefault(exchange_id, {})
        for n, piece in enumerate(exchange.pieces):
            if piece.stage is stage and piece.local == local:
                known[(n, task)] = index
        self._exchange_if_indexed(exchange)

    def _exchange_if_indexed(self, exchange: Exchange) -> None:
        """Decides the exchange's partitions once every producing task's index is in."""
        if exchange.id in self._exchange_parts:
            return
        known = self._indexes.get(exchange.id, {})
        positions = self._positions(exchange)
        if positions is not None and all(p in known for p in positions):
            self._exchange(exchange, [known[p] for p in positions])

    def _positions(self, exchange: Exchange) -> list | None:
        """(piece, task) of each producing task, in order; None while some are not known."""
        if any(p.stage.id not in self._results for p in exchange.pieces):
            return None
        return [
            (n, task)
            for n, piece in enumerate(exchange.pieces)
            for task in range(len(self._results[piece.stage.id]))
        ]

    def _ready(self, stage: Stage) -> bool:
        source = stage.source
        pieces = []
        if isinstance(source, ExchangeSource):
            if source.exchange.id not in self._exchange_parts:
                return False
        elif isinstance(source, PiecesSource):
            pieces += source.pieces
        for side in stage.sides:
            pieces += self._planner.pieces_of(side)
        return all(p.stage.id in self._results for p in pieces)

    def _side_future(self, pcoll):
        """A side input, computed once per run from its producing tasks' outputs and handed to
        every task that reads it."""
        future = self._sides.get(id(pcoll))
        if future is None:
            pairs = [
                (result, piece.local)
                for piece in self._planner.pieces_of(pcoll)
                for result in self._results[piece.stage.id]
            ]
            if len(pairs) == 1:
                # One producing task (a global combine's): its tasks take the value from its
                # result, without a task in between.
                future = ("whole", *pairs[0])
            else:
                locals_ = [local for _, local in pairs]
                future = self._submit(
                    "side", dask_tasks.side_input_values, locals_, *[r for r, _ in pairs]
                )
            self._sides[id(pcoll)] = future
        return future

    def _submit_stage(self, stage: Stage) -> None:
        source = stage.source
        if isinstance(source, CreateSource):
            sources = [("values", chunk) for chunk in self._chunks(source.values)]
        elif isinstance(source, ExchangeSource):
            kind = source.exchange.kind
            sources = [(kind, parts) for parts in self._exchange_parts[source.exchange.id]]
        else:
            sources = [
                ("pieces", [(result, piece.local)])
                for piece in source.pieces
                for result in self._results[piece.stage.id]
            ]
        program = dask_tasks.Program(
            steps=stage.steps,
            side_views=stage.side_views,
            exports=tuple(sorted(stage.exports)),
            splits=tuple(stage.splits),
            topic=self._topic,
            index_topic=self._index_topic,
            run=self._run,
        )
        sides = [self._side_future(side) for side in stage.sides]
        # A new partitioning (an exchange's, a Create's) is dealt out over the workers' threads
        # (dask would run them where their inputs are: all on one worker after a one-task
        # stage); a stage over other stages' partitions runs where those are.
        spread = len(sources) > 1 and not isinstance(source, PiecesSource)
        self._results[stage.id] = [
            self._submit(
                stage.name,
                dask_tasks.run_stage,
                program,
                task_source,
                *sides,
                stage=stage,
                task=i,
                where=self._slots[i % len(self._slots)] if spread else None,
            )
            for i, task_source in enumerate(sources)
        ]
        # Indexes that came before this stage's partners in an exchange were submitted.
        for exchange_id, _, _ in stage.splits:
            self._exchange_if_indexed(self._planner.exchanges[exchange_id])

    def _producer_pairs(self, exchange: Exchange) -> list:
        return [
            (result, (exchange.id, piece.local))
            for piece in exchange.pieces
            for result in self._results[piece.stage.id]
        ]

    def _exchange(self, exchange: Exchange, index: list) -> None:
        """The exchange's output partitions, chosen from its data; each a list of picks.

        A GroupByKey makes one partition per key, up to `partitions` (2 per worker thread, or
        --dask_npartitions); a Reshuffle one per element, up to the same.
        """
        producers = self._producer_pairs(exchange)
        if exchange.kind == GROUP and any(keys is None for keys in index):
            shares = [("mod", j, self._partitions) for j in range(self._partitions)]
        elif exchange.kind == GROUP:
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
        if exchange.kind == GROUP:
            parts = [
                [
                    self._submit("pick", dask_tasks.pick, result, split, GROUP, share)
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
                            self._submit(
                                "pick", dask_tasks.pick, result, split, SPREAD, (start, count)
                            )
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
    """Runs a batch pipeline on a dask.distributed cluster (--dask_client_address), as fused
    stages and one-step exchanges (Beam 2.77).

    Beam's own DaskRunner (apache_beam/runners/dask) turns every transform into a dask.bag layer
    and every GroupByKey into a bag shuffle. For a pipeline like recordforge's that made
    thousands of tasks for a few thousand images (a shuffle's tasks grow with partitions², and a
    Flatten adds its inputs' partitions up), and, before recordforge's fixes, mixed a
    multi-output DoFn's outputs, dropped what `finish_bundle` emits, recomputed side inputs per
    task and computed only the last branch. This runner keeps Beam's overrides (Create,
    Reshuffle, GroupByKey, Flatten as placeholders) and translates the graph itself, as
    FnApiRunner does (`dask_plan.Planner`); the tasks are `dask_tasks`' functions, submitted by
    `_Driver`.

    Like Beam's, it runs batch pipelines in the global window only, which is all recordforge
    uses. The Beam internals it builds on come from recordforge.transforms.internals, which
    checks the Beam release.
    """

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
                client.submit(
                    dask_tasks.warm_up, key=f"warm-up-{uuid.uuid4().hex}", workers=[address]
                )
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
        planner = Planner()
        pipeline.visit(planner)
        driver = _Driver(
            client, threads, planner, partitions, bag_kwargs.get("partition_size"), topic
        )
        driver.start()
        return DaskRunnerResult(client, driver, counters)


class DaskRunnerResult(PipelineResult):
    """The run's state, its first failure, and its metrics (Beam's raises NotImplementedError):
    the counters of finished and running tasks, live while the run goes on.

    Each task counts into a metrics container per transform whose counters reach the launcher
    as dask events while the job runs (pipelines/dask_metrics.py).
    """

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
        self._driver.wait_for_running_tasks()
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> DaskMetrics:
        return self.counters.results()
