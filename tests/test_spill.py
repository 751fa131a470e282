"""Tables' encoded records parked in spill files: exact round trips, and a table's records,
parked in blocks until the plan exists, are placed exactly as the one-pass path placed them,
with only references in the shuffle."""

from __future__ import annotations

import collections
import io
import pathlib

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.transforms.core.planning.sharding import ShardingConfig
from recordforge.transforms.core.records import (
    REF_SCHEMA,
    SMALL_PIECE_ROWS,
    CsvRoles,
    RecordRef,
    Source,
    ref_batch,
    refs_of,
)
from recordforge.transforms.shard import PlanShards
from recordforge.transforms.spill import SpillWriter, unspilled
from recordforge.transforms.table import PlaceTable, ReadTable


def _batch(first: int, count: int) -> pa.RecordBatch:
    return ref_batch(
        RecordRef("train", b"o%06d" % i, 20 + i, b"e" * i, None, 0, "t.csv", i, i % 3)
        for i in range(first, first + count)
    )


def test_spilled_pieces_read_back_exactly_and_others_pass_through(tmp_path):
    batches = [_batch(0, 50), _batch(50, 1), _batch(51, 300)]
    with SpillWriter(str(tmp_path)) as spill:
        spilled = [spill.add(b) for b in batches]
    assert [p.rows for p in spilled] == [50, 1, 300]
    assert spilled[1].offset == spilled[0].offset + spilled[0].length
    small = tuple([value] for value in refs_of(_batch(400, 1))[0])
    # Out of order, mixed with a piece that was never spilled.
    back = list(unspilled([spilled[2], small, spilled[0], spilled[1]]))
    assert back[0] is small
    assert [b.equals(batches[i]) for i, b in zip((0, 1, 2), back[1:], strict=True)] == [True] * 3
    assert all(b.schema.equals(REF_SCHEMA) for b in back[1:])


