"""The reports: `plan` naming the unusable inputs, and the data sections of `inspect --html`
(image distributions as inline SVG charts, column statistics, errors by kind) on a laptop-sized
window of the real browser; and the statistics they are made of."""

from __future__ import annotations

import collections
import csv
import io
import json
import random
import re
import statistics

import pytest
from conftest import make_image, open_page, read_dataset, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from recordforge.pipelines.inspection.report_html import BAR_WIDTH, bar_chart
from recordforge.transforms.core.records import ErrorRecord
from recordforge.transforms.core.reports.statistics import (
    ErrorSample,
    SampleStats,
    column_keys,
    int_histogram,
)
from recordforge.transforms.core.reports.summary import format_plan

LAPTOP = (1100, 800)  # CSS pixels: a small laptop screen
BAR_COLOUR = (0x4A, 0x7B, 0xD0)

# --- Statistics as data ---------------------------------------------------------------------


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=300), st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_int_histogram_bins_are_whole_numbers_that_do_not_overlap(values, bins):
    histogram = int_histogram(values, bins)
    assert 1 <= len(histogram) <= bins
    assert histogram[0]["low"] == min(values) and histogram[-1]["high"] == max(values)
    for before, after in zip(histogram, histogram[1:], strict=False):
        assert after["low"] == before["high"] + 1  # contiguous, disjoint
        assert before["high"] - before["low"] == histogram[0]["high"] - histogram[0]["low"]
    for entry in histogram:
        inside = sum(entry["low"] <= v <= entry["high"] for v in values)
        assert entry["count"] == inside
    assert sum(entry["count"] for entry in histogram) == len(values)


def test_column_statistics():
    stats = SampleStats(
        {"n": "int64", "x": "float", "s": "bytes", "tags": "bytes", "label": "int64"},
        column_keys(["n", "x", "s", "tags", "label", "label/text"], labelled=True),
    )
    long = b"y" * 150
    records = [
        {
            "n": ("int64", [3]),
            "x": ("float", [0.5]),
            "s": ("bytes", [b"a"]),
            "label": ("int64", [0]),
        },
        {"n": ("int64", [7]), "s": ("bytes", [b"b"]), "tags": ("bytes", [b"p", b"q"])},
        {"n": ("int64", [3]), "x": ("float", [2.5]), "s": ("bytes", [long + b"1"])},
        {"n": ("int64", [-1]), "x": ("float", []), "s": ("bytes", [long + b"2"])},
    ]
    for record in records:
        stats.add(record)
    result = stats.to_dict()
    assert result["records"] == 4 and result["images"] is None
    columns = {column["key"]: column for column in result["columns"]}
    assert list(columns) == ["n", "x", "s", "tags"]  # the label has its own section
    n, x, s, tags = (columns[k] for k in ("n", "x", "s", "tags"))
    assert (n["missing"], n["min"], n["max"], n["mean"]) == (0, -1, 7, 3.0)
    assert n["top"][0] == {"value": "3", "count": 2} and n["distinct"] == 3
    # An empty list counts as missing, like an absent key.
    assert (x["missing"], x["min"], x["max"], x["mean"]) == (2, 0.5, 2.5, 1.5)
    assert (s["min"], s["mean"], s["distinct"]) == (None, None, 3)
    top = s["top"][0]
    assert top["count"] == 2 and top["value"].startswith("100 bytes: b'yyy")
    assert s["prefix_counted"] and not n["prefix_counted"]
    assert (tags["missing"], tags["values"], tags["distinct"]) == (3, 2, 2)


