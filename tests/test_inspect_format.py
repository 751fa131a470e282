"""The pure pieces of `inspect`: summary data and text, record previews, thumbnails, the page."""

from __future__ import annotations

import base64
import html.parser
import io
import json

import pytest
from PIL import Image, ImageDraw

from recordforge.pipelines.inspection.contact_sheet import (
    ContactSheet,
    Sample,
    SampleGroup,
    make_thumbnail,
    render_page,
)
from recordforge.schemas.features import FeatureSpec
from recordforge.schemas.manifest import ErrorSummary, Manifest, ShardInfo, SplitInfo
from recordforge.transforms.core.planning.assemble import GatheredResults, count_labels
from recordforge.transforms.core.planning.labels import LabelMap, named_counts
from recordforge.transforms.core.records import ErrorFileResult, ShardResult
from recordforge.transforms.core.reports.summary import (
    bar,
    describe_image,
    format_bytes,
    format_records,
    format_summary,
    format_values,
    plural,
    preview_record,
    printable,
    size_histogram,
    summarize,
    top_classes,
)

EVIL = "<img src=x onerror=alert(1)>&\"y'"


# --- Label counts -------------------------------------------------------------------------------


def test_named_counts_in_id_order_with_every_class():
    assert named_counts({2: 5, 0: 1}, ("cat", "dog", "eel")) == {"cat": 1, "dog": 0, "eel": 5}
    assert list(named_counts({2: 5, 0: 1}, ("cat", "dog", "eel"))) == ["cat", "dog", "eel"]
    assert list(named_counts({10: 1, 2: 3, 7: 1}, ())) == ["2", "7", "10"]  # numeric order


def test_count_labels_sums_the_shards():
    shards = [
        ShardResult("train", 0, 2, "a", 3, 10, label_counts=((0, 2), (1, 1))),
        ShardResult("train", 1, 2, "b", 2, 10, label_counts=((1, 2),)),
    ]
    labels = LabelMap(("cat", "dog", "eel"), frozenset({0}))
    assert count_labels(shards, labels) == {"cat": 2, "dog": 3, "eel": 0}
    assert count_labels(shards, LabelMap()) is None  # no labelled source: no counts


def test_gathered_results_sum_label_counts_per_split_and_drop_them_from_shards():
    results = [
        ShardResult("train", 0, 2, "a", 3, 10, label_counts=((0, 2), (1, 1))),
        ErrorFileResult("errors/probe.jsonl", "probe", 1, (("CorruptImage", 1),)),
        ShardResult("train", 1, 2, "b", 2, 10, label_counts=((1, 2),)),
        ShardResult("test", 0, 1, "c", 1, 10, label_counts=((2, 1),)),
    ]
    one, other = GatheredResults(), GatheredResults()
    for result in results[:2]:
        one.add(result)
    for result in results[2:]:
        other.add(result)
    gathered = one.merge(other)  # as a combiner merges partial accumulators
    assert [s.index for s in gathered.shards] == [0, 1, 0]
    assert all(s.label_counts == () for s in gathered.shards)
    assert gathered.error_files == [results[1]]
    assert gathered.label_counts == {"train": {0: 2, 1: 3}, "test": {2: 1}}
    labels = LabelMap(("cat", "dog", "eel"), frozenset({0}))
    train = [s for s in gathered.shards if s.split == "train"]
    # The same counts as summing the shards' own.
    assert count_labels(train, labels, gathered.label_counts["train"]) == count_labels(
        [r for r in results if isinstance(r, ShardResult) and r.split == "train"], labels
    )


def _manifest(label_counts=None, labels=("cat", "dog"), name="pets") -> Manifest:
    return Manifest(
        name=name,
        tool_version="1.2.3",
        created="2026-01-01T00:00:00+00:00",
        num_inputs=7,
        splits={
            "train": SplitInfo(
                (ShardInfo("a", 2, 1000), ShardInfo("b", 2, 1100), ShardInfo("c", 1, 5000)),
                None if label_counts is None else label_counts["train"],
            ),
            "test": SplitInfo(
                (ShardInfo("d", 1, 700),), None if label_counts is None else label_counts["test"]
            ),
        },
        features={
            "image/class/label": FeatureSpec("int64", (), False, "class id"),
            "score": FeatureSpec("float", (-1,), True, "CSV column 'score'"),
        },
        labels=labels,
        plan={},
        errors=ErrorSummary(1, ("errors/probe.jsonl",), {"probe": 1}, {"NotAnImage": 1}),
        compression="none",
        options={},
    )


