"""Beam transforms on their own, with TestPipeline and assert_that on FnApiRunner."""

from __future__ import annotations

import threading
import types

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.io.filesystem import BeamIOError
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from conftest import make_image

from recordforge.schemas import codec
from recordforge.transforms.build import BuildRecords, CollectLabels
from recordforge.transforms.combiners import CombineTogether
from recordforge.transforms.core.planning.keys import order_key
from recordforge.transforms.core.planning.sharding import ShardingConfig, assign_all
from recordforge.transforms.core.records import (
    Candidate,
    CsvRoles,
    ImageInfo,
    RecordRef,
    Source,
    concat_batches,
    ordered_batch,
    piece_rows,
    ref_batch,
    refs_of,
    take_piece,
    take_pieces,
)
from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES, frame_record
from recordforge.transforms.discover import ListInputs
from recordforge.transforms.shard import PlanShards, plan_totals_of
from recordforge.transforms.write import _WriteShardFn, publish


def pipeline():
    return test_pipeline.TestPipeline(runner=FnApiRunner())


def test_list_inputs_finds_files_and_tags_hidden_ones(tmp_path):
    root = tmp_path / "photos"
    make_image(root / "cat" / "1.jpg", "JPEG")
    make_image(root / "dog" / "2.png", "PNG")
    (root / ".DS_Store").write_bytes(b"x")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    source = Source(0, "images", f"{root}/**", str(root), str(root))
    with pipeline() as p:
        listed = p | beam.Create([source]) | ListInputs(None, CsvRoles())
        keys = listed["candidates"] | beam.FlatMap(
            lambda batch: [
                (c.key, c.label, c.depth, c.image_name) for c in map(Candidate._make, batch)
            ]
        )
        assert_that(
            keys,
            equal_to(
                [("0:cat/1.jpg", "cat", 1, "cat/1.jpg"), ("0:dog/2.png", "dog", 1, "dog/2.png")]
            ),
        )
        assert_that(
            listed["ignored"]
            | beam.Map(lambda reason_path: (reason_path[0], reason_path[1][len(str(root)) + 1 :])),
            equal_to([("hidden", ".DS_Store"), ("hidden", ".git/HEAD")]),
            label="Ignored",
        )


def _ref(index: int, size: int, split: str = "train") -> RecordRef:
    return RecordRef(split, order_key("s", f"0:{index}"), size, b"", None, 0, f"/x/{index}", None)


def test_small_pieces_travel_as_plain_columns_and_concatenate_in_order():
    refs = [_ref(i, 100 + i) for i in range(100)]
    batch, lists = ref_batch(refs), []
    small = take_piece(batch, np.array([5, 3]), lists)
    large = take_piece(batch, np.arange(40, 80), lists)
    assert isinstance(small, tuple) and isinstance(large, pa.RecordBatch)
    assert [piece_rows(small), piece_rows(large)] == [2, 40]
    joined = concat_batches([small, large, take_piece(batch, np.array([9]), lists)])
    assert refs_of(joined) == [refs[5], refs[3], *refs[40:80], refs[9]]
    ordered = ordered_batch([small, large, take_piece(batch, np.array([9]), lists)])
    expected = sorted([refs[5], refs[3], *refs[40:80], refs[9]], key=lambda ref: ref.order)
    assert refs_of(ordered) == expected
    assert refs_of(ordered_batch([])) == []
    assert refs_of(small) == [refs[5], refs[3]]
    # What Beam's default coder makes of a one-record piece: its values, not a schema.
    coder = beam.coders.FastPrimitivesCoder()
    as_lists = coder.encode(take_piece(batch, np.array([7]), lists))
    as_batch = coder.encode(batch.take(pa.array([7])))
    assert len(as_lists) * 2 < len(as_batch)


def test_take_pieces_gives_the_pieces_take_piece_gives():
    refs = [_ref(i, 100 + i) for i in range(100)]
    batch = ref_batch(refs)
    groups = [np.array([5, 3]), np.arange(40, 80), np.array([9]), np.array([], np.int64)]
    pieces = take_pieces(batch, groups)
    lists: list = []
    expected = [take_piece(batch, positions, lists) for positions in groups]
    assert [type(piece) for piece in pieces] == [type(piece) for piece in expected]
    assert [refs_of(piece) for piece in pieces] == [refs_of(piece) for piece in expected]
    assert refs_of(pieces[0]) == [refs[5], refs[3]]