def test_image_statistics():
    stats = SampleStats({}, [])
    for width, height, fmt, channels in [
        (10, 20, b"jpeg", 3),
        (30, 20, b"png", 4),
        (10, 21, b"jpeg", 1),
    ]:
        stats.add(
            {
                "image/width": ("int64", [width]),
                "image/height": ("int64", [height]),
                "image/format": ("bytes", [fmt]),
                "image/channels": ("int64", [channels]),
            }
        )
    images = stats.to_dict()["images"]
    assert images["count"] == 3
    assert images["formats"] == {"jpeg": 2, "png": 1}
    assert images["channels"] == {"1": 1, "3": 1, "4": 1}
    assert (images["width"]["min"], images["width"]["max"]) == (10, 30)
    assert sum(b["count"] for b in images["height"]["histogram"]) == 3


def test_column_keys_leave_out_what_has_its_own_section():
    image_keys = ["image/encoded", "image/width", "image/filename", "image/class/label"]
    assert column_keys([*image_keys, "note"], labelled=True) == ["note"]
    assert column_keys(["label", "label/text", "x"], labelled=True) == ["x"]
    assert column_keys(["label", "x"], labelled=False) == ["label", "x"]  # just a column


def _errors(count: int) -> list[ErrorRecord]:
    kinds = ("NotAnImage", "EmptyFile", "BadCell")
    return [
        ErrorRecord(f"/in/{i % 7}.jpg", i if i % 3 else None, "probe", kinds[i % 3], f"m{i}")
        for i in range(count)
    ]


@given(st.integers(0, 40), st.randoms(use_true_random=False), st.integers(1, 5))
@settings(max_examples=100, deadline=None)
def test_error_sample_keeps_the_first_of_each_kind_in_any_order(count, rng, parts):
    errors = _errors(count)
    expected = collections.defaultdict(list)
    for error in sorted(errors, key=ErrorRecord.sort_key):
        expected[error.error].append(error)
    shuffled = list(errors)
    rng.shuffle(shuffled)
    samples = [ErrorSample(3) for _ in range(parts)]
    for index, error in enumerate(shuffled):
        samples[index % parts].add(error)
    merged = samples[0]
    for other in samples[1:]:
        merged.merge(other)
    assert merged.counts == collections.Counter(e.error for e in errors)
    assert merged.first == {kind: kept[:3] for kind, kept in expected.items()}
    assert merged.full(expected) == all(len(kept) >= 3 for kept in expected.values())


def test_plan_text_counts_in_words():
    report = {
        "num_inputs": 1,
        "failed_inputs": 0,
        "splits": {"train": {"num_records": 1, "total_bytes": 10, "num_shards": 1, "reason": "r"}},
        "labels": ["only"],
        "unusable": {},
    }
    lines = format_plan(report, 1)
    assert lines[0] == "1 input, 0 of them unusable (planned for 1 reading host)"
    assert lines[1] == "  train: 1 record, 10 B → 1 shard"
    assert lines[3] == "  1 class: only"
    report["unusable"] = {
        "Bad\x1b[31m": {"count": 7, "first": [{"path": "/a\nb", "row": 1234, "message": "x"}]}
    }
    report["labels"] = [f"c{i}" for i in range(9)]
    lines = format_plan(report, 2)
    assert lines[0].endswith("(planned for 2 reading hosts)")
    assert lines[1:4] == [
        "  unusable, Bad\\x1b[31m: 7 inputs",
        "    /a\\nb, row 1,234: x",
        "    … and 6 more",
    ]
    assert lines[-1] == "  9 classes: c0, c1, c2, c3, c4, c5, c6, c7, …"


