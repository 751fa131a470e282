"""What `recordforge inspect` shows, as plain data and text: no Beam, no file access.

`summarize` turns a manifest (plus label counts) into a JSON-able dict; `format_summary` prints
it; `preview_record` shows one record with bytes abbreviated and images described. Labels, file
names and CSV values are user data: everything shown in a terminal goes through `printable`.
"""

from __future__ import annotations

import io
import statistics
import warnings
from collections.abc import Mapping, Sequence

from recordforge.schemas import features as keys
from recordforge.schemas.manifest import Manifest
from recordforge.transforms.core.planning.sharding import human_size

# How much of a record is shown.
BYTES_PREFIX = 24  # bytes of a long bytes value
TEXT_LIMIT = 64  # a bytes value this short and valid UTF-8 is shown as text
LIST_LIMIT = 8  # values of a list
# The label table lists every class up to this many, else the most frequent this many.
TOP_CLASSES = 20
HISTOGRAM_BINS = 8
BAR_WIDTH = 30

LABEL_KEYS = ((keys.IMAGE_LABEL, keys.IMAGE_LABEL_TEXT), (keys.LABEL, keys.LABEL_TEXT))


def label_key(feature_keys) -> str | None:
    """The label feature of a dataset with these feature keys (images first), or None."""
    return next((label for label, _ in LABEL_KEYS if label in feature_keys), None)


def printable(text: str) -> str:
    """`text` with control and other non-printable characters escaped (\\x1b, \\u200b)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def plural(count: int, noun: str) -> str:
    """`1 record`, `2 records`, `1,000 records`."""
    return f"{count:,} {noun}{'' if count == 1 else 'es' if noun.endswith('s') else 's'}"


def shorten(text: str, width: int) -> str:
    """`text` cut to `width` characters, ending in … when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# --- The summary as data ------------------------------------------------------------------------


def size_histogram(sizes: Sequence[int], bins: int = HISTOGRAM_BINS) -> list[dict]:
    """Equal-width bins from the smallest to the largest size: [{low, high, count}].

    One bin when all sizes are equal; never more bins than sizes; empty for no sizes.
    """
    if not sizes:
        return []
    low, high = min(sizes), max(sizes)
    if low == high:
        return [{"low": low, "high": high, "count": len(sizes)}]
    bins = max(1, min(bins, len(sizes)))
    width = (high - low) / bins
    counts = [0] * bins
    for size in sizes:
        counts[min(int((size - low) / width), bins - 1)] += 1
    edges = [round(low + i * width) for i in range(bins)] + [high]
    return [{"low": edges[i], "high": edges[i + 1], "count": counts[i]} for i in range(bins)]


def summarize(
    manifest: Manifest,
    label_counts: Mapping[str, Mapping[str, int]] | None,
    label_counts_source: str | None = "manifest",
    folder: str = "",
) -> dict:
    """The summary `inspect` shows (and prints with --json), from a manifest.

    Args:
        label_counts: {split: {class: records}} in label-id order, or None without labels.
        label_counts_source: "manifest", or "scan" when they were counted by reading records.
        folder: the dataset folder, for the header.
    """
    splits = {}
    for name, split in manifest.splits.items():
        sizes = [shard.num_bytes for shard in split.shards]
        splits[name] = {
            "num_records": split.num_records,
            "num_bytes": split.num_bytes,
            "num_shards": len(split.shards),
            "shard_bytes": {
                "min": min(sizes, default=0),
                "median": statistics.median_low(sizes) if sizes else 0,
                "max": max(sizes, default=0),
            },
            "histogram": size_histogram(sizes),
        }
    labels = None
    if label_counts is not None:
        ids = {name: index for index, name in enumerate(manifest.labels or ())}
        classes: dict[str, dict] = {}
        for split, counts in label_counts.items():
            for label, count in counts.items():
                entry = classes.setdefault(label, {"label": label, "counts": {}, "total": 0})
                entry["counts"][split] = count
                entry["total"] += count
        for entry in classes.values():
            entry["id"] = ids.get(entry["label"], _int_or_none(entry["label"]))
            entry["counts"] = {s: entry["counts"].get(s, 0) for s in label_counts}
        labels = {
            "source": label_counts_source,
            "splits": list(label_counts),
            "classes": list(classes.values()),
        }
    return {
        "folder": folder,
        "name": manifest.name,
        "tool_version": manifest.tool_version,
        "created": manifest.created,
        "compression": manifest.compression,
        "num_inputs": manifest.num_inputs,
        "num_records": manifest.num_records,
        "errors": manifest.errors.to_dict(),
        "splits": splits,
        "labels": labels,
        "features": {key: spec.to_dict() for key, spec in manifest.features.items()},
    }


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def top_classes(classes: Sequence[dict], limit: int = TOP_CLASSES) -> tuple[list[dict], int]:
    """All classes in id order when there are at most `limit`, else the `limit` largest (ties in
    id order); and how many were left out."""
    if len(classes) <= limit:
        return list(classes), 0
    ranked = sorted(enumerate(classes), key=lambda item: (-item[1]["total"], item[0]))
    return [entry for _, entry in ranked[:limit]], len(classes) - limit