@pytest.mark.parametrize("shared_combine", [False, True], ids=["own-combine", "summed-together"])
@pytest.mark.parametrize("batch_size", [1, 37, 1000])
def test_plan_shards_assigns_every_record_once_and_balanced(batch_size, shared_combine):
    sizes = [1_000 + (i * 37) % 5_000 for i in range(500)]
    refs = [_ref(i, size) for i, size in enumerate(sizes)] + [_ref(1000, 2_000, "test")]
    batches = [ref_batch(refs[i : i + batch_size]) for i in range(0, len(refs), batch_size)]
    config = ShardingConfig(num_hosts=2, min_shard_bytes=50_000, max_shard_bytes=100_000)
    train_in_order = sorted((r for r in refs if r.split == "train"), key=lambda r: r.order)
    # The exact assignment over the whole split, whatever the batching: cumulative bytes.
    expected = dict(
        zip(
            (r.path for r in train_in_order),
            assign_all([r.size for r in train_in_order], 20),
            strict=True,
        )
    )

    def check(pieces):
        per_shard: dict = {}
        for (split, shard), piece in pieces:
            per_shard.setdefault((split, shard), []).extend(refs_of(piece))
        train = {k[1]: v for k, v in per_shard.items() if k[0] == "train"}
        assert sorted(train) == list(range(20))
        assert {r.path: shard for shard, rs in train.items() for r in rs} == expected
        totals = [sum(r.size for r in v) for v in train.values()]
        assert max(totals) <= 1.1 * sum(totals) / len(totals)
        assert sum(len(v) for v in train.values()) == 500
        assert [r.size for r in per_shard[("test", 0)]] == [2_000]

    with pipeline() as p:
        records = p | beam.Create(batches)
        summed = None
        if shared_combine:  # as a conversion does: the totals beside another tally
            summed = (
                p
                | CombineTogether(
                    {
                        "Records": (records | beam.Map(lambda batch: batch.num_rows), sum),
                        "PlanTotals": plan_totals_of(records),
                    }
                )
            )["PlanTotals"]
        planned = records | PlanShards(
            config, ("train", "validation", "test"), summed_totals=summed
        )
        assert_that(planned["assigned"], check)
        counts = planned["layouts"] | beam.Map(
            lambda layouts: {split: layout.plan.num_shards for split, layout in layouts.items()}
        )
        # train: ~1.75 MB for 2 hosts is 87 KB per shard at 10 per host, within 50–100 KB: 20.
        assert_that(counts, equal_to([{"train": 20, "validation": 0, "test": 1}]), label="Layouts")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_plan_totals_cross_into_the_combine_once_per_bundle_not_per_batch(workers):
    # A batch's totals are megabytes (its bucket totals): what reaches the combine must be one
    # partial sum per bundle, however many batches the bundle held.
    refs = [_ref(i, 1_000 + (i * 37) % 5_000) for i in range(600)]
    batches = [ref_batch(refs[i : i + 10]) for i in range(0, len(refs), 10)]
    options = beam.options.pipeline_options.PipelineOptions(
        [f"--direct_num_workers={workers}", "--direct_running_mode=multi_threading"]
    )
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        partial, sum_totals = plan_totals_of(p | beam.Create(batches))
        assert_that(
            partial | beam.combiners.Count.Globally(),
            lambda counts: _assert(1 <= counts[0] <= workers, counts),
            label="OnePerBundle",
        )
        summed = partial | beam.CombineGlobally(sum_totals)
        assert_that(
            summed | beam.Map(lambda totals: int(totals[0]["train"][0].sum())),
            equal_to([len(refs)]),
            label="EveryRecordCounted",
        )


def _assert(condition: bool, shown) -> None:
    assert condition, shown


