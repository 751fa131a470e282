"""What crosses Beam's shuffles and side inputs, measured with the pipeline's own coders.

The coders are those the runner API assigns to the real pipeline's PCollections (the graph of
ConvertToTFRecords is built, not run, and translated with `to_runner_api`). The elements are
made by the pipeline's own code from realistic image inputs (gs:// paths of an ImageNet-like
tree): `_image_candidate` and `RecordBuilder.build` make the candidates and RecordRefs, which
travel as one pyarrow RecordBatch (`ref_batch`), and the simulation's final layouts place them
(`place_batch`), so the pieces are as fragmented as they would be at the simulated scale. Sizes
are those of one batch, divided per record, and compared with the image bytes each record brings
in ("per input byte").
"""

from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
from apache_beam.runners import pipeline_context
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN

from recordforge.schemas.features import FeatureTally
from recordforge.schemas.manifest import ErrorSummary
from recordforge.transforms.build import RecordBuilder
from recordforge.transforms.convert import ConvertConfig, ConvertToTFRecords
from recordforge.transforms.core.files.naming import shard_file_name
from recordforge.transforms.core.planning.assemble import GatheredResults, assemble_manifest
from recordforge.transforms.core.planning.declare import declare_features
from recordforge.transforms.core.planning.labels import LabelMap
from recordforge.transforms.core.planning.placement import FineTotals, place_batch, whole_shards_of
from recordforge.transforms.core.planning.sharding import (
    FINE_PER_BUCKET,
    NUM_BUCKETS,
    ShardingConfig,
    SplitStats,
    fine_buckets_of,
    human_size,
    layout_split,
)
from recordforge.transforms.core.records import (
    STAGE_PROBE,
    CsvRoles,
    ErrorRecord,
    ImageInfo,
    InputCounts,
    ShardResult,
    Source,
    pack,
    piece_rows,
    ref_batch,
    take_pieces,
)
from recordforge.transforms.discover import IMAGE_BATCH, _image_candidate

ROOT = "gs://example-datasets/imagenet/train"
# Stage → the unique-name suffix of the transform whose input (or output) PCollection it is.
SHUFFLED = {
    "spread candidates (Reshuffle)": "SpreadImageOpens/ReshufflePerKey/GroupByKey",
    "bucket totals (combine)": "Tallies/Combine/CombinePerKey/GroupByKey",
    "records of cut buckets": "PlanShards/SettleCutBuckets/GroupCutBuckets",
    "pieces by shard": "WriteShards/GroupByShard",
    "commit results (combine)": "Commit/GatherResults/CombinePerKey/GroupByKey",
    "errors by stage": "WriteErrors/GroupByStage",
}
BROADCAST = {
    "layouts": "PlanShards/Layouts",
    "labels": "CollectLabels/ResolveLabels",
}
# Dataflow and Beam limits on one element (see docs/scale.md for the sources).
SHUFFLE_RECORD_LIMIT = (1 << 30) - 1  # "Record exceeds maximum record size", TFDS issue 10995
STREAMING_VALUE_LIMIT = 80 * 10**6  # Streaming Engine's largest element value


def pipeline_coders() -> dict[str, beam.coders.Coder]:
    """{stage: the coder of the PCollection that crosses it}, from the runner API graph."""
    config = ConvertConfig(
        sources=(Source(0, "images", f"{ROOT}/**", ROOT, ROOT),), output="/o", name="imagenet"
    )
    pipeline = beam.Pipeline()
    _ = pipeline | ConvertToTFRecords(config)
    proto = pipeline.to_runner_api()
    context = pipeline_context.PipelineContext(proto.components)
    coders = {}
    for transform in proto.components.transforms.values():
        for stage, suffix in SHUFFLED.items():
            if transform.unique_name.endswith(suffix):
                (pcoll,) = transform.inputs.values()
                coders[stage] = context.coders[proto.components.pcollections[pcoll].coder_id]
        for stage, suffix in BROADCAST.items():
            if transform.unique_name.endswith(suffix):
                (pcoll,) = transform.outputs.values()
                coders[stage] = context.coders[proto.components.pcollections[pcoll].coder_id]
    missing = (set(SHUFFLED) | set(BROADCAST)) - set(coders)
    if missing:
        raise RuntimeError(f"the pipeline has no stage for {sorted(missing)}")
    return coders