def test_bar_chart_bars_are_proportional_and_escaped():
    svg = bar_chart("t<", [("a", 10), ("<b>", 5), ("c", 0), ("d", 1)])
    widths = [int(w) for w in re.findall(r'<rect class="bar"[^>]* width="(\d+)"', svg)]
    assert widths == [BAR_WIDTH, BAR_WIDTH // 2, 0, round(BAR_WIDTH / 10)]
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "t&lt;" in svg


# --- `plan` names the unusable inputs -------------------------------------------------------


def test_plan_names_the_first_unusable_inputs_of_each_kind(tmp_path, cli):
    folder = tmp_path / "in" / "only"
    for index in range(3):
        make_image(folder / f"good{index}.png", "PNG", seed=index)
    for index in range(7):
        (folder / f"bad{index}.jpg").write_bytes(b"garbage %d" % index)
    for index in range(2):
        (folder / f"empty{index}.jpg").write_bytes(b"")
    result = cli("plan", tmp_path / "in")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "12 inputs, 9 of them unusable (planned for 1 reading host)"
    assert lines[1:3] == [
        "  unusable, EmptyFile: 2 inputs",
        f"    {folder}/empty0.jpg: the file is empty (0 bytes)",
    ]
    assert lines[4] == "  unusable, NotAnImage: 7 inputs"
    assert [line.split(":")[0].strip() for line in lines[5:10]] == [
        f"{folder}/bad{i}.jpg" for i in range(5)
    ]
    assert lines[10] == "    … and 2 more"
    assert re.match(r"  train: 3 records, .* → 1 shard$", lines[11])
    assert "  1 class: only" in lines
    report = json.loads(cli("plan", tmp_path / "in", "--json").stdout)
    assert report["unusable"]["NotAnImage"]["count"] == 7
    assert [e["path"] for e in report["unusable"]["NotAnImage"]["first"]] == [
        f"{folder}/bad{i}.jpg" for i in range(5)
    ]


def test_plan_names_unusable_csv_rows(tmp_path, cli):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n3\n4,5,6\n7,8\n")
    result = cli("plan", table)
    assert result.returncode == 0, result.stderr
    assert "  unusable, WrongFieldCount: 2 inputs" in result.stdout
    assert f"    {table}, row 2: expected 2 fields, found 1: '3'" in result.stdout
    assert "  train: 2 records," in result.stdout


# --- The --html page: data sections on a laptop screen ----------------------------------------

SIZES = [(40, 30), (41, 30), (64, 48), (64, 48), (120, 90), (300, 200), (33, 77), (500, 20)]
MODES = [("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGBA"), ("PNG", "L"), ("GIF", "P")]


@pytest.fixture(scope="module")
def mixed_dataset(tmp_path_factory):
    """Images of many sizes, formats and modes in two classes; 7 garbage files and 2 empty
    ones; converted and inspected with --html."""
    root = tmp_path_factory.mktemp("report")
    photos = root / "photos"
    for index in range(40):
        fmt, mode = MODES[index % len(MODES)]
        make_image(
            photos / ("ab"[index % 2]) / f"p{index:02d}.{fmt.lower()}",
            fmt,
            size=SIZES[index % len(SIZES)],
            mode=mode,
            seed=index,
        )
    for index in range(7):
        (photos / "a" / f"bad{index}.jpg").write_bytes(b"garbage %d" % index)
    for index in range(2):
        (photos / "b" / f"empty{index}.jpg").write_bytes(b"")
    out = root / "out"
    assert run_cli("convert", photos, "-o", out).returncode == 0
    page = root / "page.html"
    result = run_cli("inspect", out, "--html", page)
    assert result.returncode == 0, result.stderr
    return {"photos": photos, "out": out, "page": page}


def _at_laptop_size(browser, page):
    browser.set_window_size(*LAPTOP)
    open_page(browser, page)
    width = browser.execute_script("return document.documentElement.clientWidth")
    assert width <= LAPTOP[0]
    return width


def _no_horizontal_overflow(browser) -> None:
    scroll, client = browser.execute_script(
        "const e = document.documentElement; return [e.scrollWidth, e.clientWidth]"
    )
    assert scroll <= client, f"the page is {scroll} px wide in a {client} px window"


def _bar_pixels(element) -> int:
    shot = Image.open(io.BytesIO(element.screenshot_as_png)).convert("RGB")
    return sum(
        1
        for pixel in shot.getdata()
        if all(abs(a - b) <= 12 for a, b in zip(pixel, BAR_COLOUR, strict=True))
    )


def test_html_image_distributions_render_as_charts(mixed_dataset, browser):
    from selenium.webdriver.common.by import By

    _at_laptop_size(browser, mixed_dataset["page"])
    _no_horizontal_overflow(browser)
    _, splits = read_dataset(mixed_dataset["out"])
    records = splits["train"]
    truth = {
        "width": [int(r["image/width"]) for r in records],
        "height": [int(r["image/height"]) for r in records],
        "format": collections.Counter(r["image/format"].decode() for r in records),
        "channels": collections.Counter(int(r["image/channels"]) for r in records),
    }
    charts = {
        figure.get_attribute("data-title"): figure
        for figure in browser.find_elements(By.CSS_SELECTOR, "figure.plot")
    }
    assert list(charts) == ["width (px)", "height (px)", "format", "channels"]
    for title, figure in charts.items():
        svg = figure.find_element(By.CSS_SELECTOR, "svg.plot")
        assert svg.is_displayed() and svg.size["width"] > 100 and svg.size["height"] > 10
        right = svg.location["x"] + svg.size["width"]
        assert right <= LAPTOP[0], title
        bars = svg.find_elements(By.CSS_SELECTOR, "rect.bar")
        counts = [int(bar.get_attribute("data-count")) for bar in bars]
        assert sum(counts) == len(records), title
        # Drawn: lengths as the browser laid them out, proportional to the counts.
        lengths = [bar.rect["width"] for bar in bars]
        largest = max(counts)
        for count, length in zip(counts, lengths, strict=True):
            assert abs(length - BAR_WIDTH * count / largest) <= 1.5, (title, count, length)
        assert _bar_pixels(svg) > 0.5 * sum(lengths) * 8, title
    labels = {
        title: [bar.get_attribute("data-label") for bar in charts[title].find_elements(
            By.CSS_SELECTOR, "rect.bar")]
        for title in ("format", "channels")
    }  # fmt: skip
    format_counts = [
        int(bar.get_attribute("data-count"))
        for bar in charts["format"].find_elements(By.CSS_SELECTOR, "rect.bar")
    ]
    assert dict(zip(labels["format"], format_counts, strict=True)) == truth["format"]
    assert {int(label.split()[0]) for label in labels["channels"]} == set(truth["channels"])
    for axis in ("width", "height"):
        bars = charts[f"{axis} (px)"].find_elements(By.CSS_SELECTOR, "rect.bar")
        for bar in bars:
            low, _, high = bar.get_attribute("data-label").replace(",", "").partition("–")
            inside = sum(int(low) <= v <= int(high or low) for v in truth[axis])
            assert inside == int(bar.get_attribute("data-count")), (axis, low, high)


def test_html_errors_are_grouped_by_kind_with_the_first_few(mixed_dataset, browser):
    from selenium.webdriver.common.by import By

    _at_laptop_size(browser, mixed_dataset["page"])
    sections = {
        section.get_attribute("data-kind"): section
        for section in browser.find_elements(By.CSS_SELECTOR, "section.errors")
    }
    assert list(sections) == ["EmptyFile", "NotAnImage"]
    bad = sections["NotAnImage"]
    assert bad.find_element(By.TAG_NAME, "h3").text == "NotAnImage 7 inputs"
    rows = bad.find_elements(By.CSS_SELECTOR, "table.errors tr")[1:]
    photos = mixed_dataset["photos"]
    assert [row.find_element(By.TAG_NAME, "td").text for row in rows] == [
        f"{photos}/a/bad{i}.jpg" for i in range(5)
    ]
    assert "not a recognised image" in rows[0].text
    assert bad.find_element(By.CSS_SELECTOR, "p.more").text == "… and 2 more"
    empty = sections["EmptyFile"]
    assert len(empty.find_elements(By.CSS_SELECTOR, "table.errors tr")) == 3
    assert empty.find_elements(By.CSS_SELECTOR, "p.more") == []
    heading = browser.find_element(By.XPATH, "//h2[starts-with(., 'Errors')]")
    assert heading.text == "Errors (9 inputs)"


@pytest.fixture(scope="module")
def wide_table(tmp_path_factory):
    """A CSV as wide as they come: 16 columns with long names, long unbreakable values."""
    root = tmp_path_factory.mktemp("wide")
    rng = random.Random(5)
    names = [f"measurement_{i:02d}_with_a_rather_long_column_name" for i in range(12)]
    header = ["id", "url", "blob", "level", *names]
    rows = []
    for index in range(60):
        row = {
            "id": str(index),
            "url": "https://example.org/" + "x" * (80 + index) + f"/{index}",
            "blob": "".join(rng.choice("ACGT") for _ in range(200)),
            "level": ("low", "mid", "high", "mid")[index % 4],
        }
        for position, name in enumerate(names):
            missing = (index + position) % 9 == 0
            row[name] = "" if missing else f"{rng.uniform(-50, 50):.3f}"
        rows.append(row)
    table = root / "wide.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, header)
        writer.writeheader()
        writer.writerows(rows)
    out = root / "out"
    result = run_cli("convert", table, "-o", out)
    assert result.returncode == 0, result.stderr
    page = root / "page.html"
    result = run_cli("inspect", out, "--html", page, "--records", "12")
    assert result.returncode == 0, result.stderr
    return {"rows": rows, "names": names, "page": page}


def test_html_fits_a_laptop_screen_whatever_the_table(wide_table, browser):
    from selenium.webdriver.common.by import By

    width = _at_laptop_size(browser, wide_table["page"])
    _no_horizontal_overflow(browser)
    cards = browser.find_elements(By.CSS_SELECTOR, ".records section.record")
    assert len(cards) == 12
    for card in cards:
        assert card.location["x"] + card.size["width"] <= width
        values = card.find_elements(By.CSS_SELECTOR, "td")
        assert len(values) == 16 and all(v.is_displayed() for v in values)
    # Every table on the page ends inside the window.
    for table in browser.find_elements(By.TAG_NAME, "table"):
        assert table.location["x"] + table.size["width"] <= width + 1, table.get_attribute("class")


def test_html_column_statistics(wide_table, browser):
    from selenium.webdriver.common.by import By

    _at_laptop_size(browser, wide_table["page"])
    rows = {
        row.get_attribute("data-column"): row
        for row in browser.find_elements(By.CSS_SELECTOR, "table.columns tr[data-column]")
    }
    assert list(rows) == sorted(["id", "url", "blob", "level", *wide_table["names"]])
    source = wide_table["rows"]
    for name in wide_table["names"]:
        cells = [td.text for td in rows[name].find_elements(By.TAG_NAME, "td")]
        values = [float(row[name]) for row in source if row[name]]
        missing = len(source) - len(values)
        assert cells[1] == "float"
        assert cells[2] == f"{missing} ({missing / len(source):.0%})"
        low, high, mean = (float(c.replace(",", "")) for c in cells[3:6])
        # float32 storage, 4 significant digits shown
        assert low == pytest.approx(min(values), rel=1e-3, abs=0.01)
        assert high == pytest.approx(max(values), rel=1e-3, abs=0.01)
        assert mean == pytest.approx(statistics.fmean(values), rel=2e-3, abs=0.01)
    level = [td.text for td in rows["level"].find_elements(By.TAG_NAME, "td")]
    assert level[1:3] == ["bytes", "0"] and level[6] == "3"
    assert level[7] == '"mid" ×30, "high" ×15, "low" ×15'
    ids = [td.text for td in rows["id"].find_elements(By.TAG_NAME, "td")]
    assert ids[3:8] == ["0", "59", "29.5", "60", "every value once"]
    note = browser.find_element(By.XPATH, "//h2[starts-with(., 'Columns')]/following-sibling::p")
    assert note.text == "From all 60 records of train."