# --- The summary as text ------------------------------------------------------------------------


def bar(count: int, largest: int, width: int = BAR_WIDTH) -> str:
    """A bar of up to `width` blocks, proportional to count/largest; at least one if count > 0."""
    if count <= 0 or largest <= 0:
        return ""
    return "█" * max(1, round(width * count / largest))


def size_range(low: int, high: int) -> str:
    """`low – high` in human units, or in bytes when the units would hide the difference."""
    a, b = human_size(low), human_size(high)
    if a == b and low != high:
        a, b = f"{low:,} B", f"{high:,} B"
    return a if low == high else f"{a} – {b}"


def format_summary(summary: Mapping) -> list[str]:
    """The summary as lines of text."""
    lines = [
        f"Dataset {printable(summary['name'])} (recordforge {printable(summary['tool_version'])}, "
        f"created {printable(summary['created'])})"
    ]
    if summary.get("folder"):
        lines.append(f"  folder       {printable(summary['folder'])}")
    lines.append(f"  compression  {summary['compression']}")
    errors = summary["errors"]
    line = (
        f"  inputs       {summary['num_inputs']:,} → {plural(summary['num_records'], 'record')}, "
        f"{plural(errors['count'], 'error')}"
    )
    if errors["count"]:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in errors["by_kind"].items())
        line += f" ({kinds}; in {', '.join(errors['files'])})"
    lines.append(line)

    lines += ["", "Splits"]
    name_width = max([5, *(len(name) for name in summary["splits"])])
    lines.append(
        f"  {'split':<{name_width}}  {'records':>10}  {'shards':>6}  {'bytes':>10}  "
        f"{'min shard':>10}  {'median':>10}  {'max shard':>10}"
    )
    for name, split in summary["splits"].items():
        sizes = split["shard_bytes"]
        lines.append(
            f"  {name:<{name_width}}  {split['num_records']:>10,}  {split['num_shards']:>6,}  "
            f"{human_size(split['num_bytes']):>10}  {human_size(sizes['min']):>10}  "
            f"{human_size(sizes['median']):>10}  {human_size(sizes['max']):>10}"
        )

    lines += ["", "Shard sizes"]
    ranges = {
        name: [size_range(entry["low"], entry["high"]) for entry in split["histogram"]]
        for name, split in summary["splits"].items()
    }
    range_width = max((len(text) for texts in ranges.values() for text in texts), default=0)
    for name, split in summary["splits"].items():
        histogram = split["histogram"]
        if not histogram:
            lines.append(f"  {name}: no shards")
            continue
        largest = max(entry["count"] for entry in histogram)
        for i, (entry, text) in enumerate(zip(histogram, ranges[name], strict=True)):
            head = f"{name}:" if i == 0 else ""
            lines.append(
                f"  {head:<{name_width + 1}}  {text:>{range_width}}  "
                f"{bar(entry['count'], largest):<{BAR_WIDTH}}  {entry['count']:,}"
            )

    lines += ["", *format_labels(summary["labels"])]
    lines += ["", *format_features(summary["features"])]
    return lines