def sample_records(report: dict, classes: int, count: int = IMAGE_BATCH, seed: int = 1):
    """A batch of (Candidate, ImageInfo, RecordRef) as the pipeline builds them from images."""
    config = report["config"]
    rng = np.random.default_rng(seed)
    mu = math.log(config["mean_record_bytes"]) - config["sigma"] ** 2 / 2
    sizes = np.clip(rng.lognormal(mu, config["sigma"], count), 2_000, None).astype(int).tolist()
    names = tuple(f"n{i:08d}" for i in range(classes))
    labels = LabelMap(names=names, labelled_sources=frozenset({0}))
    builder = RecordBuilder((("train", 1.0),), "recordforge", csv_keys=())
    source = Source(0, "images", f"{ROOT}/**", ROOT, ROOT)
    samples = []
    for i, size in enumerate(sizes):
        name = names[int(rng.integers(classes))]
        candidate = _image_candidate(source, f"{ROOT}/{name}/{name}_{int(rng.integers(1e6))}.JPEG")
        info = ImageInfo(size, "jpeg", 300 + i % 700, 200 + i % 500, 3)
        samples.append((candidate, info, builder.build(candidate, info, labels)))
    return samples, labels


def measure_elements(report: dict, layouts, *, workers: int, classes: int) -> dict:
    """Per-record shuffle bytes, and the largest single elements, at the simulated scale."""
    coders = pipeline_coders()
    samples, labels = sample_records(report, classes)
    n = len(samples)
    image_bytes = sum(info.size for _, info, _ in samples) / n
    candidates = pack(candidate for candidate, _, _ in samples)
    refs = ref_batch(_into_known_buckets(ref, layouts["train"]) for _, _, ref in samples)
    pieces, cut = place_batch(refs, whole_shards_of(layouts))
    pieces_per_batch = len(pieces) + len(cut)
    # Small simulations cut few fine buckets: then the sample's records stand in for cut ones,
    # one piece per fine bucket as place_batch makes them.
    if not cut:
        fine = fine_buckets_of(refs.column("order"))
        distinct = np.unique(fine).tolist()
        groups = [np.flatnonzero(fine == b) for b in distinct]
        cut = [(("train", b), p) for b, p in zip(distinct, take_pieces(refs, groups), strict=True)]
    cut_records = sum(piece_rows(piece) for _, piece in cut)

    def size(stage, element) -> int:
        return len(coders[stage].encode(element))

    fine = fine_buckets_of(refs.column("order"))
    whole_cut_batch = refs.take(np.concatenate([np.flatnonzero(fine == b) for (_, b), _ in cut]))
    per_record = {
        "spread candidates (Reshuffle)": size(
            "spread candidates (Reshuffle)", (1, (candidates, None, PANE_INFO_UNKNOWN))
        )
        / n,
        # AssignShards waits for the layouts, a side input computed from these same batches:
        # runners materialise the batches of RecordRefs between the two.
        "records, materialised until the layouts exist": len(
            beam.coders.FastPrimitivesCoder().encode(refs)
        )
        / n,
        "records of cut buckets": sum(size("records of cut buckets", c) for c in cut) / cut_records,
        "pieces by shard (batches → shards)": sum(size("pieces by shard", item) for item in pieces)
        / max(1, sum(piece_rows(p) for _, p in pieces)),
        # A cut bucket's records are placed together: few, large pieces per bucket.
        "pieces by shard (cut buckets → shards)": size(
            "pieces by shard", (("train", 0), whole_cut_batch)
        )
        / whole_cut_batch.num_rows,
    }
    cut_share = report["cut"]["record_share"]
    shuffled_per_record = (
        per_record["spread candidates (Reshuffle)"]
        + per_record["records, materialised until the layouts exist"]
        + cut_share * per_record["records of cut buckets"]
        + (1 - cut_share) * per_record["pieces by shard (batches → shards)"]
        + cut_share * per_record["pieces by shard (cut buckets → shards)"]
    )
    split = report["splits"]["train"]
    largest = _largest_elements(report, layouts, coders, per_record, labels, classes, workers)
    return {
        "sample_records": n,
        "mean_image_bytes": round(image_bytes),
        "pieces_per_batch": pieces_per_batch,
        "shuffle_bytes_per_record": {k: round(v, 1) for k, v in per_record.items()},
        "shuffle_bytes_per_record_total": round(shuffled_per_record, 1),
        "shuffle_bytes_per_input_byte": round(shuffled_per_record / image_bytes, 5),
        "largest_elements": largest,
        "workers": workers,
        "shards_per_worker": round(split["planned_shards"] / workers, 1),
    }


