"""`recordforge inspect`: label counts in the manifest, the summary, the record preview, and the
--html page opened in headless Chromium; end to end through the installed CLI."""

from __future__ import annotations

import base64
import collections
import html
import io
import json
import pathlib
import shutil
import statistics
from itertools import islice

import pytest
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.localfilesystem import LocalFileSystem
from conftest import GOOD_IMAGES, make_image, open_page, read_dataset, run_cli
from PIL import Image, ImageDraw

from recordforge.pipelines import cli
from recordforge.pipelines.dataset import open_dataset
from recordforge.schemas import codec
from recordforge.transforms.core.planning.sharding import human_size
from recordforge.transforms.core.tfrecord.framing import frame_record

# Class folders of distinctive colours, so a test can tell from the pixels which class a
# thumbnail shows. The last name is user data that must be escaped everywhere in the page.
EVIL = "<img src=x onerror=alert(1)>&y"
COLOURS = {
    "blue": (30, 40, 215),
    "gray": (128, 128, 128),
    "green": (30, 175, 40),
    "red": (215, 35, 30),
    EVIL: (235, 215, 20),
}
COLOUR_IMAGES = {
    # class: [(file name, Pillow format, mode, size)]
    "red": [
        ("r1.jpg", "JPEG", "RGB", (120, 90)),
        ("r2.png", "PNG", "RGBA", (60, 80)),
        ("r3.bmp", "BMP", "RGB", (33, 21)),
        ("r4.jpg", "JPEG", "RGB", (400, 300)),
        ("r5.webp", "WEBP", "RGB", (64, 64)),
    ],
    "green": [
        ("g1.gif", "GIF", "P", (48, 48)),
        ("g2.webp", "WEBP", "RGBA", (70, 50)),
        ("g3.png", "PNG", "P", (90, 40)),
        ("g4.jpg", "JPEG", "RGB", (640, 480)),
    ],
    "blue": [
        ("b1.jpg", "JPEG", "RGB", (100, 100)),
        ("b2.png", "PNG", "RGB", (30, 200)),
        ("b3.gif", "GIF", "P", (64, 40)),
    ],
    "gray": [
        ("k1.jpg", "JPEG", "L", (80, 60)),
        ("k2.png", "PNG", "L", (50, 50)),
        ("k3.png", "PNG", "I;16", (40, 30)),
    ],
    EVIL: [
        ("e1.png", "PNG", "RGB", (44, 44)),
        ('e"2<&>.jpg', "JPEG", "RGB", (70, 30)),
    ],
}