def format_labels(labels: Mapping | None) -> list[str]:
    """The label distribution: per class its records per split, total, share and a bar."""
    if labels is None:
        return ["Labels: none (the records have no label feature)"]
    classes = labels["classes"]
    total = sum(entry["total"] for entry in classes)
    source = (
        "counted from the manifest"
        if labels["source"] == "manifest"
        else "not in the manifest (convert records them; reshard, WriteDataset and earlier "
        "versions do not): counted by reading "
        f"all {total:,} records"
    )
    lines = [f"Labels: {plural(len(classes), 'class')}, {source}"]
    shown, hidden = top_classes(classes)
    if not shown:
        return lines
    names = [printable(entry["label"]) for entry in shown]
    label_width = min(max([5, *(len(name) for name in names)]), 32)
    splits = labels["splits"]
    split_columns = splits if len(splits) > 1 else []
    widths = [max(len(s), 8) for s in split_columns]
    header = f"  {'class':<{label_width}}"
    header += "".join(f"  {s:>{w}}" for s, w in zip(split_columns, widths, strict=True))
    lines.append(header + f"  {'records':>8}  {'share':>6}")
    largest = max(entry["total"] for entry in shown)
    for entry, name in zip(shown, names, strict=True):
        line = f"  {shorten(name, label_width):<{label_width}}"
        line += "".join(
            f"  {entry['counts'][s]:>{w},}" for s, w in zip(split_columns, widths, strict=True)
        )
        share = entry["total"] / total if total else 0.0
        lines.append(
            line + f"  {entry['total']:>8,}  {share:>6.1%}  {bar(entry['total'], largest)}"
        )
    if hidden:
        rest = total - sum(entry["total"] for entry in shown)
        lines.append(f"  … {hidden:,} more classes with {plural(rest, 'record')}")
    return lines


def format_features(features: Mapping[str, Mapping]) -> list[str]:
    """The feature spec as a table: key, dtype, shape, optional, description."""
    if not features:
        return ["Features: none"]
    key_width = max(len(printable(key)) for key in features)
    lines = [
        "Features",
        f"  {'key':<{key_width}}  {'dtype':<5}  {'shape':<6}  {'optional':<8}  description",
    ]
    for key, spec in features.items():
        shape = "[" + ", ".join(str(n) for n in spec["shape"]) + "]"
        optional = "yes" if spec["optional"] else "no"
        description = printable(spec.get("description", ""))
        lines.append(
            f"  {printable(key):<{key_width}}  {spec['dtype']:<5}  {shape:<6}  {optional:<8}  "
            f"{description}".rstrip()
        )
    return lines


# --- The plan ---------------------------------------------------------------------------------


def format_plan(report: Mapping, num_hosts: int) -> list[str]:
    """`recordforge plan`'s report as lines: inputs, the unusable ones by kind, each split's
    shards and why, the classes."""
    lines = [
        f"{plural(report['num_inputs'], 'input')}, {report['failed_inputs']:,} of them unusable "
        f"(planned for {plural(num_hosts, 'reading host')})"
    ]
    lines += format_unusable(report.get("unusable") or {})
    if report.get("splits_note"):
        lines.append(f"  {report['splits_note']}")
    for name, plan in report["splits"].items():
        lines.append(
            f"  {printable(name)}: {plural(plan['num_records'], 'record')}, "
            f"{human_size(plan['total_bytes'])} → {plural(plan['num_shards'], 'shard')}"
        )
        lines.append(f"    because {plan['reason']}")
    labels = report.get("labels")
    if labels:
        shown = ", ".join(printable(label) for label in labels[:8])
        lines.append(f"  {plural(len(labels), 'class')}: {shown}{', …' if len(labels) > 8 else ''}")
    if report.get("labels_note"):
        lines.append(f"  {report['labels_note']}")
    return lines