def _into_known_buckets(ref, layout):
    """The ref, moved to the nearest bucket that holds records (small simulations leave some
    of the 65536 buckets empty; at 100 M records none is)."""
    bucket = int.from_bytes(ref.order[:2], "big")
    known = np.flatnonzero(layout.bucket_ends > layout.bucket_starts)
    if bucket in known:
        return ref
    nearest = int(known[min(np.searchsorted(known, bucket), len(known) - 1)])
    return ref._replace(order=nearest.to_bytes(2, "big") + ref.order[2:])


def _largest_elements(report, layouts, coders, per_record, labels, classes, workers) -> dict:
    split = report["splits"]["train"]
    num_shards = split["planned_shards"]
    rng = np.random.default_rng(2)
    # ShardResults as the writers report them: label counts over `classes` classes.
    per_shard_records = split["shard_records"]["max"]
    results = []
    for index in range(min(num_shards, 200)):
        counts = np.bincount(rng.integers(classes, size=per_shard_records), minlength=classes)
        label_counts = tuple((int(c), int(k)) for c, k in enumerate(counts.tolist()) if k)
        file = shard_file_name("imagenet", "train", index, num_shards, "none")
        results.append(
            ShardResult(
                "train", index, num_shards, file, per_shard_records, 200 << 20, None, label_counts
            )
        )
    # Before GatheredResults, the commit gathered every ShardResult, label counts and all, into
    # one list (ToList); now label counts are summed per split on the way.
    listed_bytes = len(coders["commit results (combine)"].encode((None, results))) / len(results)
    gathered = GatheredResults()
    for index in range(num_shards):
        gathered.add(results[index % len(results)]._replace(index=index))
    gathered_bytes = len(coders["commit results (combine)"].encode((None, gathered)))
    error = ErrorRecord(
        f"{ROOT}/n00000001/n00000001_123456.JPEG",
        None,
        STAGE_PROBE,
        "CorruptImage",
        "cannot identify the image: truncated JPEG header",
    )
    error_bytes = len(coders["errors by stage"].encode(("probe", [error] * 100))) / 100
    largest = {
        "layouts side input (to every worker)": len(coders["layouts"].encode(layouts)),
        "labels side input (to every worker)": len(coders["labels"].encode(labels)),
        "bucket totals accumulator (with the fine totals)": report["held"]["buckets_with_totals"]
        and len(
            # The plan's totals share the tallies' combine: its accumulator holds them by name.
            coders["bucket totals (combine)"].encode((None, {"PlanTotals": _totals_like(report)}))
        ),
        "a batch of RecordRefs (IMAGE_BATCH records)": round(
            per_record["records, materialised until the layouts exist"] * IMAGE_BATCH
        ),
        "largest cut bucket (GroupCutBuckets value)": round(
            report["held"]["largest_cut_bucket_records"] * per_record["records of cut buckets"]
        ),
        "largest shard's references (GroupByShard value)": round(
            split["shard_records"]["max"] * per_record["pieces by shard (cut buckets → shards)"]
        ),
        "commit input as it was: a list of every ShardResult with its label counts": round(
            listed_bytes * num_shards
        ),
        "commit input now: GatheredResults (label counts summed per split)": gathered_bytes,
        "errors of one stage, per million errors (GroupByStage value)": round(error_bytes * 1e6),
        "manifest (dataset_info.json)": _manifest_bytes(report, labels),
    }
    return {
        "bytes": largest,
        "layouts_broadcast_bytes": largest["layouts side input (to every worker)"] * workers,
        "label_counts_per_shard": round(sum(len(r.label_counts) for r in results) / len(results)),
        "limits": {
            "shuffle record (TFDS issue 10995)": SHUFFLE_RECORD_LIMIT,
            "Streaming Engine element value": STREAMING_VALUE_LIMIT,
        },
    }


