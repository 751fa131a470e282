"""The column schema of a CSV input: dtypes, list cells, missing-value rules, feature keys."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from recordforge.schemas.csv.document import (
    DTYPES,
    MISSING_RULES,
    ColumnEntry,
    SchemaError,
    parse_default,
    parse_schema_document,
    validate_document,
)
from recordforge.schemas.csv.sample import infer_dtype

__all__ = [
    "DTYPES",
    "ColumnSpec",
    "CsvSchema",
    "SchemaError",
    "parse_schema_document",
    "resolve_schema",
]

_TYPES = {"int64": int, "float": float, "bytes": bytes}


@dataclass(frozen=True)
class ColumnSpec:
    """How one CSV column becomes one feature of a tf.train.Example.

    Attributes:
        column: the CSV header name.
        feature: the Example feature key.
        dtype: one of DTYPES ("float" is stored as float32 in the Example).
        is_list: whether a cell holds several values separated by `separator`.
        separator: the list element separator.
        missing: what a missing cell does: "omit" (feature left out of that Example), "error"
            (row rejected) or "default" (the `default` values are written).
        default: the typed values written when missing == "default" (a scalar's is a 1-tuple).
    """

    column: str
    feature: str
    dtype: str
    is_list: bool = False
    separator: str = ";"
    missing: str = "omit"
    default: tuple = ()

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.column!r}: unknown dtype {self.dtype!r}")
        if self.missing not in MISSING_RULES:
            raise ValueError(f"column {self.column!r}: unknown missing rule {self.missing!r}")
        if self.missing != "default" and self.default:
            raise ValueError(f"column {self.column!r}: a default needs missing='default'")
        if self.missing == "default" and not self.is_list and len(self.default) != 1:
            raise ValueError(f"column {self.column!r}: a scalar default holds one value")
        if not all(type(v) is _TYPES[self.dtype] for v in self.default):
            raise ValueError(f"column {self.column!r}: default values must be {self.dtype}")


@dataclass(frozen=True)
class CsvSchema:
    """The resolved schema of a CSV input.

    Attributes:
        columns: the converted columns, in CSV header order (dropped columns excluded).
        null_values: cell texts that mean "missing" (a schema resolved from a CSV gets
            csv_document.PANDAS_NULL_VALUES unless told otherwise).
        delimiter: the field delimiter.
        origin: where the schema came from, for the manifest and messages.
        header: the full CSV header, dropped columns included; empty means the header is exactly
            the converted columns.
    """

    columns: tuple[ColumnSpec, ...]
    null_values: tuple[str, ...] = ("",)
    delimiter: str = ","
    origin: str = ""
    header: tuple[str, ...] = ()

    @property
    def expected_header(self) -> tuple[str, ...]:
        """The header a CSV must have to be read with this schema."""
        return self.header or tuple(c.column for c in self.columns)

    @property
    def dropped(self) -> tuple[str, ...]:
        """Header columns that are not converted."""
        kept = {c.column for c in self.columns}
        return tuple(name for name in self.expected_header if name not in kept)

    def column(self, name: str) -> ColumnSpec:
        """Return the spec of a converted column.

        Raises:
            KeyError: no converted column has that name.
        """
        for spec in self.columns:
            if spec.column == name:
                return spec
        raise KeyError(name)

    def to_dict(self) -> dict:
        """Return a JSON-ready dict (non-finite float defaults as "nan", "inf", "-inf")."""
        return {
            "delimiter": self.delimiter,
            "null_values": list(self.null_values),
            "origin": self.origin,
            "header": list(self.expected_header),
            "columns": [
                {
                    "column": c.column,
                    "feature": c.feature,
                    "dtype": c.dtype,
                    "list": c.is_list,
                    "separator": c.separator,
                    "missing": c.missing,
                    "default": [_json_value(v) for v in c.default],
                }
                for c in self.columns
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> CsvSchema:
        """Rebuild a schema from `to_dict` output (its exact inverse)."""
        columns = tuple(
            ColumnSpec(
                column=c["column"],
                feature=c["feature"],
                dtype=c["dtype"],
                is_list=c["list"],
                separator=c["separator"],
                missing=c["missing"],
                default=tuple(_from_json_value(v, c["dtype"]) for v in c["default"]),
            )
            for c in d["columns"]
        )
        header = tuple(d["header"])
        if header == tuple(c.column for c in columns):
            header = ()  # normalised like resolve_schema, so equality round-trips
        return cls(columns, tuple(d["null_values"]), d["delimiter"], d["origin"], header)


def _json_value(value: int | float | bytes) -> Any:
    if isinstance(value, bytes):
        # Defaults come from YAML strings, so this is UTF-8; surrogateescape keeps any bytes exact.
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": JSON has no literal for them
    return value


def _from_json_value(value: Any, dtype: str) -> int | float | bytes:
    if dtype == "bytes":
        return value.encode("utf-8", "surrogateescape")
    if dtype == "float":
        return float(value)
    return int(value)


def resolve_schema(
    header: Sequence[str],
    *,
    document: dict | None,
    sample: pa.Table | None,
    source_name: str,
    delimiter: str = ",",
) -> CsvSchema:
    """Combine a CSV header, an optional schema document and an optional sample into a schema.

    Columns the document does not describe (or describes without a dtype) get their dtype inferred
    from the sample (see `csv_sample.infer_dtype`), as scalars with missing="omit".

    Args:
        header: the CSV's column names, in order.
        document: the schema document (from `parse_schema_document`), or None to infer everything.
        sample: the sample rows from `core.tables.stream.read_sample` (columns in header
            order), or None.
        source_name: the schema file's name (or the CSV's, when there is no document); messages
            and the origin name it.
        delimiter: the delimiter the header and sample were read with.

    Returns:
        The resolved schema.

    Raises:
        SchemaError: the document does not fit the header (unknown column, duplicate feature key,
            bad default, ...), or a dtype cannot be inferred because there is no sample.
    """
    src = source_name
    settings = validate_document(document if document is not None else {}, source_name=src)
    if settings.delimiter is not None and settings.delimiter != delimiter:
        raise SchemaError(
            f"{src}: the schema's delimiter {settings.delimiter!r} differs from the delimiter "
            f"{delimiter!r} the CSV was read with"
        )
    header = tuple(header)
    _check_header(header, src)
    missing_columns = [name for name in settings.entries if name not in header]
    if missing_columns:
        raise SchemaError(
            f"{src}: column {missing_columns[0]!r} is not in the CSV header "
            f"(columns: {_short_list(header)})"
        )
    if sample is not None and sample.num_columns != len(header):
        raise SchemaError(
            f"{src}: the sample has {sample.num_columns} columns but the header has {len(header)}"
        )
    columns, inferred = [], []
    for position, name in enumerate(header):
        entry = settings.entries.get(name) or ColumnEntry(name)
        if entry.drop:
            continue
        dtype = entry.dtype
        if dtype is None:
            if sample is None:
                raise SchemaError(
                    f"{src}: column {name!r} has no dtype and there is no sample to infer it from"
                )
            dtype = infer_dtype(sample.column(position), settings.null_values)
            inferred.append(name)
        feature = entry.feature or name
        if not feature:
            raise SchemaError(
                f"{src}: the CSV column at position {position + 1} has no name; "
                "give it a feature key or drop it"
            )
        columns.append(
            ColumnSpec(
                column=name,
                feature=feature,
                dtype=dtype,
                is_list=entry.is_list,
                separator=entry.separator,
                missing=entry.missing,
                default=parse_default(entry, dtype, src),
            )
        )
    _check_features(columns, src)
    kept = tuple(c.column for c in columns)
    return CsvSchema(
        columns=tuple(columns),
        null_values=settings.null_values,
        delimiter=delimiter,
        origin=_origin(src, document is not None, inferred, sample),
        header=() if kept == header else header,
    )


def _check_header(header: tuple[str, ...], src: str) -> None:
    seen = set()
    for name in header:
        if name in seen:
            raise SchemaError(f"{src}: the CSV header has column {name!r} more than once")
        seen.add(name)


def _check_features(columns: list[ColumnSpec], src: str) -> None:
    owner: dict[str, str] = {}
    for spec in columns:
        if spec.feature in owner:
            raise SchemaError(
                f"{src}: columns {owner[spec.feature]!r} and {spec.column!r} both write "
                f"feature {spec.feature!r}"
            )
        owner[spec.feature] = spec.column


def _origin(src: str, has_document: bool, inferred: list[str], sample: pa.Table | None) -> str:
    rows = f"the first {sample.num_rows:,} rows" if sample is not None else "no rows"
    if not has_document:
        return f"inferred from {rows} of {src}"
    if inferred:
        return f"{src}; other columns inferred from {rows}"
    return src


def _short_list(names: Sequence[str], limit: int = 100) -> str:
    text = ", ".join(names)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return (cut.rsplit(", ", 1)[0] if ", " in cut else cut) + ", ..."