def test_manifest_label_counts_round_trip_and_old_manifests_still_read():
    counts = {"train": {"cat": 3, "dog": 2}, "test": {"cat": 0, "dog": 1}}
    manifest = _manifest(counts)
    data = json.loads(manifest.to_json())
    assert data["splits"]["train"]["label_counts"] == {"cat": 3, "dog": 2}
    assert list(data["splits"]["train"]) == [
        "num_records",
        "num_bytes",
        "num_shards",
        "label_counts",
        "shards",
    ]
    assert Manifest.from_json(manifest.to_json()).to_json() == manifest.to_json()
    for split in data["splits"].values():
        del split["label_counts"]
    old = Manifest.from_dict(data)
    assert all(split.label_counts is None for split in old.splits.values())
    assert "label_counts" not in old.to_json()


# --- Summary ------------------------------------------------------------------------------------


def test_size_histogram():
    assert size_histogram([]) == []
    assert size_histogram([5, 5, 5]) == [{"low": 5, "high": 5, "count": 3}]
    bins = size_histogram(list(range(100, 200)), bins=4)
    assert [b["count"] for b in bins] == [25, 25, 25, 25]
    assert bins[0]["low"] == 100 and bins[-1]["high"] == 199
    assert all(a["high"] == b["low"] for a, b in zip(bins, bins[1:], strict=False))
    assert len(size_histogram([1, 1000])) == 2  # never more bins than sizes
    assert sum(b["count"] for b in size_histogram([1, 2, 2, 9, 10], bins=8)) == 5


def test_bars_and_plurals():
    assert bar(0, 10) == "" and bar(1, 1000) == "█" and bar(10, 10) == "█" * 30
    assert bar(5, 10, width=10) == "█" * 5
    assert [plural(n, "record") for n in (0, 1, 2, 1000)] == [
        "0 records",
        "1 record",
        "2 records",
        "1,000 records",
    ]
    assert plural(3, "class") == "3 classes"


def test_top_classes():
    classes = [{"label": f"c{i}", "total": i % 7} for i in range(25)]
    shown, hidden = top_classes(classes)
    assert hidden == 5 and len(shown) == 20
    assert [c["total"] for c in shown] == sorted((c["total"] for c in shown), reverse=True)
    assert shown[:4] == [classes[6], classes[13], classes[20], classes[5]]  # ties: id order
    few = classes[:3]
    assert top_classes(few) == (few, 0)  # few classes: all, in id order


def test_summary_and_its_text():
    counts = {"train": {"cat": 3, "dog": 2}, "test": {"cat": 0, "dog": 1}}
    summary = summarize(_manifest(counts), counts, "manifest", "gs://bucket/pets")
    assert summary["splits"]["train"]["shard_bytes"] == {"min": 1000, "median": 1100, "max": 5000}
    assert summary["labels"]["classes"] == [
        {"label": "cat", "counts": {"train": 3, "test": 0}, "total": 3, "id": 0},
        {"label": "dog", "counts": {"train": 2, "test": 1}, "total": 3, "id": 1},
    ]
    json.dumps(summary)  # --json prints it
    lines = format_summary(summary)
    text = "\n".join(lines)
    assert lines[0] == "Dataset pets (recordforge 1.2.3, created 2026-01-01T00:00:00+00:00)"
    assert "gs://bucket/pets" in text
    assert "7 → 6 records, 1 error (NotAnImage 1; in errors/probe.jsonl)" in text
    (train,) = [line for line in lines if line.startswith("  train ")]
    # records, shards, bytes, then the smallest, median and largest shard
    assert train.split() == "train 5 3 6.9 KiB 1000 B 1.1 KiB 4.9 KiB".split()
    (cat,) = [line for line in lines if line.startswith("  cat ")]
    assert cat.split() == ["cat", "3", "0", "3", "50.0%", "█" * 30]
    histogram = lines[lines.index("Shard sizes") + 1 : lines.index("Shard sizes") + 5]
    assert [line.split()[-1] for line in histogram] == ["2", "0", "1", "1"]
    assert histogram[0].startswith("  train:") and histogram[3].startswith("  test:")
    assert any(line.split()[:5] == ["score", "float", "[-1]", "yes", "CSV"] for line in lines)


