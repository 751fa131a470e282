"""Sections of the `inspect --html` page about the data: image distributions as small inline SVG
bar charts, per-column statistics and the errors by kind.

Pure, like contact_sheet.py (which puts the page together): takes the dicts of
transforms.core.reports.statistics and returns HTML fragments. User data is HTML-escaped; the charts
are plain SVG elements (no scripts, nothing loaded), drawn with the page's own stylesheet. They
are written here rather than by a plotting library: a bar is one <rect>, and matplotlib (not a
dependency of recordforge) would embed its own fonts and paths, tens of KB per chart.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from recordforge.transforms.core.reports.summary import plural, shorten

# Chart geometry, in CSS pixels: a label column, bars up to BAR_WIDTH, then the count.
CHART_LABEL_WIDTH = 104
BAR_WIDTH = 150
CHART_COUNT_WIDTH = 56
ROW_HEIGHT = 18
LABEL_CHARACTERS = 17
VALUE_CHARACTERS = 40  # of a most frequent value, as shown

STYLE = """
.plots { display: flex; flex-wrap: wrap; gap: 8px 28px; }
figure.plot { margin: .4em 0; }
figure.plot figcaption { font-weight: bold; font-size: 13px; margin-bottom: 2px; }
svg.plot text { font: 11px system-ui, sans-serif; fill: #333; }
svg.plot rect.bar { fill: #4a7bd0; }
table.columns td.n, table.columns td.dtype { white-space: nowrap; }
table.columns td.top { font-family: ui-monospace, monospace; font-size: 12px; }
table.errors td { font-size: 13px; }
section.errors h3 small { color: #666; font-weight: normal; }
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def bar_chart(title: str, bars: Sequence[tuple[str, int]]) -> str:
    """A horizontal bar chart as an inline <svg>: one labelled bar per (label, count)."""
    width = CHART_LABEL_WIDTH + BAR_WIDTH + CHART_COUNT_WIDTH
    height = ROW_HEIGHT * len(bars) + 2
    largest = max((count for _, count in bars), default=0)
    parts = [
        f'<figure class="plot" data-title="{_e(title)}"><figcaption>{_e(title)}</figcaption>',
        f'<svg class="plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{_e(title)}">',
    ]
    for row, (label, count) in enumerate(bars):
        top = row * ROW_HEIGHT
        length = max(1, round(BAR_WIDTH * count / largest)) if count and largest else 0
        text = shorten(label, LABEL_CHARACTERS)
        parts.append(
            f'<text x="{CHART_LABEL_WIDTH - 6}" y="{top + 13}" text-anchor="end">{_e(text)}</text>'
            f'<rect class="bar" x="{CHART_LABEL_WIDTH}" y="{top + 3}" width="{length}" '
            f'height="{ROW_HEIGHT - 6}" data-label="{_e(label)}" data-count="{count}">'
            f"<title>{_e(label)}: {count:,}</title></rect>"
            f'<text x="{CHART_LABEL_WIDTH + length + 4}" y="{top + 13}">{count:,}</text>'
        )
    parts.append("</svg></figure>")
    return "".join(parts)


def sample_note(stats: Mapping, split: str, total: int) -> str:
    """Which records the statistics come from, in words."""
    records = stats["records"]
    if records >= total:
        return f"From all {plural(total, 'record')} of {_e(split)}."
    return f"From the first {records:,} of {plural(total, 'record')} of {_e(split)} (--scan-limit)."


def images_section(stats: Mapping, split: str, total: int) -> list[str]:
    """Distributions of the images' width, height, format and channels."""
    images = stats.get("images")
    if not images:
        return []
    parts = [
        f"<h2>Images <small>({plural(images['count'], 'image')})</small></h2>",
        f'<p class="meta">{sample_note(stats, split, total)} As each record\'s image/width, '
        "image/height, image/format and image/channels say.</p>",
        '<div class="plots">',
    ]
    for key, title in (("width", "width (px)"), ("height", "height (px)")):
        distribution = images[key]
        if not distribution["histogram"]:
            continue
        bars = [
            (_pixels(bin_["low"], bin_["high"]), bin_["count"])
            for bin_ in distribution["histogram"]
        ]
        parts.append(bar_chart(title, bars))
    parts.append(bar_chart("format", list(images["formats"].items())))
    parts.append(bar_chart("channels", [(_channels(c), n) for c, n in images["channels"].items()]))
    parts.append("</div>")
    return parts


def _pixels(low: int, high: int) -> str:
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _channels(count: str) -> str:
    names = {"1": "1 (grey)", "2": "2 (grey+alpha)", "3": "3 (RGB)", "4": "4 (RGBA)"}
    return names.get(count, count)


def columns_section(stats: Mapping, split: str, total: int) -> list[str]:
    """Per feature column: missing, min/max/mean of numbers, distinct and most frequent values."""
    columns = stats.get("columns") or []
    if not columns:
        return []
    records = stats["records"]
    parts = [
        f"<h2>Columns <small>({plural(len(columns), 'column')})</small></h2>",
        f'<p class="meta">{sample_note(stats, split, total)}</p>',
        '<div class="wide"><table class="columns"><tr><th>column</th><th>dtype</th>'
        '<th class="n">missing</th><th class="n">min</th><th class="n">max</th>'
        '<th class="n">mean</th><th class="n">distinct</th><th>most frequent</th></tr>',
    ]
    for column in columns:
        share = column["missing"] / records if records else 0.0
        missing = f"{column['missing']:,} ({share:.0%})" if column["missing"] else "0"
        numbers = [_number(column[field]) for field in ("min", "max", "mean")]
        distinct = f"{column['distinct']:,}"
        if column["top"] and column["top"][0]["count"] == 1 and column["distinct"] > 1:
            top = "every value once"
        else:
            top = ", ".join(
                f"{_e(shorten(v['value'], VALUE_CHARACTERS))} ×{v['count']:,}"
                for v in column["top"]
            )
            if column["distinct"] > len(column["top"]):
                top += ", …"
        if column["prefix_counted"]:
            top += " (long values counted by their first 100 bytes)"
        parts.append(
            f'<tr data-column="{_e(column["key"])}"><td><code>{_e(column["key"])}</code></td>'
            f'<td class="dtype">{_e(column["dtype"])}</td>'
            f'<td class="n missing">{missing}</td>'
            + "".join(f'<td class="n">{n}</td>' for n in numbers)
            + f'<td class="n">{distinct}</td><td class="top">{top}</td></tr>'
        )
    parts.append("</table></div>")
    return parts


def _number(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e15 else f"{value:.4g}"
    return f"{value:,}"


def errors_section(errors: Mapping[str, Mapping], files: Sequence[str]) -> list[str]:
    """The errors by kind: how many, the first few (input, stage, message), where the rest are."""
    count = sum(entry["count"] for entry in errors.values())
    parts = [f"<h2>Errors <small>({plural(count, 'input')})</small></h2>"]
    if not count:
        return [*parts, "<p>None: every input became a record.</p>"]
    parts.append(f'<p class="meta">Every one is a line in {", ".join(_e(f) for f in files)}.</p>')
    for kind, entry in errors.items():
        parts.append(f'<section class="errors" data-kind="{_e(kind)}">')
        parts.append(f"<h3>{_e(kind)} <small>{plural(entry['count'], 'input')}</small></h3>")
        if entry["first"]:
            parts.append(
                '<div class="wide"><table class="errors"><tr><th>input</th><th>stage</th>'
                "<th>message</th></tr>"
            )
            for error in entry["first"]:
                row = f", row {error['row']:,}" if error.get("row") is not None else ""
                parts.append(
                    f"<tr><td>{_e(error['path'])}{row}</td><td>{_e(error['stage'])}</td>"
                    f"<td>{_e(error['message'])}</td></tr>"
                )
            parts.append("</table></div>")
        more = entry["count"] - len(entry["first"])
        if more > 0:
            parts.append(f'<p class="more">… and {more:,} more</p>')
        parts.append("</section>")
    return parts