def test_a_full_disk_while_spilling_names_the_spill_file(tmp_path, monkeypatch):
    # "out of disk space while writing a file of the run": the write's OSError named no file
    # (a tester's finding).
    from apache_beam.io.filesystems import FileSystems

    class FullDisk(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(FileSystems, "create", lambda path, **_: FullDisk())
    writer = SpillWriter(str(tmp_path))
    with pytest.raises(OSError) as raised:
        writer.add(_batch(0, 10))
    assert str(tmp_path) in str(raised.value) and "No space left on device" in str(raised.value)


def test_a_truncated_spill_file_fails_loudly(tmp_path):
    with SpillWriter(str(tmp_path)) as spill:
        piece = spill.add(_batch(0, 100))
    with open(piece.path, "r+b") as f:
        f.truncate(piece.length - 10)
    with pytest.raises(RuntimeError, match="ends before"):
        list(unspilled([piece]))


SCHEMA = CsvSchema(
    columns=(
        ColumnSpec("id", "id", "int64"),
        ColumnSpec("label", "label", "bytes"),
        ColumnSpec("score", "score", "float", missing="default", default=(0.5,)),
        ColumnSpec("note", "note", "bytes"),
    )
)


def _table(path, rows: int) -> None:
    lines = ["id,label,score,note"]
    for i in range(rows):
        score = "" if i % 7 == 0 else f"{i / 3:.3f}"
        label = ["cat", "dog", "emu"][i % 3]
        lines.append(f"{i},{label},{score},{'x' * (i % 50)}")
        if i % 997 == 5:
            lines.append(f"{i},too,many,fields,here")  # a bad row: reported once, not placed
    path.write_text("\n".join(lines) + "\n")


def _records(element):
    """((split, shard), piece) → [(split, shard, order, size, example, label)]."""
    (split, shard), piece = element
    return [
        (split, shard, ref.order, ref.size, ref.example, ref.label)
        for batch in unspilled([piece])
        for ref in refs_of(batch)
    ]


def test_place_table_places_what_the_one_pass_path_placed(tmp_path):
    csv = tmp_path / "table.csv"
    _table(csv, 6000)
    source = Source(0, "csv", str(csv), str(tmp_path), str(csv))
    spill_dir = tmp_path / "spill"
    config = ShardingConfig(num_shards=3)
    splits = (("train", 0.8), ("test", 0.2))
    roles = CsvRoles(label_column="label")

    def read(with_examples, spill_dir=None):
        return ReadTable(
            SCHEMA,
            roles,
            splits=splits,
            salt="s",
            label_mode="auto",
            source_indices=[0],
            with_examples=with_examples,
            spill_dir=spill_dir,
        )

    with test_pipeline.TestPipeline(runner=FnApiRunner()) as p:
        files = p | beam.Create([(source, str(csv))])
        # The one-pass path: encoded records wait for the plan, then cross the shuffle.
        before = files | "Before" >> read(True)
        assigned = before["records"] | "PlanBefore" >> PlanShards(config, ("train", "test"))
        # The conversion's path: encoded blocks parked, sizes planned, then blocks placed.
        sized = files | "Sized" >> read(False, str(spill_dir))
        layouts = sized["records"] | "Plan" >> PlanShards(config, ("train", "test"), assign=False)
        placed = sized["blocks"] | PlaceTable(layouts=layouts["layouts"], spill_dir=str(spill_dir))
        no_bytes = sized["records"] | "ExampleBytes" >> beam.Map(
            lambda b: b.column("example").null_count == b.num_rows
        )

        def all_true(flags):
            assert flags and all(flags), flags

        assert_that(no_bytes, all_true, label="PlanWithoutBytes")
        old = assigned["assigned"] | "OldRecords" >> beam.FlatMap(_records)
        new = placed | "NewRecords" >> beam.FlatMap(_records)

        def same(pair):
            (old_records, new_records) = pair
            assert len(old_records) == 6000
            assert sorted(new_records) == sorted(old_records)

        both = (
            (old | "KeyOld" >> beam.Map(lambda r: ("old", r))),
            (new | "KeyNew" >> beam.Map(lambda r: ("new", r))),
        ) | beam.Flatten()
        grouped = (
            both
            | beam.combiners.ToList()
            | beam.Map(
                lambda items: (
                    [r for k, r in items if k == "old"],
                    [r for k, r in items if k == "new"],
                )
            )
        )
        assert_that(grouped, lambda results: [same(r) for r in results], label="SameRecords")

        def only_references(kinds):
            counts = collections.Counter(kinds)
            # Big pieces crossed as references; the rest are small pieces or cut buckets.
            assert counts["SpilledPiece"] >= 6, counts
            assert counts["big RecordBatch"] <= 2 * 2, counts  # ≤ one cut bucket per boundary

        kinds = placed | beam.Map(
            lambda e: (
                type(e[1]).__name__
                if not isinstance(e[1], pa.RecordBatch) or e[1].num_rows < SMALL_PIECE_ROWS
                else "big RecordBatch"
            )
        )
        assert_that(kinds, only_references, label="References")
        errors = sized["errors"] | beam.combiners.Count.Globally()
        assert_that(errors, equal_to([7]), label="BadRowsReportedOnce")
    assert any(spill_dir.iterdir())


def test_a_failed_bundles_spill_file_is_deleted_not_left_to_be_closed_later(tmp_path):
    with SpillWriter(str(tmp_path)) as spill:
        kept = spill.add(_batch(0, 10))
    with pytest.raises(ValueError), SpillWriter(str(tmp_path)) as spill:
        spill.add(_batch(0, 10))
        raise ValueError("the bundle failed")
    assert sorted(tmp_path.iterdir()) == [pathlib.Path(kept.path)]
    spill = SpillWriter(str(tmp_path))
    spill.add(_batch(0, 10))
    spill.discard()
    spill.discard()  # again: nothing to do
    assert sorted(tmp_path.iterdir()) == [pathlib.Path(kept.path)]


class _FailingPartWay(io.BytesIO):
    """A file whose reading fails (as a store's connection does) before its last bytes."""

    def __init__(self, data: bytes, fail_at: int | None) -> None:
        super().__init__(data)
        self._fail_at = fail_at

    def read(self, size=-1):
        if self._fail_at is not None and self.tell() + max(size, 1) > self._fail_at:
            raise OSError("connection reset")
        return super().read(size)


@pytest.mark.parametrize("fails", [False, True])
def test_a_tfrecord_file_failing_part_way_leaves_no_spill_file(tmp_path, monkeypatch, fails):
    # One block of records is parked (a spill file written) before the read fails; left open,
    # that file would be completed whenever the garbage collector closed it (on gs://: an
    # object in the working folder after the failed run had removed it).
    from recordforge.schemas.codec import build_example, serialize
    from recordforge.transforms import examples
    from recordforge.transforms.core.tfrecord.framing import frame_record
    from recordforge.transforms.core.tfrecord.inputs import TFRecordInput
    from recordforge.transforms.core.tfrecord.serialized import BLOCK_RECORDS

    record = frame_record(serialize(build_example({"id": ("int64", [7])})))
    data = record * (BLOCK_RECORDS + 100)
    monkeypatch.setattr(
        examples, "open_file", lambda _: _FailingPartWay(data, len(data) - 50 if fails else None)
    )
    config = examples.ExamplesConfig(output=str(tmp_path / "out"), name="data")
    reader = examples._ReadTFRecordFilesFn(config)
    reader.setup()
    outputs = reader.process(TFRecordInput(str(tmp_path / "in.tfrecord"), None, 0))
    spill = pathlib.Path(config.spill_dir)
    if fails:
        with pytest.raises(examples.InputIncomplete, match="cannot be read to its end"):
            list(outputs)
        assert not spill.exists() or not any(spill.iterdir())
    else:
        blocks = [o.value for o in outputs if getattr(o, "tag", None) == examples.BLOCKS]
        assert sum(block.rows for block in blocks) == BLOCK_RECORDS + 100
        assert len(list(spill.iterdir())) == 1
