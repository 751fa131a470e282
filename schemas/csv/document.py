"""Parsing and validation of CSV schema documents (YAML or JSON) into plain column entries."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import yaml

from recordforge.schemas.csv.cells import dtype_phrase, parse_text

DTYPES = ("int64", "float", "bytes")
MISSING_RULES = ("omit", "error", "default")
_TOP_KEYS = ("delimiter", "null_values", "columns")
_COLUMN_KEYS = ("dtype", "feature", "list", "separator", "missing", "drop")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# The cell texts pandas' read_csv reads as missing by default (its STR_NA_VALUES, the list in
# its documentation of `na_values`), the empty cell first; tests/test_csv_missing.py checks
# them against the installed pandas.
PANDAS_NULL_VALUES = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)


class SchemaError(ValueError):
    """A schema file that does not parse or does not fit the CSV.

    The message is one line, names the file and the problem.
    """

    def __init__(self, message: str) -> None:
        # Column names and YAML snippets can hold newlines; the CLI prints one line.
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


@dataclass(frozen=True)
class ColumnEntry:
    """One column as the document describes it; None where the document leaves it to inference."""

    name: str
    drop: bool = False
    dtype: str | None = None
    feature: str | None = None
    is_list: bool = False
    separator: str = ";"
    missing: str = "omit"
    default: Any = None  # the raw document value; parsed once the dtype is known


@dataclass(frozen=True)
class DocumentSettings:
    """A validated schema document."""

    delimiter: str | None
    null_values: tuple[str, ...]
    entries: dict[str, ColumnEntry]


# A schema is a few lines per column: a file larger than this is not one (and would only be
# parsed slowly).
MAX_SCHEMA_BYTES = 4 << 20


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects duplicate mapping keys instead of keeping the last one, and
    aliases (`*name`): a schema needs none, and nested aliases make a few lines stand for
    billions of nodes (the "billion laughs")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a schema file", event.start_mark
            )
        return super().compose_node(parent, index)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue  # unhashable: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_document(text: str, *, source_name: str) -> Any:
    """Parse YAML or JSON text safely (a SafeLoader): a size limit, no aliases, no duplicate keys.

    Raises:
        SchemaError: the text is too large, not YAML/JSON, nested too deeply, or empty.
    """
    if len(text) > MAX_SCHEMA_BYTES:
        raise SchemaError(
            f"{source_name}: the schema file is larger than {MAX_SCHEMA_BYTES >> 20} MiB; "
            "is it a schema?"
        )
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe
    except RecursionError:
        raise SchemaError(f"{source_name}: the schema file is nested too deeply") from None
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SchemaError(f"{source_name}: not valid YAML or JSON{where}: {problem}") from None
    if document is None:
        raise SchemaError(f"{source_name}: the schema file is empty")
    return document


def parse_schema_document(text: str, *, source_name: str) -> dict:
    """Parse a schema file's text (YAML or JSON, since JSON is YAML) into the raw document.

    Args:
        text: the file's content.
        source_name: the file's name, for messages.

    Returns:
        The document as a dict, checked against the schema format (column names as strings).

    Raises:
        SchemaError: the text is not YAML/JSON, or the document does not have the right shape.
    """
    document = load_yaml_document(text, source_name=source_name)
    validate_document(document, source_name=source_name)
    columns = document.get("columns")
    if columns:
        # `2024: int64` names the CSV column "2024"; callers see the names as in the header.
        document["columns"] = {_column_name(k, source_name): v for k, v in columns.items()}
    return document


def validate_document(document: Any, *, source_name: str) -> DocumentSettings:
    """Check a raw document against the schema format and return its settings.

    Raises:
        SchemaError: the document does not have the right shape.
    """
    src = source_name
    if not isinstance(document, dict):
        raise SchemaError(
            f"{src}: the schema must be a mapping with a 'columns' key, "
            f"not {type(document).__name__}"
        )
    unknown = [k for k in document if k not in _TOP_KEYS]
    if unknown:
        raise SchemaError(f"{src}: unknown key {unknown[0]!r} (allowed: {', '.join(_TOP_KEYS)})")
    delimiter = document.get("delimiter")
    if delimiter is not None and not (
        isinstance(delimiter, str)
        and len(delimiter) == 1
        and delimiter.isascii()
        and delimiter not in '"\r\n'
    ):
        raise SchemaError(
            f"{src}: delimiter must be one ASCII character other than a quote or a line end, "
            f"not {delimiter!r}"
        )
    null_values = document.get("null_values", list(PANDAS_NULL_VALUES))
    if not isinstance(null_values, list) or not all(isinstance(v, str) for v in null_values):
        raise SchemaError(
            f"{src}: null_values must be a list of strings (quote values such as 'null'), "
            f"not {null_values!r}"
        )
    columns = document.get("columns")
    if columns is None:
        columns = {}
    if not isinstance(columns, dict):
        raise SchemaError(
            f"{src}: columns must be a mapping from column name to dtype or settings, "
            f"not {type(columns).__name__}"
        )
    entries: dict[str, ColumnEntry] = {}
    for key, raw in columns.items():
        name = _column_name(key, src)
        if name in entries:
            raise SchemaError(f"{src}: column {name!r} is listed twice")
        entries[name] = _column_entry(name, raw, src)
    return DocumentSettings(delimiter, tuple(null_values), entries)


def _column_name(key: Any, src: str) -> str:
    if isinstance(key, str):
        return key
    # YAML reads an unquoted `2024:` as an int; that name is unambiguous. `yes:` or `1.0:` are not.
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    raise SchemaError(f"{src}: column name {key!r} must be a string (quote it)")


def _column_entry(name: str, raw: Any, src: str) -> ColumnEntry:
    where = f"{src}: column {name!r}"
    if isinstance(raw, str):
        raw = {"dtype": raw}
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: expected a dtype ({', '.join(DTYPES)}) or a mapping")
    unknown = [k for k in raw if k not in _COLUMN_KEYS]
    if unknown:
        raise SchemaError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(_COLUMN_KEYS)})"
        )
    drop = raw.get("drop", False)
    if not isinstance(drop, bool):
        raise SchemaError(f"{where}: drop must be true or false, not {drop!r}")
    if drop:
        if len(raw) > 1:
            raise SchemaError(f"{where}: a dropped column takes no other keys")
        return ColumnEntry(name, drop=True)
    dtype = raw.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise SchemaError(f"{where}: unknown dtype {dtype!r} (allowed: {', '.join(DTYPES)})")
    feature = raw.get("feature")
    if feature is not None and not (isinstance(feature, str) and feature):
        raise SchemaError(f"{where}: feature must be a non-empty string, not {feature!r}")
    is_list = raw.get("list", False)
    if not isinstance(is_list, bool):
        raise SchemaError(f"{where}: list must be true or false, not {is_list!r}")
    separator = raw.get("separator", ";")
    if "separator" in raw and not is_list:
        raise SchemaError(f"{where}: separator is only allowed with list: true")
    if not (isinstance(separator, str) and separator):
        raise SchemaError(f"{where}: separator must be a non-empty string, not {separator!r}")
    missing, default = _missing_rule(raw.get("missing", "omit"), where)
    entry = ColumnEntry(name, False, dtype, feature, is_list, separator, missing, default)
    if dtype is not None:
        parse_default(entry, dtype, src)
    return entry


def _missing_rule(raw: Any, where: str) -> tuple[str, Any]:
    if raw in ("omit", "error"):
        return raw, None
    if isinstance(raw, dict) and list(raw) == ["default"]:
        return "default", raw["default"]
    raise SchemaError(f"{where}: missing must be omit, error or {{default: value}}, not {raw!r}")


def parse_default(entry: ColumnEntry, dtype: str, src: str) -> tuple:
    """Return the typed default values of an entry (() unless missing is "default").

    Raises:
        SchemaError: the default does not parse as the dtype, or is a list for a scalar column
            (or the other way round).
    """
    if entry.missing != "default":
        return ()
    where = f"{src}: column {entry.name!r}"
    raw = entry.default
    if entry.is_list:
        if not isinstance(raw, list):
            raise SchemaError(f"{where}: the default of a list column must be a list, not {raw!r}")
        return tuple(_default_value(v, dtype, where) for v in raw)
    if isinstance(raw, (list, dict)):
        raise SchemaError(f"{where}: the default of a scalar column must be one value")
    return (_default_value(raw, dtype, where),)


def _default_value(value: Any, dtype: str, where: str) -> int | float | bytes:
    bad = SchemaError(f"{where}: default {value!r} is not {dtype_phrase(dtype)}")
    if dtype == "bytes":
        if not isinstance(value, str):
            raise SchemaError(
                f"{where}: default {value!r} for a bytes column must be a string (quote it)"
            )
        return value.encode("utf-8")
    if isinstance(value, bool) or value is None:
        raise bad
    if isinstance(value, str):
        try:
            return parse_text(value, dtype)
        except ValueError as error:  # says why: not a number, or too large for its type
            raise SchemaError(f"{where}: default {error}") from None
    if dtype == "int64":
        if not isinstance(value, int) or not _INT64_MIN <= value <= _INT64_MAX:
            raise bad
        return value
    if not isinstance(value, (int, float)):
        raise bad
    try:
        number = float(value)
        struct.pack("<f", number)  # the Example's float32 must hold it: no silent infinity
    except OverflowError:
        raise SchemaError(
            f"{where}: default {value!r} is too large for a float feature (float32)"
        ) from None
    return number
