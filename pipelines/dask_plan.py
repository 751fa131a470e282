"""The Dask runner's plan: a Beam pipeline as fused stages and exchanges, in topological order."""

from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam import DoFn, pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor

from recordforge.transforms.internals import (
    DaskCreate,
    DaskFlattenTransform,
    DaskGroupAlsoByWindow,
    DaskGroupByKeyOnly,
    DaskReshuffle,
    side_input_view,
)


@dataclasses.dataclass
class Step:
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
class Stage:
    """Tasks that each run `steps` over one partition of the stage's input.

    Local collections are numbered within the stage; 0 is the input partition.
    """

    id: int
    name: str
    source: object  # CreateSource | ExchangeSource | PiecesSource
    steps: list[Step] = dataclasses.field(default_factory=list)
    sides: list = dataclasses.field(default_factory=list)  # side input PCollections
    side_views: list = dataclasses.field(default_factory=list)  # (view class, options) each
    exports: set[int] = dataclasses.field(default_factory=set)  # read by other stages
    splits: list = dataclasses.field(default_factory=list)  # (exchange id, local, kind)
    locals: int = 1

    def new_local(self) -> int:
        self.locals += 1
        return self.locals - 1


@dataclasses.dataclass(eq=False)
class Piece:
    """A PCollection, or the part of one (a Flatten's inputs), computed in a stage."""

    stage: Stage
    local: int


@dataclasses.dataclass
class CreateSource:
    values: list


@dataclasses.dataclass
class ExchangeSource:
    exchange: Exchange


@dataclasses.dataclass
class PiecesSource:
    """The partitions of other stages' collections, read where they are."""

    pieces: list[Piece]


@dataclasses.dataclass(eq=False)
class Exchange:
    """A GroupByKey or a Reshuffle: one repartition of its producers' partitions.

    Each producing task groups its output by key (`dask_tasks.run_stage`) and sends a small
    index of its keys to the launcher; the launcher then chooses the number of partitions from
    the data, and one small task per producer and partition picks that producer's part
    (`dask_runner._Driver`).
    """

    id: int
    kind: str  # "group" (GroupByKey) or "spread" (Reshuffle)
    pieces: list[Piece]


GROUP, SPREAD = "group", "spread"


def _short(full_label: str) -> str:
    """A transform's own name: `ListInputs/MatchFiles/ParDo(_MatchFilesFn)` -> `MatchFiles`."""
    parts = [p for p in full_label.split("/") if not p.startswith("ParDo(")] or [full_label]
    return parts[-1]


class Planner(PipelineVisitor):
    """Turns the (overridden) pipeline into stages and exchanges, in topological order.

    Beam's overrides leave Create, Reshuffle, GroupByKey and Flatten in the graph as
    placeholders; the graph is translated here as FnApiRunner fuses one. Consecutive ParDos with
    no exchange between them run as one dask task per partition (a stage), each DoFn one bundle
    over the partition, outputs kept apart by tag. A ParDo reading a Flatten runs inside each of
    the Flatten's producers' stages. A ParDo joins its producer's stage unless one of its side
    inputs is computed from that stage (it would wait on itself); then it starts a stage of its
    own over the producer's partitions, where they are. A GroupByKey's window reification is
    the identity in the global window, the only one the runner runs.
    """

    def __init__(self) -> None:
        self.stages: list[Stage] = []
        self.exchanges: list[Exchange] = []
        self._pieces: dict[int, list[Piece]] = {}  # id(PCollection) -> where it is computed
        self._keep: list = []  # the PCollections keyed by id, kept alive while planning

    def pieces_of(self, pcoll) -> list[Piece]:
        """Where a PCollection is computed: one piece, or several (a Flatten's inputs)."""
        return self._pieces[id(pcoll)]

    def _set(self, pcoll, pieces: list[Piece]) -> None:
        self._keep.append(pcoll)
        self._pieces[id(pcoll)] = pieces

    def _new_stage(self, name: str, source) -> Stage:
        stage = Stage(len(self.stages), name, source)
        self.stages.append(stage)
        return stage

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [v for v in node.inputs if not isinstance(v, pvalue.PBegin)]
        outputs = node.outputs
        name = _short(node.full_label)
        if isinstance(transform, DaskCreate):
            stage = self._new_stage(name, CreateSource(list(transform.values)))
            self._set(outputs[None], [Piece(stage, 0)])
        elif isinstance(transform, DaskFlattenTransform):
            self._set(outputs[None], [p for v in inputs for p in self.pieces_of(v)])
        elif isinstance(transform, (DaskGroupByKeyOnly, DaskReshuffle)):
            kind = GROUP if isinstance(transform, DaskGroupByKeyOnly) else SPREAD
            exchange = Exchange(len(self.exchanges), kind, self.pieces_of(inputs[0]))
            self.exchanges.append(exchange)
            for piece in exchange.pieces:
                piece.stage.splits.append((exchange.id, piece.local, kind))
            stage = self._new_stage(name, ExchangeSource(exchange))
            self._set(outputs[None], [Piece(stage, 0)])
        elif type(transform) is beam.ParDo and isinstance(
            transform.fn, beam.GroupByKey.ReifyWindows
        ):
            # In the global window a value's window is known: nothing to carry to the group.
            self._set(outputs[None], self.pieces_of(inputs[0]))
        elif type(transform) is beam.ParDo:
            self._pardo(node, self.pieces_of(inputs[0]))
        elif isinstance(transform, DaskGroupAlsoByWindow) or len(inputs) == 1:
            # The group is complete already (global window); as in Beam's, other primitives
            # pass their input on.
            for pcoll in outputs.values():
                self._set(pcoll, self.pieces_of(inputs[0]))
        else:
            raise NotImplementedError(
                f"the Dask runner cannot run {type(transform).__name__} ({node.full_label})"
            )

    def _pardo(self, node: AppliedPTransform, pieces: list[Piece]) -> None:
        sides = [side.pvalue for side in node.side_inputs]
        side_pieces = [p for side in sides for p in self.pieces_of(side)]
        side_stages = {p.stage for p in side_pieces}
        fused = all(not self._reaches(side_stages, piece.stage) for piece in pieces)
        if not fused:
            # A side input is computed from the producer's stage: a stage of its own, over the
            # producer's partitions.
            for piece in pieces:
                piece.stage.exports.add(piece.local)
            stage = self._new_stage(_short(node.full_label), PiecesSource(pieces))
            pieces = [Piece(stage, 0)]
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
            step = Step(
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
                results[tag].append(Piece(stage, local))
        for tag, pcoll in node.outputs.items():
            self._set(pcoll, results[tag])
        for side in sides:
            for piece in self.pieces_of(side):
                piece.stage.exports.add(piece.local)

    def _upstream(self, stage: Stage) -> set[Stage]:
        """The stages whose outputs `stage` reads: its input's and its side inputs'."""
        source = stage.source
        pieces = list(source.pieces) if isinstance(source, PiecesSource) else []
        if isinstance(source, ExchangeSource):
            pieces += source.exchange.pieces
        for side in stage.sides:
            pieces += self.pieces_of(side)
        return {p.stage for p in pieces}

    def _reaches(self, stages: set[Stage], target: Stage) -> bool:
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
