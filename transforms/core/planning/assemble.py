"""Assembling the manifest from what the writers report, with the checks that guard a commit."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

from recordforge.schemas.features import DeclaredFeature, FeatureTally, derive_specs
from recordforge.schemas.manifest import ErrorSummary, Manifest, ShardInfo, SplitInfo
from recordforge.transforms.core.planning.labels import LabelMap, named_counts
from recordforge.transforms.core.planning.sharding import SplitLayout
from recordforge.transforms.core.records import ErrorFileResult, InputCounts, ShardResult


class GatheredResults:
    """What the writers report, gathered for the commit (a mergeable combiner accumulator).

    Each ShardResult's label counts are summed per split as it arrives and dropped from it:
    carried to the commit on every ShardResult, they would make one element of shards × classes
    pairs (hundreds of MB at 100 M images; see docs/scale.md), where the sums are one pair per
    class and split.
    """

    def __init__(self) -> None:
        self.shards: list[ShardResult] = []
        self.error_files: list[ErrorFileResult] = []
        self.label_counts: dict[str, collections.Counter] = {}

    def add(self, result: ShardResult | ErrorFileResult) -> None:
        if isinstance(result, ShardResult):
            counts = self.label_counts.setdefault(result.split, collections.Counter())
            counts.update(dict(result.label_counts))
            self.shards.append(result._replace(label_counts=()))
        else:
            self.error_files.append(result)

    def merge(self, other: GatheredResults) -> GatheredResults:
        self.shards.extend(other.shards)
        self.error_files.extend(other.error_files)
        for split, counts in other.label_counts.items():
            self.label_counts.setdefault(split, collections.Counter()).update(counts)
        return self


def summarize_errors(files: Iterable[ErrorFileResult]) -> ErrorSummary:
    """The quarantine's totals from the errors files written."""
    files = sorted(files, key=lambda f: f.file)
    by_kind: collections.Counter = collections.Counter()
    for f in files:
        by_kind.update(dict(f.by_kind))
    return ErrorSummary(
        count=sum(f.count for f in files),
        files=tuple(f.file for f in files),
        by_stage={f.stage: f.count for f in files},
        by_kind=dict(by_kind),
    )


def error_rate_message(
    errors: int, inputs: int, limit: float | None, errors_folder: str
) -> str | None:
    """The failure message when more than `limit` of the inputs failed, else None.

    A run in which every input failed fails whatever the limit: an empty dataset is never what
    was asked for (most often the inputs are not what the user meant to name).
    """
    if errors and errors == inputs:
        return (
            f"all {inputs:,} inputs failed, no records were written; no dataset_info.json was "
            f"written. The reasons are in {errors_folder}"
        )
    if limit is None or errors <= limit * inputs:
        return None
    share = errors / inputs if inputs else 1.0
    return (
        f"{errors:,} of {inputs:,} inputs failed ({share:.1%}), more than --max-error-rate "
        f"{limit:g} allows; no dataset_info.json was written. The reasons are in {errors_folder}"
    )


def split_order(layouts: Mapping[str, SplitLayout], configured: Sequence[str]) -> list[str]:
    """Configured splits first, in the order given, then any others (from a split column) sorted."""
    return [s for s in configured if s in layouts] + sorted(set(layouts) - set(configured))


def count_labels(
    shards: Iterable[ShardResult], labels: LabelMap, summed: Mapping[int, int] | None = None
) -> dict[str, int] | None:
    """{class name: records} of a split in id order (every class, even absent ones), or
    {id as text: records} for numeric labels; None when the dataset has no labels.

    The counts are the shards' own, plus `summed` ({class id: records}) when they were summed
    before (GatheredResults).
    """
    if not labels.labelled_sources:
        return None
    counts: collections.Counter = collections.Counter(summed or {})
    for shard in shards:
        counts.update(dict(shard.label_counts))
    return named_counts(counts, labels.names)


def assemble_manifest(
    *,
    shards: Iterable[ShardResult],
    errors: ErrorSummary,
    layouts: Mapping[str, SplitLayout],
    labels: LabelMap,
    tally: FeatureTally,
    counts: InputCounts,
    declared: Sequence[DeclaredFeature],
    configured_splits: Sequence[str],
    name: str,
    tool_version: str,
    created: str,
    compression: str,
    options: Mapping,
    source: Mapping,
    plan_config: Mapping,
    label_counts: Mapping[str, Mapping[int, int]] | None = None,
) -> Manifest:
    """Build the manifest, refusing (RuntimeError) if a shard is missing or counts do not add up.

    Both checks guard against runner faults (a lost bundle, a duplicated one): a manifest is
    only ever written for a dataset that is complete. `label_counts` ({split: {class id:
    records}}) adds counts already summed from the shards (GatheredResults).
    """
    by_split: dict[str, dict[int, ShardResult]] = collections.defaultdict(dict)
    for shard in shards:
        if shard.index in by_split[shard.split]:
            raise RuntimeError(f"shard {shard.file} was reported twice")
        by_split[shard.split][shard.index] = shard
    splits = {}
    for split in split_order(layouts, configured_splits):
        expected = layouts[split].plan.num_shards
        written = by_split.pop(split, {})
        if sorted(written) != list(range(expected)):
            missing = sorted(set(range(expected)) - set(written))
            raise RuntimeError(f"split {split!r}: shards {missing[:10]} were not written")
        ordered = [written[i] for i in range(expected)]
        splits[split] = SplitInfo(
            tuple(ShardInfo(s.file, s.num_records, s.num_bytes, s.index_file) for s in ordered),
            count_labels(ordered, labels, (label_counts or {}).get(split)),
        )
    if by_split:
        raise RuntimeError(f"shards written for unplanned splits {sorted(by_split)}")
    manifest = Manifest(
        name=name,
        tool_version=tool_version,
        created=created,
        num_inputs=counts.num_inputs,
        splits=splits,
        features=derive_specs(declared, tally),
        labels=labels.names or None,
        plan={
            "config": dict(plan_config),
            "splits": {split: layouts[split].plan.to_dict() for split in splits},
        },
        errors=errors,
        compression=compression,
        options=options,
        source=source,
    )
    if not manifest.counts_add_up():
        raise RuntimeError(
            f"counts do not add up: {counts.num_inputs} inputs, {manifest.num_records} records "
            f"written, {errors.count} errors; refusing to write a manifest"
        )
    return manifest
