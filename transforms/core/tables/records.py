"""Records of tables without images, made a batch of rows at a time, column-wise.

The per-row path (a Candidate per row, then `build.build_record`) and this one give the same
records: the same keys, splits, order keys, sizes, labels and Example bytes
(tests/test_table_records.py compares them). Only the key hash stays a Python call per row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.schemas import features as keys
from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.schemas.example_columns import FeatureColumn, encode_examples
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.naming import SPLIT_NAME_RULE, is_valid_split_name
from recordforge.transforms.core.planning.declare import csv_feature_columns
from recordforge.transforms.core.planning.keys import HASH_BYTES, SplitChooser
from recordforge.transforms.core.planning.labels import LabelMap
from recordforge.transforms.core.records import REF_SCHEMA, STAGE_READ, CsvRoles, ErrorRecord
from recordforge.transforms.core.tables.rows import CellBatch, missing_label
from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES


@dataclass(frozen=True)
class TableChunk:
    """What a batch of rows became.

    Attributes:
        refs: the records (REF_SCHEMA), or None when no row became one.
        errors: the rows that did not, in row order.
        shapes: ((key, value count) of each feature a record has, number of such records).
        labels: the text labels of the rows that are good apart from their label id (only
            when asked for, to collect a run's class names), else ().
    """

    refs: pa.RecordBatch | None
    errors: list[ErrorRecord]
    shapes: list[tuple[tuple[tuple[str, int], ...], int]]
    labels: tuple[str, ...] = ()


class TableRecords:
    """Turns the CellBatches of a run's CSV files (tables without images) into records.

    Args:
        schema: the CSV schema.
        roles: the label and split columns (an image column is not supported here).
        splits: (split, fraction) pairs for hash-based splits.
        salt: salts the split and order hashes.
    """

    def __init__(
        self, schema: CsvSchema, roles: CsvRoles, splits: Sequence[tuple[str, float]], salt: str
    ) -> None:
        if roles.image_column:
            raise ValueError("tables with an image column are built row by row")
        self.schema = schema
        self._features = csv_feature_columns(schema, roles)
        self._label = schema.column(roles.label_column) if roles.label_column else None
        self._split = schema.column(roles.split_column) if roles.split_column else None
        for spec in (self._label, self._split):
            if spec is not None and spec.is_list:
                raise ValueError(f"column {spec.column!r}: a list column cannot be a label/split")
        self._chooser = SplitChooser(tuple(splits), salt)
        self._only_split = splits[0][0] if len(splits) == 1 else None
        # keys.order_key, with the keyed hash state computed once.
        self._order_hash = hashlib.blake2b(
            digest_size=HASH_BYTES, key=b"order\0" + salt.encode("utf-8")
        )

    @property
    def text_labels(self) -> bool:
        """Whether labels are texts that need the run's class names to be numbered."""
        return self._label is not None and self._label.dtype != "int64"

    def make(
        self,
        batch: CellBatch,
        source_index: int,
        path: str,
        relative: str,
        label_map: LabelMap | None,
        *,
        with_examples: bool = True,
        with_shapes: bool = True,
        split: str | None = None,
    ) -> TableChunk:
        """The records (or errors) of a batch of rows of the CSV file `path`.

        Args:
            batch: rows of the file.
            source_index: the index of the source the file belongs to (part of record keys).
            path: the file, for records and errors.
            relative: its path relative to the source's root (part of record keys).
            label_map: the run's labels; None only to collect text labels (no records then).
            with_examples: False to size the Examples without writing their bytes (planning).
            with_shapes: False to leave `shapes` empty (the records were tallied before).
            split: the split of every row (the source's, see Source.split), or None.
        """
        failed: dict[int, InputError] = dict(batch.errors)
        label_ids, label_texts = self._labels(batch, failed)
        splits = self._splits(batch, failed)
        errors = [
            ErrorRecord(path, e.row, STAGE_READ, e.error.kind, e.error.message)
            for e in batch.skipped
        ]
        rows = batch.rows
        for position, error in sorted(failed.items()):
            errors.append(
                ErrorRecord(path, int(rows[position]), STAGE_READ, error.kind, error.message)
            )
        errors.sort(key=lambda e: e.row)
        good = np.ones(batch.num_rows, dtype=bool)
        good[list(failed)] = False
        if label_map is None:
            texts = label_texts.filter(pa.array(good)) if label_texts is not None else pa.array([])
            return TableChunk(None, errors, [], tuple(set(texts.to_pylist())))
        count = int(good.sum())
        if count == 0:
            return TableChunk(None, errors, [])
        keep = None if count == batch.num_rows else pa.array(good)
        columns = [
            FeatureColumn(
                spec.feature,
                spec.dtype,
                _take(batch.values[spec.column], keep),
                default=spec.default if spec.missing == "default" else None,
            )
            for spec in self._features
        ]
        label_column = None
        if label_ids is not None:
            label_column = _take(label_ids, keep)
            if label_texts is not None:  # text labels: numbered by the run's sorted names
                texts = _take(label_texts, keep)
                label_column = _label_ids(texts, label_map)
                columns.append(FeatureColumn(keys.LABEL_TEXT, "bytes", texts.cast(pa.binary())))
            columns.insert(len(self._features), FeatureColumn(keys.LABEL, "int64", label_column))
        encoded = encode_examples(columns, count, with_bytes=with_examples)
        good_rows = rows[good]
        orders, split_names = self._keys(good_rows, source_index, relative, splits, good, split)
        examples = encoded.examples if with_examples else pa.nulls(count, pa.binary())
        refs = pa.record_batch(
            [
                split_names,
                orders,
                pa.array(encoded.sizes + FRAMING_BYTES, pa.int64()),
                examples,
                pa.nulls(count, pa.string()),
                pa.array(np.zeros(count, dtype=np.int64)),
                pa.array([path] * count, pa.string()),
                pa.array(good_rows, pa.int64()),
                label_column if label_column is not None else pa.nulls(count, pa.int64()),
                pa.array(np.zeros(count, dtype=np.int64)),  # payload_offset: no payload
                pa.array(np.full(count, -1, dtype=np.int64)),  # payload_version
            ],
            schema=REF_SCHEMA,
        )
        shapes = _shapes([c.key for c in columns], encoded.counts) if with_shapes else []
        return TableChunk(refs, errors, shapes)

    def _labels(self, batch: CellBatch, failed: dict[int, InputError]):
        """(label values, label texts or None); rows whose label is bad go to `failed`."""
        spec = self._label
        if spec is None:
            return None, None
        values = _with_default(batch.values[spec.column], spec)
        if spec.dtype == "int64":
            for position in _null_positions(values):
                failed.setdefault(position, _missing_label(spec))
            return values, None
        texts = self._texts(values, spec, failed, missing=_missing_label(spec))
        return values, texts

    def _splits(self, batch: CellBatch, failed: dict[int, InputError]) -> pa.Array | None:
        """Split names from the split column (None without one); bad ones go to `failed`."""
        spec = self._split
        if spec is None:
            return None
        values = _with_default(batch.values[spec.column], spec)
        missing = InputError("MissingSplit", f"column {spec.column!r} is empty")
        texts = self._texts(values, spec, failed, missing)
        encoded = texts.dictionary_encode()
        names = encoded.dictionary.to_pylist()
        invalid = [i for i, name in enumerate(names) if not is_valid_split_name(name)]
        if invalid:
            indices = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
            for position in np.flatnonzero(np.isin(indices, invalid)).tolist():
                name = names[indices[position]]
                failed.setdefault(
                    position,
                    InputError(
                        "BadSplit",
                        f"column {spec.column!r}: {name[:40]!r} is not a valid split name "
                        f"({SPLIT_NAME_RULE})",
                    ),
                )
        return texts

    @staticmethod
    def _texts(
        values: pa.Array, spec: ColumnSpec, failed: dict[int, InputError], missing: InputError
    ) -> pa.Array:
        """The cells as text (string array), as the per-row path reads them; a row with a
        missing cell or bytes that are not UTF-8 goes to `failed` (unless already there)."""
        for position in _null_positions(values):
            failed.setdefault(position, missing)
        if spec.dtype == "bytes":
            try:
                return values.cast(pa.string())
            except pa.ArrowInvalid:  # some cell is not UTF-8: find which (rare)
                pass
            cells = values.to_pylist()
            for position, cell in enumerate(cells):
                if cell is not None and not _is_utf8(cell):
                    failed.setdefault(
                        position,
                        InputError("BadCell", f"column {spec.column!r} is not valid UTF-8 text"),
                    )
                    cells[position] = None
            return pa.array(cells, pa.binary()).cast(pa.string())
        # Numbers as Python writes them (str(1.5) == "1.5"), once per distinct value.
        encoded = values.dictionary_encode()
        texts = pa.array([str(v) for v in encoded.dictionary.to_pylist()], pa.string())
        return pc.take(texts, encoded.indices)

    def _keys(self, rows: np.ndarray, source_index: int, relative: str, splits, good, split=None):
        """Order keys (binary array) and split names (string array) of the good rows."""
        prefix = f"{source_index}:{relative}#"
        # Record keys ("0:table.csv#17"), built column-wise; only the hash runs per row.
        key_array = pc.binary_join_element_wise(
            pa.scalar(prefix.encode("utf-8"), pa.binary()),
            pa.array(rows).cast(pa.string()).cast(pa.binary()),
            pa.scalar(b"", pa.binary()),
        )
        key_bytes = key_array.to_pylist()
        copy = self._order_hash.copy

        def digest(key: bytes) -> bytes:
            state = copy()
            state.update(key)
            return state.digest()

        # map() rather than a loop: the one Python call per row, kept as cheap as it goes.
        hashes = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(HASH_BYTES),
            len(key_bytes),
            [None, pa.py_buffer(b"".join(map(digest, key_bytes)))],
        )
        orders = pc.binary_join_element_wise(
            hashes.cast(pa.binary()), key_array, pa.scalar(b"", pa.binary())
        )
        if splits is not None:
            names = splits.filter(pa.array(good)) if not good.all() else splits
        elif split is not None:
            names = pa.array([split] * len(rows), pa.string())
        elif self._only_split is None:
            choose = self._chooser.choose
            names = pa.array([choose(key.decode("utf-8")) for key in key_bytes], pa.string())
        else:
            names = pa.array([self._only_split] * len(rows), pa.string())
        return orders, names