def format_unusable(unusable: Mapping[str, Mapping]) -> list[str]:
    """Unusable inputs by kind ({kind: {"count", "first": [errors]}}): a count, then the
    first few by name (and row), each with its message."""
    lines = []
    for kind, entry in unusable.items():
        lines.append(f"  unusable, {printable(kind)}: {plural(entry['count'], 'input')}")
        for error in entry["first"]:
            row = f", row {error['row']:,}" if error.get("row") is not None else ""
            lines.append(f"    {printable(error['path'])}{row}: {printable(error['message'])}")
        more = entry["count"] - len(entry["first"])
        if more > 0:
            lines.append(f"    … and {more:,} more")
    return lines


# --- Records ------------------------------------------------------------------------------------


def describe_image(data: bytes) -> str:
    """`JPEG 160×188 RGB, 3,134 bytes`, from the image's header only (nothing is decoded)."""
    from PIL import Image

    from recordforge.transforms.core.images.formats import webp_with_pad_byte

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a DecompressionBombWarning says nothing here
            with Image.open(io.BytesIO(webp_with_pad_byte(data))) as image:
                width, height = image.size
                return f"{image.format} {width}×{height} {image.mode}, {len(data):,} bytes"
    except Exception as error:  # noqa: BLE001  (any byte string may be stored; describe it)
        return f"{len(data):,} bytes, not a readable image ({printable(image_error(error))})"


def image_error(error: Exception) -> str:
    """Why Pillow could not read an image, in one line."""
    from PIL import UnidentifiedImageError

    if isinstance(error, UnidentifiedImageError):
        return "not an image format Pillow knows, or its header is damaged"
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def format_bytes(value: bytes) -> str:
    """Short UTF-8 text in quotes; anything else as `N bytes: b'prefix…'`."""
    if len(value) <= TEXT_LIMIT:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return '"' + printable(text).replace('"', '\\"') + '"'
    prefix = repr(value[:BYTES_PREFIX]) + ("…" if len(value) > BYTES_PREFIX else "")
    return f"{len(value):,} bytes: {prefix}"


def format_value(key: str, dtype: str, value) -> str:
    if dtype == "bytes":
        return describe_image(value) if key == keys.IMAGE_ENCODED else format_bytes(value)
    if dtype == "float":
        return f"{value:.7g}"  # float32 holds about 7 significant digits
    return str(value)


def format_values(key: str, dtype: str, values: Sequence) -> str:
    """A feature's values: one value as itself, a list in brackets (long lists cut short)."""
    if len(values) == 1:
        return format_value(key, dtype, values[0])
    shown = [format_value(key, dtype, v) for v in values[:LIST_LIMIT]]
    if len(values) > LIST_LIMIT:
        return f"[{', '.join(shown)}, …] ({len(values):,} values)"
    return f"[{', '.join(shown)}]"


ABSENT = "(absent)"


def preview_record(
    features: Mapping[str, tuple[str, Sequence]], expected: Sequence[str] = ()
) -> dict[str, str]:
    """{key: readable values} for a record given as {key: (dtype, values)}, keys sorted.

    Keys in `expected` (the dataset's features) that the record lacks are shown as (absent).
    """
    shown = {key: ABSENT for key in expected if key not in features}
    for key, (dtype, values) in features.items():
        shown[key] = format_values(key, dtype, values)
    return {printable(key): shown[key] for key in sorted(shown)}


def format_records(previews: Sequence[Mapping[str, str]], split: str, total: int) -> list[str]:
    """The record previews as text: a heading per record, then one line per feature."""
    lines = [f"First {len(previews):,} of {plural(total, 'record')} of {split}"]
    for number, preview in enumerate(previews):
        lines.append(f"  record {number}")
        width = max((len(key) for key in preview), default=0)
        for key, text in preview.items():
            lines.append(f"    {key:<{width}}  {text}")
    return lines
