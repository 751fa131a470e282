"""The `inspect --html` page: summary tables and a contact sheet of thumbnails, self-contained.

Pure: takes the summary dict (`transforms.core.reports.summary.summarize`), samples with their
thumbnails, record previews, statistics and errors (sections from report_html.py), and returns
one HTML document. Every piece of user data (labels, file names, feature keys and values) is
HTML-escaped; thumbnails are `data:` URIs, charts inline SVG; there are no scripts, and a
Content-Security-Policy forbids loading anything from elsewhere. The layout fits a laptop
screen: long values wrap, records are cards, and a table wider than the window scrolls by itself
rather than the page.
"""

from __future__ import annotations

import base64
import html
import io
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recordforge.pipelines.inspection import report_html
from recordforge.transforms.core.planning.sharding import human_size
from recordforge.transforms.core.reports.summary import image_error, plural, size_range, top_classes

THUMBNAIL_SIZE = 160
_JPEG_QUALITY = 85


@dataclass(frozen=True)
class Thumbnail:
    """A small viewable copy of an image as a data: URI, or why there is none."""

    uri: str | None
    width: int = 0
    height: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Sample:
    """One image on the contact sheet: its label (as shown), file name and thumbnail."""

    label: str
    filename: str
    thumbnail: Thumbnail


@dataclass(frozen=True)
class SampleGroup:
    """The samples of one class (label None: records without a label)."""

    label: str | None
    label_id: int | None
    samples: tuple[Sample, ...]
    num_records: int | None = None  # records of the class in the split, when known


@dataclass(frozen=True)
class ContactSheet:
    split: str
    groups: tuple[SampleGroup, ...]
    scanned: int  # records read to find the samples
    note: str = ""  # what was left out, in words


def make_thumbnail(data: bytes, size: int = THUMBNAIL_SIZE) -> Thumbnail:
    """Decode an image of any format and mode Pillow reads and shrink it to fit size×size.

    Opaque images become JPEG, images with transparency PNG; 16-bit and float images are scaled
    to 8 bits, palette and CMYK images converted, EXIF orientation applied, the first frame of an
    animation taken. An image that cannot be decoded gives a Thumbnail with `error` set.
    """
    from PIL import Image, ImageOps

    from recordforge.transforms.core.images.formats import webp_with_pad_byte

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning: it was converted already
            with Image.open(io.BytesIO(webp_with_pad_byte(data))) as image:
                image.draft(None, (size, size))  # JPEG: decode at a fraction of the size
                image = ImageOps.exif_transpose(image)
                image = _viewable(image)
                image.thumbnail((size, size))
                out = io.BytesIO()
                if image.mode == "RGBA":
                    image.save(out, "PNG", optimize=True)
                    mime = "image/png"
                else:
                    image.save(out, "JPEG", quality=_JPEG_QUALITY)
                    mime = "image/jpeg"
                width, height = image.size
    except Exception as error:  # noqa: BLE001  (whatever the bytes are, the page is still made)
        return Thumbnail(None, error=image_error(error))
    uri = f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode('ascii')}"
    return Thumbnail(uri, width, height)


def _viewable(image):
    """The image in a mode JPEG (L, RGB) or PNG (RGBA) saves as a browser shows it."""
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        # 16-bit (PNG) and wider greyscale: the range the values fit, mapped onto 0..255.
        image = image.convert("F")
        _, high = image.getextrema()
        full = next((top for top in (1.0, 255, 65535) if high <= top), high)
        return image.point(lambda value: value * (255 / full)).convert("L")
    if image.has_transparency_data:  # an alpha band, or a transparent palette entry or colour
        return image.convert("RGBA")
    if image.mode in ("L", "RGB"):
        return image
    return image.convert("L" if image.mode in ("1", "LA") else "RGB")


