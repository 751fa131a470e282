"""Records of image files for planning, a batch at a time: sizes from array operations.

`recordforge plan` needs each record's split, order key and exact framed size, not its bytes.
Built one record at a time (`transforms.build.build_record`) an image file's record costs
~11 µs, most of it Python overhead around a handful of integers; here only the label, the two
hashes and the columns are per record, and the sizes are computed for the whole batch
(schemas.example_size.scalar_example_sizes). tests/test_image_records.py checks that the
result equals build_record's, record by record.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from recordforge.schemas import features as keys
from recordforge.schemas.example_size import scalar_example_sizes
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.filenames import name_bytes
from recordforge.transforms.core.planning.keys import SplitChooser, order_key
from recordforge.transforms.core.planning.labels import LabelMap
from recordforge.transforms.core.records import (
    REF_SCHEMA,
    STAGE_RECORD,
    Candidate,
    ErrorRecord,
    ImageInfo,
)
from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES

# What plan_image_records returns: the records (None when all failed), the error records,
# and {(key, value count) tuple: records with it}, as build_record's counts.
PlannedBatch = tuple[pa.RecordBatch | None, list[ErrorRecord], collections.Counter]


def plannable_in_bulk(candidate: Candidate, image: ImageInfo | None) -> bool:
    """Whether plan_image_records can plan this record: an image without CSV features."""
    return image is not None and not candidate.features


def record_label(candidate: Candidate, label_map: LabelMap) -> tuple[int | None, str | None]:
    """(label id, label text) of a candidate's record; (None, None) for an unlabelled source.

    The text is None when the label is a number (a CSV label column of ints).

    Raises:
        InputError: `NoClassFolder`, a labelled source's file outside any class folder.
        UnknownLabel: a label text the run's LabelMap lacks (a bug, not bad input).
    """
    if source_of(candidate) not in label_map.labelled_sources:
        return None, None
    if candidate.label is None:
        if label_map.unlabeled_strays:
            return None, None
        raise InputError(
            "NoClassFolder",
            "the file is not inside a class folder (root/<class>/<file>), so it has no label "
            "(--stray-files unlabeled converts such files without one)",
        )
    if isinstance(candidate.label, int):
        return candidate.label, None
    return label_map.id_of(candidate.label), candidate.label


def source_of(candidate: Candidate) -> int:
    """The index of the source a candidate came from (its key starts with it)."""
    return int(candidate.key.split(":", 1)[0])


def plan_image_records(
    rows: Sequence[tuple[Candidate, ImageInfo]],
    label_map: LabelMap,
    chooser: SplitChooser,
    salt: str,
    csv_keys: tuple[str, ...] = (),
) -> PlannedBatch:
    """The records (REF_SCHEMA, no Example bytes) that `rows` become when only planning.

    Every row must be `plannable_in_bulk`. Equal, record for record, to
    `build_record(..., with_example=False)`; rows it would reject become error records.
    """
    errors: list[ErrorRecord] = []
    good: list[tuple[Candidate, ImageInfo]] = []
    labels: list[tuple[int | None, str | None]] = []  # (label id, label text) of each good row
    for candidate, image in rows:
        try:
            labels.append(record_label(candidate, label_map))
        except InputError as error:
            errors.append(
                ErrorRecord(candidate.path, candidate.row, STAGE_RECORD, error.kind, error.message)
            )
            continue
        good.append((candidate, image))
    kinds = collections.Counter(
        (candidate.feature_counts, label is not None, text is not None)
        for (candidate, _), (label, text) in zip(good, labels, strict=True)
    )
    shapes: collections.Counter = collections.Counter()
    for kind, times in kinds.items():
        shapes[_counts(csv_keys, *kind)] += times
    if not good:
        return None, errors, shapes
    count = len(good)
    # Columns, one list comprehension each: cheaper per record than appending to several.
    candidates = [candidate for candidate, _ in good]
    images = [image for _, image in good]
    columns: dict[str, object] = {
        "split": [c.split or chooser.choose(c.key) for c in candidates],
        "order": [order_key(salt, c.key) for c in candidates],
        "payload_path": [c.image_path for c in candidates],
        "payload_size": [image.size for image in images],
        "path": [c.path for c in candidates],
        "row": [c.row for c in candidates],
        "label": [label for label, _ in labels],
    }
    text_lengths = np.array(
        [-1 if text is None else len(text.encode("utf-8")) for _, text in labels], dtype=np.int64
    )
    labelled = np.array([label is not None for label, _ in labels])
    example_sizes = scalar_example_sizes(
        {
            keys.IMAGE_LABEL: ("int64", [0 if label is None else label for label, _ in labels]),
            keys.IMAGE_LABEL_TEXT: ("bytes", text_lengths),
            keys.IMAGE_FORMAT: ("bytes", [len(image.format.encode("ascii")) for image in images]),
            keys.IMAGE_HEIGHT: ("int64", [image.height for image in images]),
            keys.IMAGE_WIDTH: ("int64", [image.width for image in images]),
            keys.IMAGE_CHANNELS: ("int64", [image.channels for image in images]),
            keys.IMAGE_FILENAME: (
                "bytes",
                [len(name_bytes(c.image_name)) for c in candidates],
            ),
            keys.IMAGE_ENCODED: ("bytes", columns["payload_size"]),
        },
        count,
        present={keys.IMAGE_LABEL: labelled, keys.IMAGE_LABEL_TEXT: text_lengths >= 0},
    )
    columns["size"] = example_sizes + FRAMING_BYTES
    columns["example"] = [b""] * count
    columns["payload_offset"] = np.zeros(count, dtype=np.int64)
    columns["payload_version"] = [image.version for image in images]
    batch = pa.record_batch(
        [pa.array(columns[f.name], f.type) for f in REF_SCHEMA], schema=REF_SCHEMA
    )
    return batch, errors, shapes


@functools.lru_cache(maxsize=1024)
def _counts(
    csv_keys: tuple[str, ...], feature_counts: tuple, labelled: bool, text: bool
) -> tuple[tuple[str, int], ...]:
    """build_record's ((key, value count), ...) for a record of this shape."""
    counts = [(k, n) for k, n in zip(csv_keys, feature_counts, strict=True) if n >= 0]
    if labelled:
        counts.append((keys.IMAGE_LABEL, 1))
    if text:
        counts.append((keys.IMAGE_LABEL_TEXT, 1))
    counts += [
        (key, 1)
        for key in (
            keys.IMAGE_FORMAT,
            keys.IMAGE_HEIGHT,
            keys.IMAGE_WIDTH,
            keys.IMAGE_CHANNELS,
            keys.IMAGE_FILENAME,
            keys.IMAGE_ENCODED,
        )
    ]
    return tuple(counts)