def test_summary_text_escapes_control_characters():
    evil = "cat\x1b[2J\x07"
    counts = {"train": {evil: 5}, "test": {evil: 1}}
    summary = summarize(_manifest(counts, labels=(evil,), name="x\x1by"), counts)
    text = "\n".join(format_summary(summary))
    assert "\x1b" not in text and "\x07" not in text
    assert "cat\\x1b[2J\\x07" in text and "x\\x1by" in text
    assert printable("naïve ☕") == "naïve ☕"


# --- Record preview -----------------------------------------------------------------------------


def _jpeg(size=(64, 48), mode="RGB", colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, colour if mode != "L" else 128).save(out, "JPEG")
    return out.getvalue()


def test_values_in_readable_form():
    assert format_bytes(b"cat") == '"cat"'
    assert format_bytes(b'say "hi"') == '"say \\"hi\\""'
    assert format_bytes(b"\xff\xd8\xff") == "3 bytes: b'\\xff\\xd8\\xff'"
    long = bytes(range(100))
    assert format_bytes(long) == f"100 bytes: {long[:24]!r}…"
    assert format_values("x", "int64", [7]) == "7"
    assert format_values("x", "int64", []) == "[]"
    assert format_values("x", "float", [0.10000000149011612, 2.5]) == "[0.1, 2.5]"
    assert format_values("x", "int64", list(range(20))) == "[0, 1, 2, 3, 4, 5, 6, 7, …] (20 values)"
    jpeg = _jpeg()
    assert format_values("image/encoded", "bytes", [jpeg]) == f"JPEG 64×48 RGB, {len(jpeg):,} bytes"
    assert describe_image(b"not an image").startswith("12 bytes, not a readable image (")


def test_preview_record_marks_absent_features_and_sorts_keys():
    preview = preview_record(
        {"b": ("int64", [1]), "a": ("bytes", [b"x"])}, expected=["a", "b", "c"]
    )
    assert preview == {"a": '"x"', "b": "1", "c": "(absent)"}
    assert list(preview) == ["a", "b", "c"]
    lines = format_records([preview], "train", 10)
    assert lines == ["First 1 of 10 records of train", "  record 0", '    a  "x"', "    b  1"] + [
        "    c  (absent)"
    ]


# --- Thumbnails ---------------------------------------------------------------------------------

RED = (210, 40, 30)


def _image_bytes(fmt: str, mode: str, size=(120, 90), **save) -> bytes:
    image = Image.new("RGB", size, RED)
    ImageDraw.Draw(image).rectangle((0, 0, 5, 5), fill=(0, 0, 255))
    if mode == "RGBA":
        image = image.convert("RGBA")
        image.putalpha(200)
    elif mode == "P-transparent":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
        save["transparency"] = image.getpixel((0, 0))
    elif mode == "I;16":
        image = image.convert("L").point(lambda v: v * 256, "I").convert("I;16")
    elif mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def _decode_uri(uri: str) -> Image.Image:
    mime, data = uri.removeprefix("data:").split(";base64,")
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    assert image.format.lower() == mime.split("/")[1]
    return image