def _take(values: pa.Array, keep: pa.Array | None) -> pa.Array:
    return values if keep is None else values.filter(keep)


def _with_default(values: pa.Array, spec: ColumnSpec) -> pa.Array:
    if spec.missing == "default" and values.null_count:
        return pc.fill_null(values, pa.scalar(spec.default[0], values.type))
    return values


def _missing_label(spec: ColumnSpec) -> InputError:
    return missing_label(spec.column)


def _label_ids(texts: pa.Array, label_map: LabelMap) -> pa.Array:
    encoded = texts.dictionary_encode()
    ids = pa.array([label_map.id_of(t) for t in encoded.dictionary.to_pylist()], pa.int64())
    return pc.take(ids, encoded.indices)


def _null_positions(values: pa.Array) -> list[int]:
    if not values.null_count:
        return []
    return pc.indices_nonzero(values.is_null()).to_pylist()


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _shapes(feature_keys: Sequence[str], counts: np.ndarray):
    """((key, count) pairs of present features, records) for each distinct row of counts."""
    if not len(counts):
        return []
    # Rows as single opaque values: a 1-D unique is far faster than np.unique(axis=0).
    rows = np.ascontiguousarray(counts, dtype=np.int64)
    opaque = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, times = np.unique(opaque, return_index=True, return_counts=True)
    return [
        (
            tuple(
                (k, int(n)) for k, n in zip(feature_keys, rows[i].tolist(), strict=True) if n >= 0
            ),
            int(t),
        )
        for i, t in zip(first.tolist(), times.tolist(), strict=True)
    ]