def make_colour_image(path: pathlib.Path, fmt: str, mode: str, size, colour, seed: int) -> None:
    """A picture of one colour, with a small patch of a nearby shade (so files differ)."""
    image = Image.new("RGB", size, colour)
    shade = tuple(max(0, min(255, c + (seed % 5) * 6 - 12)) for c in colour)
    ImageDraw.Draw(image).rectangle((0, 0, size[0] // 4, size[1] // 4), fill=shade)
    if mode == "RGBA":
        image = image.convert("RGBA")
        image.putalpha(Image.new("L", size, 255))
        ImageDraw.Draw(image).rectangle((size[0] // 2, 0, size[0], 4), fill=(0, 0, 0, 0))
    elif mode == "I;16":
        image = image.convert("L").point(lambda v: v * 256, "I").convert("I;16")
    elif mode == "P":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    elif mode != "RGB":
        image = image.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, fmt)


@pytest.fixture(scope="module")
def colour_dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("colours")
    seed = 0
    for label, files in COLOUR_IMAGES.items():
        for name, fmt, mode, size in files:
            make_colour_image(root / "photos" / label / name, fmt, mode, size, COLOURS[label], seed)
            seed += 1
    out = root / "out"
    result = run_cli("convert", root / "photos", "-o", out, "--name", "colours")
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def photos_dataset(tmp_path_factory) -> pathlib.Path:
    """conftest's GOOD_IMAGES in cat/dog/eel folders, plus a corrupt file; two splits."""
    root = tmp_path_factory.mktemp("photos")
    for index, (relative, (fmt, size, mode)) in enumerate(sorted(GOOD_IMAGES.items())):
        make_image(root / "photos" / relative, fmt, size=size, mode=mode, seed=index)
    (root / "photos/cat/corrupt.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    out = root / "out"
    result = run_cli(
        "convert", root / "photos", "-o", out, "--splits", "train=0.6,test=0.4", "--name", "pets"
    )
    assert result.returncode == 0, result.stderr
    return out


def manifest_of(out: pathlib.Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


def inspect_json(out, *args) -> dict:
    result = run_cli("inspect", out, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- Label counts in the manifest ---------------------------------------------------------------


def test_manifest_counts_labels_per_split(photos_dataset):
    info, splits = read_dataset(photos_dataset)
    expected_classes = collections.Counter(relative.split("/")[0] for relative in GOOD_IMAGES)
    totals: collections.Counter = collections.Counter()
    for name, split in info["splits"].items():
        counts = split["label_counts"]
        assert list(counts) == ["cat", "dog", "eel"]  # every class, in label-id order
        assert sum(counts.values()) == split["num_records"]
        # What the records of the split actually hold, read back with TensorFlow.
        read = collections.Counter(r["image/class/text"].decode() for r in splits[name])
        assert counts == {label: read[label] for label in counts}
        totals.update(counts)
    assert totals == expected_classes  # 4 cats, 4 dogs, 2 eels
    assert {name: len(records) for name, records in splits.items()} == {
        name: split["num_records"] for name, split in info["splits"].items()
    }


def test_manifest_label_counts_for_csv_text_and_numeric_labels(tmp_path):
    rows = [("a", 1), ("b", 0), ("a", 2), ("c", 2), ("a", 1), ("b", 7)]
    text_csv = tmp_path / "text.csv"
    text_csv.write_text("x,label\n" + "".join(f"{i},{t}\n" for i, (t, _) in enumerate(rows)))
    number_csv = tmp_path / "numbers.csv"
    number_csv.write_text("x,label\n" + "".join(f"{i},{n}\n" for i, (_, n) in enumerate(rows)))
    for source, expected in (
        (text_csv, {"a": 3, "b": 2, "c": 1}),
        (number_csv, {"0": 1, "1": 2, "2": 2, "7": 1}),
    ):
        out = tmp_path / f"out-{source.stem}"
        result = run_cli("convert", source, "-o", out, "--label-column", "label")
        assert result.returncode == 0, result.stderr
        info = manifest_of(out)
        assert info["splits"]["train"]["label_counts"] == expected
        assert list(info["splits"]["train"]["label_counts"]) == list(expected)  # id order
        assert "label" in info["features"]


def test_no_label_counts_without_labels(tmp_path):
    for i in range(3):
        make_image(tmp_path / "flat" / f"{i}.png", "PNG", seed=i)
    out = tmp_path / "out"
    assert run_cli("convert", tmp_path / "flat", "-o", out).returncode == 0
    assert "label_counts" not in manifest_of(out)["splits"]["train"]
    summary = inspect_json(out)
    assert summary["labels"] is None
    text = run_cli("inspect", out).stdout
    assert "Labels: none" in text


# --- The summary ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded_dataset(tmp_path_factory) -> pathlib.Path:
    """120 JPEGs of varied sizes in 4 classes, 4 shards in train and 2 in validation."""
    root = tmp_path_factory.mktemp("sharded")
    for index in range(120):
        size = (40 + (index * 37) % 300, 40 + (index * 53) % 200)
        make_image(root / "in" / f"class{index % 4}" / f"{index:03d}.jpg", "JPEG", size, seed=index)
    out = root / "out"
    result = run_cli(
        "convert",
        root / "in",
        "-o",
        out,
        "--splits",
        "train=0.75,validation=0.25",
        "--num-shards",
        "4",
        "--compression",
        "gzip",
    )
    assert result.returncode == 0, result.stderr
    return out


def test_summary_numbers_match_the_manifest(sharded_dataset):
    info = manifest_of(sharded_dataset)
    summary = inspect_json(sharded_dataset)
    assert summary["name"] == info["name"] == "out"
    assert summary["num_records"] == info["num_records"] == 120
    assert summary["num_inputs"] == info["num_inputs"]
    assert summary["compression"] == "gzip"
    assert summary["tool_version"] == info["tool"]["version"]
    assert summary["features"] == info["features"]
    assert list(summary["splits"]) == ["train", "validation"]
    for name, split in info["splits"].items():
        sizes = [shard["num_bytes"] for shard in split["shards"]]
        mine = summary["splits"][name]
        assert (mine["num_records"], mine["num_bytes"], mine["num_shards"]) == (
            split["num_records"],
            split["num_bytes"],
            split["num_shards"],
        )
        assert mine["shard_bytes"] == {
            "min": min(sizes),
            "median": statistics.median_low(sizes),
            "max": max(sizes),
        }
        assert sum(b["count"] for b in mine["histogram"]) == len(sizes) == 4
        for size in sizes:
            assert any(b["low"] <= size <= b["high"] for b in mine["histogram"])
    classes = summary["labels"]["classes"]
    assert summary["labels"]["source"] == "manifest"
    assert [c["label"] for c in classes] == ["class0", "class1", "class2", "class3"]
    assert [c["id"] for c in classes] == [0, 1, 2, 3]
    assert all(c["total"] == 30 for c in classes)
    for c in classes:
        assert c["counts"] == {
            name: split["label_counts"][c["label"]] for name, split in info["splits"].items()
        }

    text = run_cli("inspect", sharded_dataset)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "compression  gzip" in out
    assert "inputs       120 → 120 records, 0 errors" in out
    for name, split in info["splits"].items():
        sizes = [shard["num_bytes"] for shard in split["shards"]]
        (row,) = [line for line in out.splitlines() if line.startswith(f"  {name} ")]
        assert row.split() == [
            name,
            f"{split['num_records']:,}",
            "4",
            *human_size(split["num_bytes"]).split(),
            *human_size(min(sizes)).split(),
            *human_size(statistics.median_low(sizes)).split(),
            *human_size(max(sizes)).split(),
        ]
    assert "Shard sizes" in out and "█" in out
    for c in classes:
        (row,) = [line for line in out.splitlines() if line.startswith(f"  {c['label']} ")]
        numbers = row.split()
        assert numbers[1:5] == [
            str(c["counts"]["train"]),
            str(c["counts"]["validation"]),
            "30",
            "25.0%",
        ]
    # The feature table: every feature with its dtype, shape and optionality.
    for key, spec in info["features"].items():
        (row,) = [line for line in out.splitlines() if line.startswith(f"  {key} ")]
        assert row.split()[1:4] == [spec["dtype"], "[]", "no"]


def test_many_classes_show_the_top_20(tmp_path):
    lines = ["x,label"]
    for index in range(30):
        lines += [f"{index},class{index:02d}"] * (index + 1)
    table = tmp_path / "many.csv"
    table.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert run_cli("convert", table, "-o", out, "--label-column", "label").returncode == 0
    text = run_cli("inspect", out, "--records", "0").stdout
    rows = [line for line in text.splitlines() if line.startswith("  class")]
    assert [row.split()[0] for row in rows[1:]] == [f"class{i:02d}" for i in range(29, 9, -1)]
    rest = sum(range(1, 11))
    assert f"… 10 more classes with {rest} records" in text
    assert "First" not in text  # --records 0


def test_old_manifest_without_label_counts_is_counted_by_scanning(photos_dataset, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(photos_dataset, old)
    info = manifest_of(old)
    expected = {name: split.pop("label_counts") for name, split in info["splits"].items()}
    (old / "dataset_info.json").write_text(json.dumps(info))
    dataset = open_dataset(str(old))
    assert all(split.label_counts is None for split in dataset.manifest.splits.values())

    summary = inspect_json(old)
    assert summary["labels"]["source"] == "scan"
    assert {
        name: {c["label"]: c["counts"][name] for c in summary["labels"]["classes"]}
        for name in expected
    } == expected
    text = run_cli("inspect", old).stdout
    assert "not in the manifest" in text and "counted by reading all 10 records" in text


# --- The record preview -------------------------------------------------------------------------


def test_record_preview_shows_the_first_records_of_the_split(photos_dataset):
    info, splits = read_dataset(photos_dataset)
    split = "test"
    first = splits[split][:3]
    reader_first = [
        record["image/filename"][0].decode()
        for record in islice(open_dataset(str(photos_dataset)).examples(split), 3)
    ]
    assert [r["image/filename"].decode() for r in first] == reader_first

    result = run_cli("inspect", photos_dataset, "--split", split, "--records", "3")
    assert result.returncode == 0, result.stderr
    text = result.stdout.split(f"First 3 of {len(splits[split])} records of {split}\n", 1)[1]
    blocks = text.split("  record ")[1:]
    assert len(blocks) == 3
    photos = photos_dataset.parent / "photos"
    for number, (block, record) in enumerate(zip(blocks, first, strict=True)):
        fields = dict(
            line.strip().split(None, 1) for line in block.splitlines()[1:] if line.strip()
        )
        assert block.startswith(f"{number}\n")
        relative = record["image/filename"].decode()
        fmt, (width, height), mode = GOOD_IMAGES[relative]
        size = (photos / relative).stat().st_size
        assert fields["image/encoded"] == f"{fmt} {width}×{height} {mode}, {size:,} bytes"
        assert fields["image/filename"] == f'"{relative}"'
        assert fields["image/class/text"] == f'"{relative.split("/")[0]}"'
        assert fields["image/class/label"] == str(record["image/class/label"])
        assert fields["image/width"] == str(width)
        assert fields["image/format"] == f'"{record["image/format"].decode()}"'
        assert set(fields) == set(info["features"])

    # The default split is the first one; --records 0 shows none; more than there are: all.
    default = run_cli("inspect", photos_dataset, "--records", "1").stdout
    assert "records of train" in default
    everything = run_cli("inspect", photos_dataset, "--records", "1000").stdout
    assert f"First {len(splits['train'])} of {len(splits['train'])} records" in everything


def test_gzip_dataset_preview(sharded_dataset):
    result = run_cli("inspect", sharded_dataset, "--split", "validation", "--records", "2")
    assert result.returncode == 0, result.stderr
    expected = [
        example["image/filename"][0].decode()
        for example in islice(open_dataset(str(sharded_dataset)).examples("validation"), 2)
    ]
    shown = [
        line.split(None, 1)[1].strip('"')
        for line in result.stdout.splitlines()
        if line.startswith("    image/filename ")  # a record's line, not the feature table's
    ]
    assert shown == expected


@pytest.fixture(scope="module")
def csv_dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("csv")
    long_text = "lorem ipsum " * 20
    table = root / "table.csv"
    table.write_text(
        "id,name,score,tags,label\n"
        f'1,"naïve café ☕",0.25,a;b;c;d;e;f;g;h;i;j,cat\n'
        f'2,"{long_text}",1.5,x,dog\n'
        f"3,<script>alert(1)</script>,,y;z,cat\n",
        encoding="utf-8",
    )
    schema = root / "schema.yaml"
    schema.write_text("columns:\n  tags:\n    dtype: bytes\n    list: true\n")
    out = root / "out"
    result = run_cli("convert", table, "-o", out, "--label-column", "label", "--schema", schema)
    assert result.returncode == 0, result.stderr
    return out


def test_csv_preview_shows_text_bytes_and_lists(csv_dataset):
    result = run_cli("inspect", csv_dataset, "--records", "3")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    records = {
        example["id"][0]: example for example in open_dataset(str(csv_dataset)).examples("train")
    }
    assert len(records) == 3
    assert '"naïve café ☕"' in text
    assert "score       (absent)" in text  # an optional feature this record lacks
    long_value = records[2]["name"][0]
    assert f"{len(long_value):,} bytes: {long_value[:24]!r}…" in text
    # Long lists are cut after 8 values.
    assert '["a", "b", "c", "d", "e", "f", "g", "h", …] (10 values)' in text
    assert "Labels: 2 classes" in text


# --- The HTML page in Chromium --------------------------------------------------------------------


# Mean colour of an <img> (pixels with any opacity), read back from the rendered image.
MEAN_COLOUR_JS = """
const img = arguments[0];
const canvas = document.createElement('canvas');
canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
const context = canvas.getContext('2d');
context.drawImage(img, 0, 0);
const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
let r = 0, g = 0, b = 0, n = 0;
for (let i = 0; i < data.length; i += 4) {
  if (data[i + 3] > 0) { r += data[i]; g += data[i + 1]; b += data[i + 2]; n += 1; }
}
return [r / n, g / n, b / n];
"""


def nearest_class(colour) -> str:
    return min(
        COLOURS, key=lambda c: sum((a - b) ** 2 for a, b in zip(COLOURS[c], colour, strict=True))
    )


def close_to(colour, expected, tolerance=30) -> bool:
    """Each channel within `tolerance` (JPEG, the shaded patch and palettes shift it a bit)."""
    return all(abs(a - b) <= tolerance for a, b in zip(colour, expected, strict=True))


def check_images_loaded(driver) -> list:
    from selenium.webdriver.common.by import By

    images = driver.find_elements(By.TAG_NAME, "img")
    for image in images:
        assert driver.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0", image
        ), image.get_attribute("alt")
    return images


def test_html_contact_sheet_renders_and_captions_match_the_pictures(colour_dataset, browser):
    from selenium.webdriver.common.by import By

    page = colour_dataset.parent / "sheet.html"
    result = run_cli("inspect", colour_dataset, "--html", page, "--per-class", "3")
    assert result.returncode == 0, result.stderr
    assert f"Contact sheet: {page}" in result.stdout
    source = page.read_text(encoding="utf-8")
    # Self-contained: nothing fetched from anywhere; user data escaped.
    assert "http://" not in source and "https://" not in source and "<script" not in source
    assert "<img src=x" not in source and html.escape(EVIL) in source

    open_page(browser, page)
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    images = check_images_loaded(browser)
    counts = manifest_of(colour_dataset)["splits"]["train"]["label_counts"]
    assert counts == {label: len(files) for label, files in sorted(COLOUR_IMAGES.items())}
    assert len(images) == sum(min(3, n) for n in counts.values()) == 14

    figures = browser.find_elements(By.CSS_SELECTOR, "figure.sample")
    assert len(figures) == len(images)
    seen = collections.Counter()
    for figure in figures:
        label = figure.find_element(By.CSS_SELECTOR, ".label").text
        filename = figure.find_element(By.CSS_SELECTOR, ".file").text
        image = figure.find_element(By.TAG_NAME, "img")
        colour = browser.execute_script(MEAN_COLOUR_JS, image)
        assert nearest_class(colour) == label, (label, filename, colour)
        assert close_to(colour, COLOURS[label]), (label, filename, colour)
        assert filename.split("/")[0] == label
        assert max(image.get_property("naturalWidth"), image.get_property("naturalHeight")) <= 160
        seen[label] += 1
    assert seen == {label: min(3, n) for label, n in counts.items()}
    # One group per class, in label-id order, headed by the class name as text.
    groups = browser.find_elements(By.CSS_SELECTOR, "section.group .group-label")
    assert [g.text for g in groups] == sorted(COLOUR_IMAGES)
    assert browser.find_elements(By.CSS_SELECTOR, 'img[src="x"]') == []
    # The summary tables are there too.
    assert browser.find_element(By.CSS_SELECTOR, "table.splits").text.count("train") == 1
    assert EVIL in browser.find_element(By.CSS_SELECTOR, "table.labels").text


def test_html_thumbnails_decode_to_the_class_colour(colour_dataset):
    page = colour_dataset.parent / "all.html"
    result = run_cli("inspect", colour_dataset, "--html", page, "--records", "0")
    assert result.returncode == 0, result.stderr
    source = page.read_text(encoding="utf-8")
    figures = source.split('<figure class="sample"')[1:]
    assert len(figures) == sum(len(files) for files in COLOUR_IMAGES.values())
    for figure in figures:
        label = html.unescape(figure.split('data-label="', 1)[1].split('"', 1)[0])
        uri = figure.split('src="data:', 1)[1].split('"', 1)[0]
        mime, data = uri.split(";base64,")
        assert mime in ("image/jpeg", "image/png")
        with Image.open(io.BytesIO(base64.b64decode(data))) as thumb:
            pixels = list(thumb.convert("RGB").getdata())
        mean = [sum(p[i] for p in pixels) / len(pixels) for i in range(3)]
        assert nearest_class(mean) == label
        assert close_to(mean, COLOURS[label]), (label, mean)
    assert "records of train</h2>" not in source  # --records 0: no record table


def test_html_shows_names_that_are_not_utf8_escaped(tmp_path):
    # It showed "d\ufffdg.jpg", hiding which byte, where every message shows "d\\xf6g".
    import os

    root = tmp_path / "photos"
    folder = os.path.join(os.fsencode(root), b"d\xf6g")
    os.makedirs(folder)
    with open(os.path.join(folder, b"b\xe9st.png"), "wb") as f:
        f.write(make_image(tmp_path / "g.png", "PNG"))
    out, page = tmp_path / "out", tmp_path / "sheet.html"
    assert run_cli("convert", root, "-o", out).returncode == 0
    result = run_cli("inspect", out, "--html", page)
    assert result.returncode == 0, result.stderr
    source = page.read_text(encoding="utf-8")
    assert "d\\xf6g/b\\xe9st.png" in source and "\ufffd" not in source


def test_html_placeholder_for_an_image_that_does_not_decode(photos_dataset, tmp_path, browser):
    from selenium.webdriver.common.by import By

    broken = tmp_path / "broken"
    shutil.copytree(photos_dataset, broken)
    info = manifest_of(broken)
    shard = broken / info["splits"]["train"]["shards"][0]["file"]
    dataset = open_dataset(str(broken))
    records = list(dataset.records("train"))
    example = codec.parse(records[0])
    encoded = example.features.feature["image/encoded"].bytes_list.value
    encoded[0] = encoded[0][: len(encoded[0]) // 2]  # the header, half the pixels
    records[0] = codec.serialize(example)
    shard.write_bytes(b"".join(frame_record(r) for r in records))

    page = tmp_path / "page.html"
    result = run_cli("inspect", broken, "--html", page)
    assert result.returncode == 0, result.stderr
    open_page(browser, page)
    images = check_images_loaded(browser)
    placeholders = browser.find_elements(By.CSS_SELECTOR, "figure.broken .placeholder")
    assert len(placeholders) == 1
    assert "cannot show this image" in placeholders[0].text
    assert placeholders[0].is_displayed()
    assert len(images) == len(records) - 1


def test_html_for_a_dataset_without_images(csv_dataset, tmp_path, browser):
    from selenium.webdriver.common.by import By

    page = tmp_path / "csv.html"
    result = run_cli("inspect", csv_dataset, "--html", page, "--records", "3")
    assert result.returncode == 0, result.stderr
    source = page.read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in source
    open_page(browser, page)
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.find_elements(By.TAG_NAME, "script") == []
    cards = browser.find_elements(By.CSS_SELECTOR, ".records section.record")
    assert len(cards) == 3
    table = "\n".join(card.text for card in cards)
    assert '"<script>alert(1)</script>"' in table and "naïve café" in table
    labels = browser.find_element(By.CSS_SELECTOR, "table.labels").text
    assert "cat" in labels and "dog" in labels


# --- Any Beam filesystem ------------------------------------------------------------------------


class _UrlFileSystem(LocalFileSystem):
    """`rftest:///abs/path`: local files behind a URL scheme, like gs://. Code that went around
    Beam FileSystems (open(), os.path) would fail on these paths. Records what was opened."""

    PREFIX = "rftest://"
    opened: list[str] = []

    @classmethod
    def scheme(cls):
        return "rftest"

    def _local(self, path: str) -> str:
        assert path.startswith(self.PREFIX), path
        return path[len(self.PREFIX) :]

    def join(self, base, *paths):
        return self.PREFIX + super().join(self._local(base), *paths)

    def split(self, path):
        head, tail = super().split(self._local(path))
        return self.PREFIX + head, tail

    def exists(self, path):
        return super().exists(self._local(path))

    def open(self, path, mime_type="", compression_type=CompressionTypes.AUTO):
        self.opened.append(path)
        return super().open(self._local(path), mime_type, compression_type)

    def create(self, path, mime_type="", compression_type=CompressionTypes.AUTO):
        self.opened.append(path)
        return super().create(self._local(path), mime_type, compression_type)


def test_inspect_reads_and_writes_through_beam_filesystems(sharded_dataset, tmp_path, capsys):
    url = _UrlFileSystem.PREFIX + str(sharded_dataset)
    page = _UrlFileSystem.PREFIX + str(tmp_path / "site" / "page.html")
    _UrlFileSystem.opened.clear()
    assert cli.main(["inspect", url, "--html", page, "--records", "2", "--per-class", "1"]) == 0
    out = capsys.readouterr().out
    assert f"folder       {url}" in out and "compression  gzip" in out
    assert "First 2 of" in out and f"Contact sheet: {page}" in out
    first_shard = manifest_of(sharded_dataset)["splits"]["train"]["shards"][0]["file"]
    assert f"{url}/dataset_info.json" in _UrlFileSystem.opened
    assert f"{url}/{first_shard}" in _UrlFileSystem.opened and page in _UrlFileSystem.opened
    source = (tmp_path / "site" / "page.html").read_text(encoding="utf-8")
    assert source.count("<img ") == 4  # one per class


# --- Usage errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["{empty}"], "is not a recordforge dataset"),
        (["{missing}"], "is not a recordforge dataset"),
        (["{dataset}", "--split", "nope"], "has no split 'nope' (its splits: train, test)"),
        (["{dataset}", "--records", "-1"], "--records"),
        (["{dataset}", "--per-class", "0"], "--per-class"),
        (["{dataset}", "--recrods", "3"], "unrecognised option"),
        (["{dataset}", "--html", "{empty}"], "is a folder"),
    ],
)
def test_usage_errors_exit_2(photos_dataset, tmp_path, args, phrase):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "dataset_info.json").write_text('{"name": "a TFDS dataset, not ours"}')
    values = {"empty": empty, "missing": tmp_path / "missing", "dataset": photos_dataset}
    result = run_cli("inspect", *(arg.format(**values) for arg in args))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recordforge: error: "), result.stderr
    assert phrase in lines[0]
    assert result.stdout == ""


def test_a_damaged_shard_fails_with_one_line(photos_dataset, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(photos_dataset, damaged)
    shard = damaged / manifest_of(damaged)["splits"]["train"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF  # inside the first record: its data CRC no longer matches
    shard.write_bytes(bytes(data))
    result = run_cli("inspect", damaged)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("recordforge: failed: cannot read ")
    assert "data CRC mismatch" in result.stderr and "Traceback" not in result.stderr
    # The summary alone needs no record: it comes from the manifest.
    assert run_cli("inspect", damaged, "--records", "0").returncode == 0
