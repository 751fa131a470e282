"""TableRecords (column-wise) makes exactly the records the row-by-row path builds."""

from __future__ import annotations

import collections

import pytest

from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.transforms.build import RecordBuilder
from recordforge.transforms.core.planning.labels import LabelTally, resolve_labels
from recordforge.transforms.core.records import Candidate, CsvRoles, ErrorRecord, Source, refs_of
from recordforge.transforms.core.tables.records import TableRecords
from recordforge.transforms.core.tables.rows import CsvEnd, RowError, read_csv_batches
from recordforge.transforms.discover import _ReadCsvFn

SCHEMA = CsvSchema(
    columns=(
        ColumnSpec("id", "id", "int64"),
        ColumnSpec("label", "label_column", "bytes"),
        ColumnSpec("part", "part", "bytes"),
        ColumnSpec("score", "score", "float", missing="default", default=(2.5,)),
        ColumnSpec("tags", "tags", "bytes", is_list=True, separator="|"),
    )
)
ROWS = [
    b"id,label,part,score,tags",
    b"1,cat,train,0.5,a|b",
    b"2,dog,test,,",
    b"3,,train,1,x",  # missing label
    b"4,cat,no.dot,1,x",  # bad split
    b"5,ghost,train,zz,x",  # bad cell: its label is not a class
    b"6,cat,train",  # wrong field count
    b"7,\xc3\xa9mu,valid,-inf,\xe2\x98\x95",
    b"8,dog,train,3,",
    b"9,ant,train,1,a||b",  # empty list element: "ant" is not a class either
]


def _row_by_row(path, source, roles, splits):
    fn = _ReadCsvFn(SCHEMA, roles)
    fn.setup()
    candidates, errors = [], []
    for item in fn._read(source, str(path)):
        if isinstance(item, Candidate):
            candidates.append(item)
        elif item.tag == "errors":
            errors.append(item.value)
    tally = LabelTally()
    for candidate in candidates:
        tally.add(source.index, None, candidate.label)
    label_map = resolve_labels(tally, [], [source.index], "auto", bool(roles.label_column))
    builder = RecordBuilder(splits, "salt", tuple(c.feature for c in fn._feature_columns))
    refs = [builder.build(candidate, None, label_map) for candidate in candidates]
    assert not [r for r in refs if isinstance(r, ErrorRecord)]
    return refs, errors, builder._shapes, label_map


def _column_wise(path, source, roles, splits, label_map, block_size):
    records = TableRecords(SCHEMA, roles, splits, "salt")
    refs, errors, shapes, labels = [], [], collections.Counter(), set()
    with open(path, "rb") as stream:
        for item in read_csv_batches(stream, SCHEMA, source_name="t.csv", block_size=block_size):
            if isinstance(item, CsvEnd):
                continue
            if isinstance(item, RowError):
                errors.append(
                    ErrorRecord(str(path), item.row, "read", item.error.kind, item.error.message)
                )
                continue
            labels.update(records.make(item, source.index, str(path), "t.csv", None).labels)
            chunk = records.make(item, source.index, str(path), "t.csv", label_map)
            errors.extend(chunk.errors)
            refs.extend(refs_of(chunk.refs) if chunk.refs is not None else [])
            shapes.update(dict(chunk.shapes))
    return refs, errors, shapes, labels


@pytest.mark.parametrize("block_size", [64, 1 << 20])
@pytest.mark.parametrize(
    ("roles", "splits"),
    [
        (CsvRoles(label_column="label", split_column="part"), (("train", 1.0),)),
        (CsvRoles(label_column="label"), (("train", 0.5), ("test", 0.5))),
        (CsvRoles(), (("train", 1.0),)),
    ],
)
def test_same_records_errors_and_tally_as_row_by_row(tmp_path, roles, splits, block_size):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\n".join(ROWS) + b"\n")
    source = Source(0, "csv", str(path), str(tmp_path), str(path))
    expected, expected_errors, expected_shapes, label_map = _row_by_row(path, source, roles, splits)
    refs, errors, shapes, labels = _column_wise(path, source, roles, splits, label_map, block_size)
    assert sorted(refs) == sorted(expected)
    assert sorted(errors) == sorted(expected_errors)
    assert [e.row for e in expected_errors] and all(e.message for e in errors)
    assert shapes == expected_shapes
    if roles.label_column:
        assert sorted(labels) == list(label_map.names) == ["cat", "dog", "\u00e9mu"]
