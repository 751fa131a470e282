"""plan_image_records: image records planned a batch at once equal build_record's, one by one."""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.transforms.build import RecordBuilder, build_record
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.records import plan_image_records, plannable_in_bulk
from recordforge.transforms.core.planning.keys import SplitChooser
from recordforge.transforms.core.planning.labels import LabelMap, UnknownLabel
from recordforge.transforms.core.records import (
    STAGE_RECORD,
    Candidate,
    ErrorRecord,
    ImageInfo,
    ref_batch,
)

CLASSES = ("a", "cat", "ünïcode-class", "x" * 200)
LABELS = LabelMap(names=CLASSES, labelled_sources=frozenset({0, 2}))
CHOOSER = SplitChooser((("train", 0.7), ("test", 0.3)), "salt")
CSV_KEYS = ("score", "tags")


@st.composite
def rows(draw) -> tuple[Candidate, ImageInfo]:
    """A candidate with an image: a folder's file, or a CSV row naming one (no features)."""
    source = draw(st.sampled_from([0, 1, 2]))
    name = draw(st.text(min_size=1, max_size=40))
    csv_row = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=2**40)))
    label = draw(st.one_of(st.none(), st.sampled_from(CLASSES), st.integers(0, 2**40)))
    key = f"{source}:{name}" if csv_row is None else f"{source}:data.csv:{csv_row}"
    candidate = Candidate(
        key=key,
        path=f"/d/{name}" if csv_row is None else "/d/data.csv",
        row=csv_row,
        feature_counts=draw(st.tuples(*[st.integers(-1, 3)] * len(CSV_KEYS))),
        image_path=f"/d/{name}",
        image_name=name,
        label=label,
        depth=name.count("/"),
        split=draw(st.sampled_from([None, None, "train", "holdout"])),
    )
    image = ImageInfo(
        draw(st.integers(min_value=0, max_value=2**40)),
        draw(st.sampled_from(["jpeg", "png", "gif", "bmp", "webp"])),
        draw(st.integers(min_value=1, max_value=2**31)),
        draw(st.integers(min_value=1, max_value=2**31)),
        draw(st.sampled_from([1, 2, 3, 4])),
    )
    return candidate, image


def _one_by_one(batch):
    """What build_record gives, record by record: (refs as a batch, errors, counts)."""
    refs, errors, shapes = [], [], collections.Counter()
    for candidate, image in batch:
        try:
            ref, counts = build_record(
                candidate, image, LABELS, CHOOSER, "salt", CSV_KEYS, with_example=False
            )
        except InputError as error:
            errors.append(
                ErrorRecord(candidate.path, candidate.row, STAGE_RECORD, error.kind, error.message)
            )
            continue
        refs.append(ref)
        shapes[counts] += 1
    return (ref_batch(refs) if refs else None), errors, shapes


@given(st.lists(rows(), max_size=40))
@settings(max_examples=200, deadline=None)
def test_a_planned_batch_equals_its_records_built_one_by_one(batch) -> None:
    records, errors, shapes = plan_image_records(batch, LABELS, CHOOSER, "salt", CSV_KEYS)
    expected_records, expected_errors, expected_shapes = _one_by_one(batch)
    if expected_records is None:
        assert records is None
    else:
        assert records.equals(expected_records), (records.to_pydict(), expected_records)
    assert errors == expected_errors
    assert shapes == expected_shapes


def test_files_outside_class_folders_are_errors_and_the_rest_records() -> None:
    good = Candidate(
        "0:cat/1.png",
        "/d/cat/1.png",
        None,
        image_path="/d/cat/1.png",
        image_name="cat/1.png",
        label="cat",
        depth=1,
    )
    stray = Candidate("0:2.png", "/d/2.png", None, image_path="/d/2.png", image_name="2.png")
    image = ImageInfo(1000, "png", 640, 480, 3)
    records, errors, _ = plan_image_records(
        [(good, image), (stray, image)], LABELS, CHOOSER, "salt"
    )
    assert records.column("path").to_pylist() == ["/d/cat/1.png"]
    assert records.column("label").to_pylist() == [1]
    (error,) = errors
    assert error[:4] == ("/d/2.png", None, STAGE_RECORD, "NoClassFolder")
    assert error.message.startswith("the file is not inside a class folder")
    # Or, when the user says so (--stray-files unlabeled), a record without a label.
    unlabeled = dataclasses.replace(LABELS, unlabeled_strays=True)
    records, errors, _ = plan_image_records(
        [(good, image), (stray, image)], unlabeled, CHOOSER, "salt"
    )
    assert errors == [] and records.column("label").to_pylist() == [1, None]


def test_an_unknown_label_is_a_bug_not_an_error_record() -> None:
    candidate = Candidate(
        "0:dog/1.png",
        "/d/dog/1.png",
        None,
        image_path="/d/dog/1.png",
        image_name="dog/1.png",
        label="dog",
        depth=1,
    )
    with pytest.raises(UnknownLabel):
        plan_image_records([(candidate, ImageInfo(1, "png", 1, 1, 1))], LABELS, CHOOSER, "salt")


def test_the_builder_plans_image_batches_in_bulk_and_other_batches_record_by_record() -> None:
    image_file = Candidate(
        "0:cat/1.png",
        "/d/cat/1.png",
        None,
        feature_counts=(-1, -1),
        image_path="/d/cat/1.png",
        image_name="cat/1.png",
        label="cat",
        depth=1,
    )
    csv_row = Candidate("1:t.csv:1", "/d/t.csv", 1, features=b"\n\x00", feature_counts=(1, -1))
    image = ImageInfo(1000, "jpeg", 640, 480, 3)
    assert plannable_in_bulk(image_file, image)
    assert not plannable_in_bulk(csv_row, None)
    for batch in ([(image_file, image)], [(image_file, image), (csv_row, None)]):
        packed = [(tuple(c), None if i is None else tuple(i)) for c, i in batch]
        planner = RecordBuilder((("train", 0.7), ("test", 0.3)), "salt", CSV_KEYS, False)
        records, errors = planner.build_batch(packed, LABELS)
        expected, expected_errors, _ = _one_by_one(batch)
        assert records.equals(expected)
        assert errors == expected_errors == []
