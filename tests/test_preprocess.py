"""Image preprocessing (issue 16 item 3): --resize, --resize-mode, --encode, --quality,
--channels; opt-in, deterministic, the features those of the stored image."""

from __future__ import annotations

import io
import json
import pathlib
import struct
import subprocess
import zlib

import numpy as np
import pytest
from conftest import RECORDFORGE, make_image, read_dataset, read_errors, shard_files
from PIL import Image

from recordforge.schemas import codec
from recordforge.schemas import features as keys
from recordforge.schemas.spliced import serialize_around
from recordforge.transforms.core.errors import InputError, UsageError
from recordforge.transforms.core.images.preprocess import Preprocessing, preprocess, stored_record
from recordforge.transforms.core.images.probe import probe_image_bytes

MULTI_PROCESS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")


def _image(fmt="JPEG", size=(90, 60), mode="RGB", seed=3, **save) -> bytes:
    buffer = io.BytesIO()
    image = Image.new("RGB", size, (30, 200, 30))
    image.paste((250, 0, 0), (0, 0, size[0] // 2, size[1]))  # left half red
    image.convert(mode).save(buffer, fmt, **save)
    return buffer.getvalue()


def _facts(data: bytes):
    return _facts_of(probe_image_bytes(data))


def _facts_of(facts):
    return facts.format, facts.width, facts.height, facts.channels


@pytest.mark.parametrize(
    ("source", "options", "expected"),
    [
        (_image(), Preprocessing(size=(32, 24)), ("jpeg", 32, 24, 3)),
        (_image(), Preprocessing(size=(32, 32), mode="pad"), ("jpeg", 32, 32, 3)),
        (_image(), Preprocessing(shorter_side=30), ("jpeg", 45, 30, 3)),
        (_image(size=(60, 91)), Preprocessing(shorter_side=20), ("jpeg", 20, 30, 3)),
        (_image(), Preprocessing(encode="png"), ("png", 90, 60, 3)),
        (_image(), Preprocessing(encode="webp", quality=50), ("webp", 90, 60, 3)),
        (_image(), Preprocessing(channels=1), ("jpeg", 90, 60, 1)),
        (_image("PNG", mode="L"), Preprocessing(channels=3), ("png", 90, 60, 3)),
        (_image("PNG", mode="RGBA"), Preprocessing(size=(10, 10)), ("png", 10, 10, 4)),
        (_image("PNG", mode="RGBA"), Preprocessing(encode="jpeg"), ("jpeg", 90, 60, 3)),
        (_image("GIF", mode="P"), Preprocessing(size=(16, 8)), ("png", 16, 8, 3)),
        (_image("BMP"), Preprocessing(shorter_side=12), ("png", 18, 12, 3)),
        (_image("BMP", mode="P"), Preprocessing(shorter_side=12), ("png", 18, 12, 3)),
        (_image("BMP", mode="L"), Preprocessing(shorter_side=12), ("png", 18, 12, 1)),
        (_image("WEBP"), Preprocessing(channels=1), ("png", 90, 60, 1)),
    ],
)
def test_stored_image_is_as_asked_and_as_predicted(source, options, expected):
    stored = preprocess(source, options)
    assert _facts(stored) == expected
    # The plan's prediction from the source's header facts, probed for preprocessing as a run
    # probes them, is the same.
    facts = probe_image_bytes(source, orientation=True)
    assert options.stored_facts(*_facts_of(facts), max_pixels=10**9) == expected
    assert preprocess(source, options) == stored  # deterministic


def test_an_8_bit_bmp_keeps_its_palettes_colours_whatever_it_is_encoded_to(tf):
    """TensorFlow decodes an 8-bit BMP to its raw palette indices (1 channel); preprocessing
    decodes the picture, so a colour palette stays colour in every stored format (it became
    grey in PNG and JPEG, and colour in WebP, which holds no grey)."""
    source = _image("BMP", mode="P")  # left half red, right half green
    picture = np.asarray(Image.open(io.BytesIO(source)).convert("RGB"), dtype=int)
    for encode in ("png", "jpeg", "webp"):
        stored = preprocess(source, Preprocessing(encode=encode, quality=100))
        decoded = tf.io.decode_image(stored, expand_animations=False).numpy().astype(int)
        assert decoded.shape == picture.shape, encode
        if encode == "png":
            assert (decoded == picture).all()
        for columns in (slice(0, 30), slice(60, 90)):  # away from the edge lossy formats blur
            # The palette's dithering is noise to lossy formats: their colours are compared on
            # average.
            colour, expected = (p[:, columns].mean(axis=(0, 1)) for p in (decoded, picture))
            assert abs(colour - expected).max() < 4, (encode, colour, expected)


@pytest.mark.parametrize(("source", "box"), [((1000, 15), (32, 32)), ((2, 20000), (10, 10))])
def test_pad_keeps_a_side_that_would_round_to_no_pixels_at_one(source, box):
    # ImageOps.pad rounded the 1000x15 line's height to 0 inside 32x32, and Pillow's refusal
    # to resize to it was reported as "the JPEG file cannot be decoded" (CorruptImage).
    data = _image(fmt="PNG", size=source)
    padded = Image.open(io.BytesIO(preprocess(data, Preprocessing(size=box, mode="pad"))))
    assert padded.size == box
    pixels = np.asarray(padded.convert("RGB")).astype(int)
    lines = pixels.max(axis=(1, 2)) if source[0] > source[1] else pixels.max(axis=(0, 2))
    assert (lines > 100).sum() == 1 and (lines < 16).sum() == len(lines) - 1  # one line kept


def test_pad_gives_the_bytes_it_gave_for_images_pillow_fits():
    # The same bytes as ImageOps.pad wherever it works: the outputs of unchanged inputs stay.
    from PIL import ImageOps

    for size, box in (((200, 50), (40, 40)), ((50, 200), (40, 40)), ((90, 60), (30, 20))):
        image = Image.open(io.BytesIO(_image(fmt="PNG", size=size))).convert("RGB")
        expected = ImageOps.pad(image, box, method=Image.Resampling.LANCZOS, color=0)
        got = Image.open(
            io.BytesIO(
                preprocess(_image(fmt="PNG", size=size), Preprocessing(size=box, mode="pad"))
            )
        )
        assert np.array_equal(np.asarray(got.convert("RGB")), np.asarray(expected)), size


def test_crop_keeps_the_center_and_pad_keeps_everything():
    source = _image(size=(200, 50))  # left half red, right half green
    cropped = Image.open(io.BytesIO(preprocess(source, Preprocessing(size=(20, 20)))))
    padded = Image.open(io.BytesIO(preprocess(source, Preprocessing(size=(40, 40), mode="pad"))))
    # Crop: the center of a 200x50 image is half red, half the other colour, no border.
    assert cropped.getpixel((2, 10))[0] > 200 and cropped.getpixel((17, 10))[0] < 80
    # Pad: the whole image fits 40x10 in the middle, black bands above and below.
    assert max(padded.getpixel((20, 1))) < 16 and max(padded.getpixel((20, 38))) < 16
    assert padded.getpixel((5, 20))[0] > 200 and padded.getpixel((35, 20))[0] < 80


def test_exif_orientation_is_applied_when_pixels_are_re_encoded():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    source = _image(size=(80, 40), exif=exif.tobytes())
    stored = preprocess(source, Preprocessing(encode="png"))
    image = Image.open(io.BytesIO(stored))
    assert image.size == (40, 80)
    assert image.getpixel((20, 5))[0] > 200  # the left (red) half is now on top
    assert image.getpixel((20, 75))[0] < 80
    assert "exif" not in image.info  # only pixels are stored


def test_quality_changes_the_bytes_and_nothing_else_does():
    source = _image(size=(120, 90))
    low = preprocess(source, Preprocessing(encode="jpeg", quality=20))
    high = preprocess(source, Preprocessing(encode="jpeg", quality=95))
    assert len(low) < len(high)
    assert _facts(low) == _facts(high) == ("jpeg", 120, 90, 3)


def test_pixel_limit_holds_before_decoding_and_after_resizing():
    with pytest.raises(InputError) as raised:
        preprocess(_image(size=(300, 300)), Preprocessing(size=(8, 8)), max_pixels=1000)
    assert raised.value.kind == "DecompressionBomb"
    with pytest.raises(InputError) as raised:  # a thin strip whose long side would explode
        preprocess(_image(size=(2, 400)), Preprocessing(shorter_side=100), max_pixels=30_000)
    assert raised.value.kind == "ResizeTooLarge"


@pytest.mark.parametrize(
    ("source_format", "fmt", "limit", "size", "options"),
    [
        ("PNG", "webp", 16383, lambda side: (side, 2), lambda side: Preprocessing(encode="webp")),
        ("PNG", "jpeg", 65500, lambda side: (2, side), lambda side: Preprocessing(encode="jpeg")),
        # A WebP strip resized (--resize WxH) to be wider than WebP holds.
        (
            "WEBP",
            "webp",
            16383,
            lambda side: (-(-side // 4), 1),
            lambda side: Preprocessing(size=(side, 4), mode="pad"),
        ),
    ],
)
def test_a_side_longer_than_the_stored_format_holds_is_refused_before_encoding(
    source_format, fmt, limit, size, options, tf
):
    """JPEG holds at most 65,500 pixels a side, WebP 16,383: beyond them Pillow's encoder
    failed in the writer, and the good source file was quarantined as CorruptImage ('the PNG
    file cannot be decoded for --resize/--encode: broken data stream when writing image
    file'). The stored size is known from the header: the record is refused as it is planned."""
    over = limit + 4
    with pytest.raises(InputError) as raised:
        options(over).stored_facts(source_format.lower(), *size(over), 3, 10**9)
    assert raised.value.kind == "TooLargeForFormat"
    assert f"{limit:,} pixels a side" in raised.value.message
    with pytest.raises(InputError) as raised:
        preprocess(_image(source_format, size=size(over)), options(over), max_pixels=10**9)
    assert raised.value.kind == "TooLargeForFormat"
    # At the limit itself it is stored, and TensorFlow decodes it to the predicted size.
    stored = preprocess(_image(source_format, size=size(limit)), options(limit), max_pixels=10**9)
    width, height = options(limit).output_size(*size(limit))
    assert _facts(stored) == (fmt, width, height, 3)
    decoded = tf.io.decode_image(stored, expand_animations=False)
    assert tuple(decoded.shape) == (height, width, 3)


def test_an_image_too_wide_for_the_stored_format_is_a_record_error_naming_the_limit(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    (source / "panorama.png").write_bytes(_image("PNG", size=(20000, 20)))
    (source / "small.png").write_bytes(_image("PNG", size=(30, 20)))
    out = tmp_path / "out"
    result = _convert(source, "-o", out, "--encode", "webp")
    (error,) = read_errors(out)
    assert error["error"] == "TooLargeForFormat" and error["stage"] == "record"
    assert error["source"]["path"].endswith("panorama.png")
    assert "20,000x20" in error["message"] and "16,383" in error["message"]
    assert "Maximum supported" not in result.stderr and "Traceback" not in result.stderr
    manifest, splits = read_dataset(out)
    assert manifest["num_inputs"] == 2 and manifest["num_records"] == 1
    assert [r["image/format"] for r in splits["train"]] == [b"webp"]


def _bad_filter_png(width=16, height=16) -> bytes:
    """A PNG whose structure is sound (CRCs, complete zlib stream of the right length) but
    whose rows use a filter type that does not exist: only a decoder finds it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x09" + bytes(width * 3) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_a_decode_failure_is_an_input_error():
    with pytest.raises(InputError) as raised:
        preprocess(_bad_filter_png(), Preprocessing(size=(8, 8)))
    assert raised.value.kind == "CorruptImage"
    assert "cannot be decoded" in raised.value.message


def test_stored_record_equals_the_example_built_with_the_stored_image():
    example = codec.build_example(
        {
            keys.IMAGE_FORMAT: ("bytes", (b"jpeg",)),
            keys.IMAGE_HEIGHT: ("int64", (600,)),
            keys.IMAGE_WIDTH: ("int64", (900,)),
            keys.IMAGE_CHANNELS: ("int64", (3,)),
            keys.IMAGE_FILENAME: ("bytes", (b"a/b.jpg",)),
            keys.IMAGE_LABEL: ("int64", (2,)),
        }
    )
    skeleton, offset = serialize_around(example, keys.IMAGE_ENCODED, 4321)  # the estimate
    payload = preprocess(_image(), Preprocessing(size=(30, 20), encode="png"))
    pieces = stored_record(skeleton, offset, 4321, payload)
    expected = codec.build_example(
        {
            keys.IMAGE_FORMAT: ("bytes", (b"png",)),
            keys.IMAGE_HEIGHT: ("int64", (20,)),
            keys.IMAGE_WIDTH: ("int64", (30,)),
            keys.IMAGE_CHANNELS: ("int64", (3,)),
            keys.IMAGE_FILENAME: ("bytes", (b"a/b.jpg",)),
            keys.IMAGE_LABEL: ("int64", (2,)),
            keys.IMAGE_ENCODED: ("bytes", (payload,)),
        }
    )
    assert b"".join(pieces) == codec.serialize(expected)
    assert pieces[1] is payload


@pytest.fixture
def photos(tmp_path):
    """Two classes of images of every format, sizes and modes varied, one that only a decoder
    finds damaged."""
    root = tmp_path / "photos"
    shapes = [("JPEG", (64, 48), "RGB"), ("PNG", (33, 77), "RGBA"), ("GIF", (40, 40), "P")]
    shapes += [("BMP", (31, 17), "RGB"), ("WEBP", (50, 60), "RGB"), ("JPEG", (120, 80), "L")]
    for index, (fmt, size, mode) in enumerate(shapes * 2):
        label = "cat" if index % 2 else "dog"
        make_image(root / label / f"{index}.{fmt.lower()}", fmt, size=size, mode=mode, seed=index)
    (root / "dog" / "bad-filter.png").write_bytes(_bad_filter_png())
    return root


def _convert(*args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [RECORDFORGE, "convert", *map(str, args)], capture_output=True, text=True, timeout=600
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_resize_wxh_batches_with_tensorflow_and_the_manifest_says_what_was_done(
    photos, tmp_path, tf
):
    import recordforge

    out = tmp_path / "out"
    _convert(photos, "-o", out, "--resize", "32x24", "--channels", "3")
    manifest, splits = read_dataset(out)
    records = splits["train"]
    assert len(records) == 12 and manifest["num_records"] == 12
    assert manifest["options"]["preprocessing"] == {
        "resize": "32x24",
        "resize_mode": "crop",
        "encode": None,
        "quality": None,
        "channels": 3,
        "exif_orientation": "applied",
        "filter": "lanczos",
        "jpeg_decode": "DCT-scaled to at least twice the stored size",
        "pillow": Image.__version__,
    }
    # The features describe the stored image: the decoder agrees with them.
    for record in records:
        pixels = tf.io.decode_image(record["image/encoded"], expand_animations=False)
        assert tuple(pixels.shape) == (24, 32, 3)
        assert (record["image/height"], record["image/width"], record["image/channels"]) == (
            24,
            32,
            3,
        )
        assert record["image/format"].decode() in ("jpeg", "png", "webp")
    assert {r["image/format"] for r in records} == {b"jpeg", b"png", b"webp"}  # GIF, BMP → PNG
    # The damaged image is in the quarantine with its reason, counted, and the run went on.
    (error,) = read_errors(out)
    assert error["error"] == "CorruptImage" and error["source"]["path"].endswith("bad-filter.png")
    assert manifest["num_inputs"] == 13
    # The shard sizes recorded are the real ones.
    (shard,) = shard_files(out)
    assert manifest["splits"]["train"]["num_bytes"] == shard.stat().st_size
    # load(decode_images=True) then .batch(): every image has the same shape.
    loaded = recordforge.load(str(out), decode_images=True)
    (batch,) = list(loaded.batch(12))
    assert tuple(batch["image"].shape) == (12, 24, 32, 3)


def test_preprocessed_shards_are_byte_identical_across_runs_and_worker_counts(photos, tmp_path):
    args = ("--name", "ds", "--resize", "20", "--encode", "webp", "--quality", "70")
    _convert(photos, "-o", tmp_path / "one", *args)
    _convert(photos, "-o", tmp_path / "two", *args, *MULTI_PROCESS)
    first, second = shard_files(tmp_path / "one"), shard_files(tmp_path / "two")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    manifests = [
        json.loads((tmp_path / n / "dataset_info.json").read_text()) for n in ("one", "two")
    ]
    for manifest in manifests:
        manifest.pop("created")
    assert manifests[0] == manifests[1]


def test_without_the_options_image_bytes_are_stored_as_they_are(photos, tmp_path):
    out = tmp_path / "out"
    result = _convert(photos, "-o", out)
    assert result.returncode == 0
    _, splits = read_dataset(out)
    stored = {r["image/filename"].decode(): r["image/encoded"] for r in splits["train"]}
    for name, data in stored.items():
        assert data == (photos / name).read_bytes()
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert "preprocessing" not in manifest["options"]
    assert manifest["features"]["image/encoded"]["description"] == "the original image file's bytes"


# The PNG specification's Adam7 passes: first column, first row, column step, row step.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2))
_ADAM7 += ((0, 1, 1, 2),)


def _interlaced_png(rows: list[bytes], width: int, channels: int, sub_filter: bool) -> bytes:
    """An 8-bit grey (1 channel) or RGB (3) PNG of these pixel rows, Adam7-interlaced (Pillow
    writes no interlaced PNG). The rows of each pass use filter type 0 (None) or, with
    `sub_filter`, 0 and 1 (Sub) in turn."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = bytearray()
    for x0, y0, dx, dy in _ADAM7:
        for index, y in enumerate(range(y0, len(rows), dy)):
            line = b"".join(
                rows[y][x * channels : (x + 1) * channels] for x in range(x0, width, dx)
            )
            if not line:
                break  # an empty pass has no rows, and no filter bytes
            if sub_filter and index % 2:
                left = bytes(channels) + line[:-channels]
                raw += b"\x01" + bytes((a - b) & 0xFF for a, b in zip(line, left, strict=True))
            else:
                raw += b"\x00" + line
    colour = {1: 0, 3: 2}[channels]
    header = struct.pack(">IIBBBBB", width, len(rows), 8, colour, 0, 0, 1)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(raw)))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("args", "modes"),
    [
        (["--encode", "png"], ("rgb", "grey")),
        (["--channels", "3"], ("rgb",)),
        (["--channels", "1"], ("grey",)),
        (["--resize", "13x10"], ("rgb", "grey")),
    ],
    ids=["encode-png", "channels-3-of-rgb", "channels-1-of-grey", "resize-to-its-size"],
)
def test_interlaced_pngs_keep_their_pixels_when_size_and_mode_stay(args, modes, tmp_path, tf):
    """Options that leave an image's size and mode as they are (so no step before the encoder
    needs its pixels) store an Adam7-interlaced PNG's pixels exactly, as TensorFlow decodes
    the source. Regression: the metadata was dropped before Pillow decoded the pixels, and
    with it the interlace flag: dark images were stored scrambled, others quarantined."""
    import numpy as np

    width, height = 13, 10  # not a multiple of 8: passes of uneven sizes
    rng = np.random.default_rng(5)
    sources = {}
    for mode in modes:
        channels = 3 if mode == "rgb" else 1
        for name, top, sub_filter in (("dark", 5, False), ("photo", 256, True)):
            pixels = rng.integers(0, top, (height, width, channels), dtype=np.uint8)
            data = _interlaced_png([row.tobytes() for row in pixels], width, channels, sub_filter)
            # The source is what it claims: TensorFlow (libpng) decodes it to these pixels.
            assert np.array_equal(tf.io.decode_png(data).numpy(), pixels)
            path = tmp_path / "src" / "x" / f"{name}-{mode}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            sources[f"x/{path.name}"] = pixels
    out = tmp_path / "out"
    _convert(tmp_path / "src", "-o", out, *args)
    _, splits = read_dataset(out)
    outcomes = {}  # each source: what became of it
    for error in read_errors(out):
        name = pathlib.Path(error["source"]["path"]).relative_to(tmp_path / "src").as_posix()
        outcomes[name] = error["error"]
    for record in splits["train"]:
        stored = tf.io.decode_png(record["image/encoded"]).numpy()
        same = record["image/format"] == b"png" and np.array_equal(
            stored, sources[record["image/filename"].decode()]
        )
        outcomes[record["image/filename"].decode()] = "same pixels" if same else "other pixels"
    assert outcomes == dict.fromkeys(sources, "same pixels")


def _gif(screen: tuple[int, int], offset: tuple[int, int], transparent: bool) -> bytes:
    """A one-frame 20x10 GIF (a red corner on a gradient) whose logical screen and frame offset
    are patched to `screen` and `offset`, its colour 0 transparent or not."""
    import numpy as np

    y, x = np.mgrid[0:10, 0:20]
    pixels = np.stack([x * 12, y * 25, np.full_like(x, 128)], -1).astype(np.uint8)
    pixels[:3, :3] = (255, 0, 0)
    image = Image.fromarray(pixels).convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    buffer = io.BytesIO()
    image.save(buffer, "GIF", **({"transparency": 0} if transparent else {}))
    data = bytearray(buffer.getvalue())
    data[6:10] = struct.pack("<HH", *screen)
    descriptor = data.index(b"\x2c", 13 + 3 * (2 << (data[10] & 7)))
    data[descriptor + 1 : descriptor + 5] = struct.pack("<HH", *offset)
    return bytes(data)


@pytest.mark.parametrize(
    ("screen", "offset", "transparent"),
    [
        ((40, 30), (0, 0), False),
        ((40, 30), (5, 5), False),
        ((20, 10), (0, 0), True),
        ((40, 30), (3, 2), True),
        ((20, 10), (5, 5), False),
    ],
    ids=[
        "screen-larger",
        "screen-larger-frame-offset",
        "transparent-colour",
        "all-three",
        "frame-past-the-screen",
    ],
)
def test_a_gif_is_stored_as_tensorflow_decodes_its_first_frame(screen, offset, transparent, tf):
    """A GIF re-encoded as PNG decodes to the pixels TensorFlow decodes the GIF to (README:
    GIF becomes PNG since TensorFlow decodes them alike): its canvas is the frames' extent, what
    the first frame leaves uncovered and its transparent pixels are black. Regression: Pillow's
    logical screen was squeezed into the frame's size (the picture distorted), and transparent
    pixels kept their palette colour."""
    import numpy as np

    source = _gif(screen, offset, transparent)
    expected = tf.io.decode_gif(source)[0].numpy()
    assert expected.shape == (10, 20, 3)  # TensorFlow's canvas: the frame's size
    stored = preprocess(source, Preprocessing(encode="png"))
    assert np.array_equal(tf.io.decode_png(stored).numpy(), expected)
    # Resized, it is that picture resized: the red corner stays a corner.
    resized = tf.io.decode_png(preprocess(source, Preprocessing(shorter_side=20))).numpy()
    assert resized.shape == (20, 40, 3)
    reference = Image.fromarray(expected).resize((40, 20), Image.Resampling.LANCZOS)
    assert np.abs(resized.astype(int) - np.asarray(reference).astype(int)).max() <= 1


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--resize", "32by32"], "--resize takes WxH (e.g. 224x224) or N"),
        (["--resize", "0x10"], "--resize takes WxH"),
        (["--resize", "-3"], "--resize takes WxH"),
        (["--resize", "100000x100000"], "makes images larger than --max-image-pixels"),
        (["--resize", "64", "--resize-mode", "pad"], "--resize-mode applies to --resize WxH"),
        (["--encode", "jpeg", "--quality", "0"], "--quality must be a whole number from 1 to 100"),
        (["--encode", "jpeg", "--quality", "high"], "--quality must be a whole number"),
        (["--encode", "png", "--quality", "80"], "--quality applies to JPEG and WebP"),
        (["--quality", "80"], "--quality needs --encode jpeg|webp (or --resize)"),
        (["--encode", "webp", "--channels", "1"], "--channels 1 cannot be stored as WebP"),
        (["--encode", "tiff"], "argument --encode: invalid choice: 'tiff'"),
        (["--channels", "4"], "argument --channels: invalid choice: '4'"),
    ],
)
def test_bad_preprocessing_options_exit_2_with_one_line(photos, tmp_path, args, phrase):
    result = _convert(photos, "-o", tmp_path / "out", *args, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_preprocessing_a_csv_without_images_is_a_usage_error(tmp_path):
    (tmp_path / "t.csv").write_text("id,x\n1,2\n")
    result = _convert(tmp_path / "t.csv", "-o", tmp_path / "out", "--resize", "8", check=False)
    assert result.returncode == 2
    assert "apply to images, and the CSV names none" in result.stderr


def test_the_python_api_takes_the_options_as_keywords(photos, tmp_path):
    import recordforge

    recordforge.convert(photos, tmp_path / "api", name="ds", resize="16x16", encode="png")
    _convert(photos, "-o", tmp_path / "cli", "--name", "ds", "--resize", "16x16", "--encode", "png")
    assert [p.read_bytes() for p in shard_files(tmp_path / "api")] == [
        p.read_bytes() for p in shard_files(tmp_path / "cli")
    ]
    with pytest.raises(UsageError, match="--resize takes WxH"):
        recordforge.convert(photos, tmp_path / "bad", resize="big")


def test_shards_stay_balanced_and_counted_when_sizes_are_only_estimated(many_images, tmp_path):
    out = tmp_path / "out"
    _convert(many_images, "-o", out, "--resize", "48x48", "--num-shards", "4")
    manifest = json.loads((out / "dataset_info.json").read_text())
    shards = manifest["splits"]["train"]["shards"]
    assert len(shards) == 4 and sum(s["num_records"] for s in shards) == 240
    assert manifest["num_records"] == 240
    for shard in shards:  # the sizes recorded are those written, not the plan's estimates
        assert (out / shard["file"]).stat().st_size == shard["num_bytes"] > 0
    mean = sum(s["num_bytes"] for s in shards) / 4
    assert max(s["num_bytes"] for s in shards) <= 1.25 * mean


def test_a_large_jpeg_decoded_at_reduced_scale_looks_like_the_full_decode():
    source = _image(size=(1600, 1200), quality=95)
    stored = Image.open(io.BytesIO(preprocess(source, Preprocessing(size=(100, 75)))))
    full = Image.open(io.BytesIO(source)).convert("RGB")
    reference = full.resize((100, 75), Image.Resampling.LANCZOS)
    difference = [abs(a - b) for a, b in zip(stored.tobytes(), reference.tobytes(), strict=True)]
    assert stored.size == (100, 75)
    assert sum(difference) / len(difference) < 3  # JPEG noise, not another picture


def test_exif_rotation_with_a_shorter_side_gives_the_rotated_size():
    exif = Image.Exif()
    exif[0x0112] = 8
    source = _image(size=(1200, 600), exif=exif.tobytes())
    assert _facts(preprocess(source, Preprocessing(shorter_side=50))) == ("jpeg", 50, 100, 3)