def test_build_records_labels_splits_and_exact_sizes(tmp_path):
    image = make_image(tmp_path / "cat" / "1.png", "PNG", size=(10, 12))
    info = ImageInfo(len(image), "png", 10, 12, 3)
    candidates = [
        (
            Candidate(
                "0:cat/1.png",
                str(tmp_path / "cat/1.png"),
                None,
                image_path=str(tmp_path / "cat/1.png"),
                image_name="cat/1.png",
                label="cat",
                depth=1,
            ),
            info,
        ),
        (
            Candidate(
                "0:dog/2.png",
                str(tmp_path / "dog/2.png"),
                None,
                image_path=str(tmp_path / "dog/2.png"),
                image_name="dog/2.png",
                label="dog",
                depth=1,
            ),
            info,
        ),
    ]

    def check(batches):
        refs = [ref for batch in batches for ref in refs_of(batch)]
        assert len(refs) == 2
        for ref in refs:
            # The image bytes are read at write time, not carried: the planned Example has a
            # hole for them, and is exactly the final record once they are put in.
            assert len(ref.example) + len(image) + 16 == ref.size
            cut = ref.payload_offset
            record = ref.example[:cut] + image + ref.example[cut:]
            example = codec.to_python(codec.parse(record))
            assert example["image/encoded"] == ("bytes", [image])
            name = example["image/filename"][1][0].decode()
            assert example["image/class/label"] == ("int64", [0 if name.startswith("cat") else 1])
            assert codec.serialize(codec.build_example(example)) == record  # deterministic
            assert ref.split == "train" and ref.payload_size == len(image)

    with pipeline() as p:
        probed = p | beam.Create([candidates])  # one batch
        labels = probed | CollectLabels([0], [], "auto", csv_labelled=False)
        built = probed | BuildRecords(labels, splits=(("train", 1.0),), salt="s")
        assert_that(built.records, check)
        assert_that(built.errors, equal_to([]), label="NoErrors")


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_collect_labels_modes(mode):
    candidates = [(Candidate("0:cat/1.png", "p", None, label="cat", depth=1), None)]
    with pipeline() as p:
        labels = p | beam.Create([candidates]) | CollectLabels([0], [], mode, csv_labelled=False)
        expected = ("cat",) if mode == "auto" else ()
        assert_that(labels | beam.Map(lambda m: m.names), equal_to([expected]))


def test_the_pipeline_ends_in_one_commit_step(tmp_path):
    """Every PCollection feeds a later step except the manifest: runners that execute only the
    last branch of a graph (Dask) still run every stage."""
    from recordforge.pipelines.assembly import build_pipeline
    from recordforge.transforms.convert import ConvertConfig

    root = str(tmp_path)
    source = Source(0, "images", root + "/**", root, root)
    config = ConvertConfig(sources=(source,), output=str(tmp_path / "out"), name="x")
    p = beam.Pipeline(runner=FnApiRunner())
    manifest = build_pipeline(p, config)
    proto = p.to_runner_api()
    consumed, produced = set(), {}
    for transform in proto.components.transforms.values():
        if transform.subtransforms:
            continue  # composites: look at the leaves only
        consumed.update(transform.inputs.values())
        for pcoll in transform.outputs.values():
            produced[pcoll] = transform.unique_name
    leaves = {pcoll: name for pcoll, name in produced.items() if pcoll not in consumed}
    assert list(leaves.values()) == ["ConvertToTFRecords/Commit/WriteManifest"]
    assert manifest.producer.full_label.startswith("ConvertToTFRecords/Commit")


def test_publish_renames_into_place_and_is_safe_to_repeat(tmp_path):
    (tmp_path / "tmp").mkdir()
    for name in ("a", "b"):
        (tmp_path / "tmp" / name).write_text(name)
    staged = [(str(tmp_path / "tmp" / n), str(tmp_path / "out" / "sub" / n)) for n in "ab"]
    publish(staged)  # creates the target folder
    publish(staged)  # a retried commit: the sources are gone, the targets there
    assert sorted(p.name for p in (tmp_path / "out" / "sub").iterdir()) == ["a", "b"]
    assert (tmp_path / "out" / "sub" / "b").read_text() == "b"
    assert not list((tmp_path / "tmp").iterdir())
    with pytest.raises(BeamIOError):  # neither there: something else went wrong
        publish([(str(tmp_path / "tmp" / "c"), str(tmp_path / "out" / "c"))])


def test_write_shard_frames_a_table_in_key_order_with_its_index(tmp_path):
    """Complete records (a table's) are framed in bulk, index included, in order-key order."""
    examples = {
        order: bytes([order[0]]) * (10 + 7 * order[0]) for order in (b"\x03", b"\x01", b"\x02")
    }
    refs = [
        RecordRef("train", order, len(ex) + FRAMING_BYTES, ex, None, None, "t.csv", i, i % 2, None)
        for i, (order, ex) in enumerate(examples.items())
    ]
    fn = _WriteShardFn(str(tmp_path / "parts"), "ds", "none", write_index=True)
    layouts = {"train": types.SimpleNamespace(plan=types.SimpleNamespace(num_shards=1))}
    fn.setup()
    try:
        (result,) = fn.process(
            (("train", 0), [ref_batch(refs[:2]), ref_batch(refs[2:])]), layouts, True
        )
    finally:
        fn.teardown()
    framed = [frame_record(examples[order]) for order in sorted(examples)]
    (shard, _), (index, _) = result.staged
    with open(shard, "rb") as f:
        assert f.read() == b"".join(framed)
    starts = [sum(map(len, framed[:i])) for i in range(len(framed))]
    with open(index) as f:
        assert f.read() == "".join(f"{s} {len(r)}\n" for s, r in zip(starts, framed, strict=True))
    assert (result.num_records, result.label_counts) == (3, ((0, 2), (1, 1)))