# --- The page -----------------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { margin: 0 0 .3em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
h1, h2, h3, p, td, figcaption { overflow-wrap: anywhere; }
h2 small { color: #666; font-weight: normal; }
table { border-collapse: collapse; margin: .5em 0; }
.wide { max-width: 100%; overflow-x: auto; }
th, td { padding: .2em .6em; border-bottom: 1px solid #eee; text-align: left;
         vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: inline-block; height: .8em; background: #4a7bd0; vertical-align: middle; }
.meta { color: #555; margin: .2em 0; }
.note { color: #a35200; }
.group { margin: 1em 0; }
.group h3 { margin: .4em 0; } .group h3 small { color: #666; font-weight: normal; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
figure.sample { margin: 0; width: 172px; padding: 5px; border: 1px solid #ddd;
                background: #fafafa; }
figure.sample .frame { width: 160px; height: 160px; display: flex; align-items: center;
                        justify-content: center; margin: 0 auto;
                        background: repeating-conic-gradient(#eee 0 25%, #fff 0 50%)
                        0 0 / 16px 16px; }
figure.sample img { max-width: 160px; max-height: 160px; display: block; }
.placeholder { width: 150px; height: 150px; padding: 5px; background: #fde8e8; color: #8a1c1c;
               font-size: 12px; overflow: hidden; overflow-wrap: anywhere; }
figcaption { font-size: 12px; margin-top: 4px; overflow-wrap: anywhere; }
figcaption .label { font-weight: bold; display: block; }
figcaption .file { color: #555; display: block; }
.records { display: grid; grid-template-columns: repeat(auto-fill, minmax(24em, 1fr));
           gap: 10px; }
section.record { border: 1px solid #ddd; padding: 4px 8px; min-width: 0; }
section.record h3 { margin: .2em 0; font-size: 14px; }
table.record { width: 100%; table-layout: fixed; margin: 0; }
table.record th { width: 42%; font-weight: normal; font-size: 12px; color: #555;
                  overflow-wrap: break-word; }
table.record td { font-family: ui-monospace, monospace; font-size: 12px; }
"""

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def render_page(
    summary: Mapping,
    sheet: ContactSheet | None,
    records: Sequence[Mapping[str, str]],
    records_split: str,
    *,
    stats: Mapping | None = None,
    errors: Mapping[str, Mapping] | None = None,
) -> str:
    """The whole page: header, splits, shard sizes, labels, features, image distributions,
    column statistics, errors, contact sheet, records.

    Args:
        stats: statistics of the first records of `records_split` (SampleStats.to_dict).
        errors: the errors by kind with the first few of each (ErrorSample.to_dict).
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(summary['name'])} · recordforge inspect</title>",
        f"<style>{_STYLE}{report_html.STYLE}</style>",
        "</head><body>",
        *_header(summary),
        *_splits(summary),
        *_labels(summary.get("labels")),
        *_features(summary["features"]),
    ]
    if stats is not None:
        total = summary["splits"].get(records_split, {}).get("num_records", stats["records"])
        parts += report_html.images_section(stats, records_split, total)
        parts += report_html.columns_section(stats, records_split, total)
    if errors is not None:
        parts += report_html.errors_section(errors, summary["errors"]["files"])
    if sheet is not None:
        parts += _contact_sheet(sheet)
    parts += _records(records, records_split, summary)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _header(summary: Mapping) -> list[str]:
    errors = summary["errors"]
    kinds = ", ".join(f"{_e(kind)} {count:,}" for kind, count in errors["by_kind"].items())
    parts = [
        f"<h1>{_e(summary['name'])}</h1>",
        f'<p class="meta">recordforge {_e(summary["tool_version"])} · created '
        f"{_e(summary['created'])} · compression {_e(summary['compression'])}</p>",
    ]
    if summary.get("folder"):
        parts.append(f'<p class="meta">{_e(summary["folder"])}</p>')
    parts.append(
        f'<p class="meta">{plural(summary["num_inputs"], "input")} → '
        f"{plural(summary['num_records'], 'record')}, {plural(errors['count'], 'error')}"
        f"{f' ({kinds})' if kinds else ''}</p>"
    )
    return parts


def _splits(summary: Mapping) -> list[str]:
    parts = [
        "<h2>Splits</h2>",
        '<div class="wide"><table class="splits"><tr><th>split</th><th class="n">records</th>'
        '<th class="n">shards</th><th class="n">bytes</th><th class="n">min shard</th>'
        '<th class="n">median shard</th><th class="n">max shard</th></tr>',
    ]
    for name, split in summary["splits"].items():
        sizes = split["shard_bytes"]
        cells = [
            f"{split['num_records']:,}",
            f"{split['num_shards']:,}",
            human_size(split["num_bytes"]),
            human_size(sizes["min"]),
            human_size(sizes["median"]),
            human_size(sizes["max"]),
        ]
        parts.append(
            f"<tr><td>{_e(name)}</td>" + "".join(f'<td class="n">{c}</td>' for c in cells) + "</tr>"
        )
    parts.append("</table></div>")
    parts.append("<h2>Shard sizes</h2>")
    parts.append(
        '<div class="wide"><table class="histogram"><tr><th>split</th><th>shard size</th>'
        '<th class="n">shards</th><th></th></tr>'
    )
    for name, split in summary["splits"].items():
        largest = max((entry["count"] for entry in split["histogram"]), default=0)
        for i, entry in enumerate(split["histogram"]):
            width = round(200 * entry["count"] / largest) if largest else 0
            parts.append(
                f"<tr><td>{_e(name) if i == 0 else ''}</td>"
                f"<td>{_e(size_range(entry['low'], entry['high']))}</td>"
                f'<td class="n">{entry["count"]:,}</td>'
                f'<td><span class="bar" style="width:{width}px"></span></td></tr>'
            )
    parts.append("</table></div>")
    return parts


def _labels(labels: Mapping | None) -> list[str]:
    if labels is None:
        return ["<h2>Labels</h2>", "<p>None: the records have no label feature.</p>"]
    classes = labels["classes"]
    total = sum(entry["total"] for entry in classes)
    parts = [f"<h2>Labels <small>({plural(len(classes), 'class')})</small></h2>"]
    if labels["source"] != "manifest":
        parts.append(
            '<p class="note">The manifest has no label counts (convert records them; reshard, '
            "WriteDataset and earlier versions do not): "
            f"counted by reading all {total:,} records.</p>"
        )
    shown, hidden = top_classes(classes)
    splits = labels["splits"] if len(labels["splits"]) > 1 else []
    head = "".join(f'<th class="n">{_e(s)}</th>' for s in splits)
    parts.append(
        f'<div class="wide"><table class="labels"><tr><th class="n">id</th><th>class</th>{head}'
        '<th class="n">records</th><th class="n">share</th><th></th></tr>'
    )
    largest = max((entry["total"] for entry in shown), default=0)
    for entry in shown:
        share = entry["total"] / total if total else 0.0
        width = round(200 * entry["total"] / largest) if largest else 0
        ident = "" if entry["id"] is None else entry["id"]
        cells = "".join(f'<td class="n">{entry["counts"][s]:,}</td>' for s in splits)
        parts.append(
            f'<tr><td class="n">{ident}</td><td>{_e(entry["label"])}</td>{cells}'
            f'<td class="n">{entry["total"]:,}</td><td class="n">{share:.1%}</td>'
            f'<td><span class="bar" style="width:{width}px"></span></td></tr>'
        )
    parts.append("</table></div>")
    if hidden:
        rest = total - sum(entry["total"] for entry in shown)
        parts.append(f"<p>… {hidden:,} more classes with {plural(rest, 'record')}.</p>")
    return parts


def _features(features: Mapping[str, Mapping]) -> list[str]:
    parts = [
        "<h2>Features</h2>",
        '<div class="wide"><table class="features"><tr><th>key</th><th>dtype</th><th>shape</th>'
        "<th>optional</th><th>description</th></tr>",
    ]
    for key, spec in features.items():
        shape = "[" + ", ".join(str(n) for n in spec["shape"]) + "]"
        parts.append(
            f"<tr><td><code>{_e(key)}</code></td><td>{_e(spec['dtype'])}</td><td>{shape}</td>"
            f"<td>{'yes' if spec['optional'] else 'no'}</td>"
            f"<td>{_e(spec.get('description', ''))}</td></tr>"
        )
    parts.append("</table></div>")
    return parts


def _contact_sheet(sheet: ContactSheet) -> list[str]:
    count = sum(len(group.samples) for group in sheet.groups)
    parts = [
        f"<h2>Contact sheet: {_e(sheet.split)}</h2>",
        f'<p class="meta">{plural(count, "image")} from the first '
        f"{plural(sheet.scanned, 'record')} of {_e(sheet.split)}, grouped by label.</p>",
    ]
    if sheet.note:
        parts.append(f'<p class="note">{_e(sheet.note)}</p>')
    for group in sheet.groups:
        title = "no label" if group.label is None else group.label
        details = []
        if group.label_id is not None and str(group.label_id) != group.label:
            details.append(f"id {group.label_id}")
        if group.num_records is not None:
            details.append(f"{plural(group.num_records, 'record')} in {sheet.split}")
        small = f" <small>{_e(' · '.join(details))}</small>" if details else ""
        data_label = "" if group.label is None else group.label
        parts.append(f'<section class="group" data-label="{_e(data_label)}">')
        parts.append(f'<h3><span class="group-label">{_e(title)}</span>{small}</h3>')
        if not group.samples:
            found = (
                "no records of this class in the split"
                if group.num_records == 0
                else f"none among the first {sheet.scanned:,} records"
            )
            parts.append(f'<p class="note">{_e(found)}</p>')
        parts.append('<div class="grid">')
        parts += [_figure(sample) for sample in group.samples]
        parts.append("</div></section>")
    return parts


def _figure(sample: Sample) -> str:
    thumb = sample.thumbnail
    alt = f"{sample.label}: {sample.filename}" if sample.label else sample.filename
    if thumb.uri is not None:
        picture = (
            f'<img src="{thumb.uri}" width="{thumb.width}" height="{thumb.height}" alt="{_e(alt)}">'
        )
        css = "sample"
    else:
        picture = (
            f'<div class="placeholder" role="img" aria-label="{_e(alt)}">'
            f"cannot show this image: {_e(thumb.error or 'unknown error')}</div>"
        )
        css = "sample broken"
    return (
        f'<figure class="{css}" data-label="{_e(sample.label)}"><div class="frame">{picture}</div>'
        f'<figcaption><span class="label">{_e(sample.label or "no label")}</span>'
        f'<span class="file">{_e(sample.filename)}</span></figcaption></figure>'
    )


def _records(records: Sequence[Mapping[str, str]], split: str, summary: Mapping) -> list[str]:
    if not records:
        return []
    total = summary["splits"].get(split, {}).get("num_records", len(records))
    columns: list[str] = []
    for record in records:
        columns += [key for key in record if key not in columns]
    parts = [
        f"<h2>First {len(records):,} of {plural(total, 'record')} of {_e(split)}</h2>",
        '<div class="records">',
    ]
    # One card per record, a row per feature: any number of features fits the window.
    for number, record in enumerate(records):
        rows = "".join(
            f"<tr><th>{_e(key)}</th><td>{_e(record.get(key, '—'))}</td></tr>" for key in columns
        )
        parts.append(
            f'<section class="record" data-record="{number}"><h3>record {number}</h3>'
            f'<table class="record">{rows}</table></section>'
        )
    parts.append("</div>")
    return parts