def _centre(image: Image.Image):
    return image.convert("RGBA").getpixel((image.width // 2, image.height // 2))


@pytest.mark.parametrize(
    ("fmt", "mode", "colour"),
    [
        ("JPEG", "RGB", RED),
        ("JPEG", "L", None),
        ("JPEG", "CMYK", RED),
        ("PNG", "RGBA", RED),
        ("PNG", "LA", None),
        ("PNG", "P", RED),
        ("PNG", "P-transparent", RED),
        ("PNG", "I;16", None),
        ("PNG", "1", "any"),  # dithered black and white: no one colour to check
        ("GIF", "P", RED),
        ("BMP", "RGB", RED),
        ("WEBP", "RGB", RED),
        ("WEBP", "RGBA", RED),
        ("TIFF", "CMYK", RED),
    ],
)
def test_thumbnails_of_every_format_and_mode_are_viewable(fmt, mode, colour):
    thumb = make_thumbnail(_image_bytes(fmt, mode))
    assert thumb.error is None and thumb.uri is not None
    image = _decode_uri(thumb.uri)
    assert image.mode in ("L", "RGB", "RGBA")  # what browsers show as meant
    assert (thumb.width, thumb.height) == image.size == (120, 90)  # small: not enlarged
    if isinstance(colour, tuple):
        r, g, b, _ = _centre(image)
        assert abs(r - colour[0]) < 30 and abs(g - colour[1]) < 30 and abs(b - colour[2]) < 30
    elif colour is None:
        grey = _centre(image)[0]
        assert 20 < grey < 235, grey  # not blown out to white or crushed to black (16-bit)
    if mode in ("RGBA", "LA", "P-transparent"):
        assert image.mode == "RGBA" and thumb.uri.startswith("data:image/png;")


def test_large_images_are_shrunk_and_oriented():
    big = _image_bytes("JPEG", "RGB", size=(3000, 1000))
    thumb = make_thumbnail(big)
    assert (thumb.width, thumb.height) == (160, 53)
    assert len(thumb.uri) < 20_000
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: shown 90° clockwise
    rotated = io.BytesIO()
    Image.new("RGB", (300, 100), RED).save(rotated, "JPEG", exif=exif.tobytes())
    thumb = make_thumbnail(rotated.getvalue())
    assert (thumb.width, thumb.height) == (53, 160)


def test_thumbnail_of_an_animation_is_its_first_frame():
    frames = [Image.new("RGB", (40, 40), colour) for colour in (RED, (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    r, g, b, _ = _centre(_decode_uri(make_thumbnail(out.getvalue()).uri))
    assert r > 150 and b < 100


def test_broken_images_give_a_reason_not_an_exception():
    assert "not an image format" in make_thumbnail(b"garbage").error
    whole = _image_bytes("PNG", "RGB", size=(400, 400))
    truncated = make_thumbnail(whole[: len(whole) // 2])
    assert truncated.uri is None and "truncated" in truncated.error
    assert make_thumbnail(b"").uri is None


# --- The page -----------------------------------------------------------------------------------


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_page_escapes_user_data_and_loads_nothing():
    counts = {"train": {EVIL: 2, "dog": 1}, "test": {EVIL: 0, "dog": 1}}
    manifest = _manifest(counts, labels=(EVIL, "dog"), name="pets")
    summary = summarize(manifest, counts, "scan", f"/data/{EVIL}")
    good = make_thumbnail(_image_bytes("PNG", "RGB"))
    bad = make_thumbnail(b"<script>alert(2)</script>")
    sheet = ContactSheet(
        split="train",
        groups=(
            SampleGroup(EVIL, 0, (Sample(EVIL, f"{EVIL}/a.png", good),), 2),
            SampleGroup("dog", 1, (Sample("dog", f"dog/{EVIL}.png", bad),), 1),
            SampleGroup("eel", 2, (), 0),
        ),
        scanned=3,
        note=f"note {EVIL}",
    )
    records = [{f"key{EVIL}": f"value{EVIL}"}]
    page = render_page(summary, sheet, records, "train")
    parser = _Tags()
    parser.feed(page)
    tags = parser.tags
    assert "script" not in {tag for tag, _ in tags}
    assert not any(name.startswith("on") for _, attrs in tags for name in attrs)
    images = [attrs for tag, attrs in tags if tag == "img"]
    assert len(images) == 1 and images[0]["src"].startswith("data:image/")
    assert images[0]["alt"] == f"{EVIL}: {EVIL}/a.png"
    (csp,) = [a for t, a in tags if t == "meta" and a.get("http-equiv")]
    assert csp["content"].startswith("default-src 'none'")
    text = "".join(parser.text)
    assert f"{EVIL}/a.png" in text and f"value{EVIL}" in text and f"key{EVIL}" in text
    assert "cannot show this image: not an image format" in text
    assert "no records of this class in the split" in text
    assert "counted by reading all 4 records" in text
    labelled = [attrs["data-label"] for tag, attrs in tags if tag == "figure"]
    assert labelled == [EVIL, "dog"]
    assert "http://" not in page and "https://" not in page


def test_page_without_images_or_labels():
    manifest = _manifest(labels=None)
    page = render_page(summarize(manifest, None, None), None, [], "train")
    assert "<img" not in page and "Contact sheet" not in page
    assert "None: the records have no label feature." in page