def test_write_shard_frames_local_images_and_quarantines_vanished_or_changed_ones(tmp_path):
    """The write step reads each image again: a file gone or resized since probing is an
    error record, the others are framed exactly, with the index locating them."""
    images = tmp_path / "in"
    images.mkdir()
    # Real images: the writer checks their structure too (transforms.core.images.integrity).
    contents = {
        name: make_image(images / name, "PNG", size=(20 + 7 * i, 10), seed=i)
        for i, name in enumerate("abcd")
    }

    def ref(name, order):
        before, after = b"\x0a\x05head" + name.encode(), b"tail"
        size = len(before) + len(contents[name]) + len(after) + FRAMING_BYTES
        example = before + after
        path = str(images / name)
        return RecordRef(
            "train", order, size, example, path, len(contents[name]), path, None, 1, len(before)
        )

    refs = [ref("a", b"1"), ref("b", b"2"), ref("c", b"3"), ref("d", b"4")]
    (images / "b").unlink()  # vanished since probing
    (images / "c").write_bytes(contents["c"] + b"more")  # changed since probing
    fn = _WriteShardFn(str(tmp_path / "parts"), "ds", "none", write_index=True)
    layouts = {"train": types.SimpleNamespace(plan=types.SimpleNamespace(num_shards=1))}
    fn.setup()
    try:
        outputs = list(fn.process((("train", 0), [ref_batch(refs[::-1])]), layouts, True))
    finally:
        fn.teardown()
    errors = sorted((o.value.path.rsplit("/", 1)[1], o.value.error) for o in outputs[:-1])
    assert errors == [("b", "UnreadableFile"), ("c", "FileChanged")]
    result = outputs[-1]
    assert (result.num_records, result.label_counts) == (2, ((1, 2),))
    (shard, _), (index, _) = result.staged
    expected = [
        frame_record(r.example[: r.payload_offset] + contents[n] + r.example[r.payload_offset :])
        for n, r in (("a", refs[0]), ("d", refs[3]))
    ]
    with open(shard, "rb") as f:
        assert f.read() == b"".join(expected)
    with open(index) as f:
        assert f.read() == f"0 {len(expected[0])}\n{len(expected[0])} {len(expected[1])}\n"


def test_the_writer_checks_local_pngs_in_its_read_threads_and_keeps_the_order(
    tmp_path, monkeypatch
):
    """A PNG's check inflates its image data (zlib releases the GIL): the read threads do it,
    so a writer uses a second core; a JPEG's cheap check stays in the writer's thread. The
    records and their errors come in the planned order either way."""
    from recordforge.transforms import write

    checked_in = {}
    real_check = write.check_structure

    def check_structure(data):
        checked_in[data] = threading.current_thread().name
        real_check(data)

    monkeypatch.setattr(write, "check_structure", check_structure)
    images = tmp_path / "in"
    images.mkdir()
    names = ["a.png", "b.jpg", "c.PNG", "d.png", "e.jpeg"]
    contents = {
        name: make_image(images / name, "PNG" if "png" in name.lower() else "JPEG", seed=i)
        for i, name in enumerate(names)
    }
    (images / "d.png").unlink()  # vanished since probing: its error comes in its turn

    def ref(name):
        path = str(images / name)
        return RecordRef("train", name.encode(), 0, b"", path, len(contents[name]), path, None)

    pool = write.ThreadPoolExecutor(4, thread_name_prefix="recordforge-read")
    try:
        got = []
        for ref_, fetch in write._read_ahead([ref(n) for n in names], pool):
            name = ref_.path.rsplit("/", 1)[1]
            try:
                got.append((name, fetch() == contents[name]))
            except write.InputError as error:
                got.append((name, error.kind))
    finally:
        pool.shutdown()
    assert got == [
        ("a.png", True),
        ("b.jpg", True),
        ("c.PNG", True),
        ("d.png", "UnreadableFile"),
        ("e.jpeg", True),
    ]
    threads = {name: checked_in[contents[name]] for name in ("a.png", "b.jpg", "c.PNG", "e.jpeg")}
    main = threading.current_thread().name
    assert threads["b.jpg"] == threads["e.jpeg"] == main
    assert threads["a.png"].startswith("recordforge-read")
    assert threads["c.PNG"].startswith("recordforge-read")