def _totals_like(report) -> tuple:
    # The accumulator once every record is in: a (3, NUM_BUCKETS) int64 array per split and the
    # fine totals (pickled sparse, or dense past half full: at most 8 MiB), whatever the scale.
    per_bucket = report["records"] // NUM_BUCKETS
    mean = report["config"]["mean_record_bytes"]
    totals = np.empty((3, NUM_BUCKETS), np.int64)
    totals[:] = np.array([[per_bucket], [per_bucket * mean], [50 * mean]])
    return {"train": totals}, _fine_totals_like(report)


def _fine_totals_like(report) -> FineTotals:
    # As many fine buckets hold records as in the simulation.
    count = max(1, report["held"].get("fine_buckets_with_totals", 0))
    fine = np.unique(np.linspace(0, NUM_BUCKETS * FINE_PER_BUCKET - 1, count).astype(np.int64))
    per_fine = report["config"]["mean_record_bytes"] * report["records"] // len(fine)
    return FineTotals().add({"train": (fine, np.full(len(fine), per_fine))})


def _manifest_bytes(report, labels) -> int:
    split = report["splits"]["train"]
    num_shards = split["planned_shards"]
    per_shard = report["records"] // max(1, num_shards)
    shards = [
        ShardResult(
            "train",
            i,
            num_shards,
            shard_file_name("imagenet", "train", i, num_shards, "none"),
            per_shard + (i < report["records"] - per_shard * num_shards),
            split["mean_shard_bytes"],
            None,
            ((i % max(1, len(labels.names)), per_shard),),
        )
        for i in range(num_shards)
    ]
    plan = report["splits"]["train"]["plan"]
    stats = SplitStats(plan["num_records"], plan["total_bytes"], plan["max_record_bytes"])
    layout = layout_split([(0, stats)], ShardingConfig(**report["config"]["sharding"]))
    tally = FeatureTally()
    manifest = assemble_manifest(
        shards=shards,
        errors=ErrorSummary(),
        layouts={"train": layout},
        labels=labels,
        tally=tally,
        counts=InputCounts(sum(s.num_records for s in shards), 0),
        declared=declare_features(has_images=True, schema=None, roles=CsvRoles()),
        configured_splits=("train",),
        name="imagenet",
        tool_version="0",
        created="2025-01-01T00:00:00+00:00",
        compression="none",
        options={},
        source={"inputs": [ROOT], "kind": "images"},
        plan_config=report["config"]["sharding"],
    )
    return len(manifest.to_json().encode())


def format_elements(elements: dict) -> str:
    lines = [
        f"shuffle bytes per record (sample of {elements['sample_records']} image records, "
        f"mean image {human_size(elements['mean_image_bytes'])}, "
        f"{elements['pieces_per_batch']} pieces per batch of {IMAGE_BATCH}):"
    ]
    lines += [f"  {k}: {v:,.1f} B" for k, v in elements["shuffle_bytes_per_record"].items()]
    lines.append(
        f"  in all {elements['shuffle_bytes_per_record_total']:,.1f} B per record = "
        f"{elements['shuffle_bytes_per_input_byte']:.5f} shuffle bytes per input byte"
    )
    largest = elements["largest_elements"]
    lines.append(f"largest single elements ({elements['workers']:,} workers):")
    lines += [f"  {k}: {human_size(v)}" for k, v in largest["bytes"].items()]
    lines.append(
        f"  layouts broadcast to all workers: {human_size(largest['layouts_broadcast_bytes'])}; "
        f"{largest['label_counts_per_shard']:,} label counts per ShardResult"
    )
    return "\n".join(lines)
