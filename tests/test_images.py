"""Tests for transforms.core.images.probe: probing image headers, channel counts and rejections."""

from __future__ import annotations

import io
import random
import struct
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image, ImageFile, WebPImagePlugin

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.probe import (
    DEFAULT_MAX_PIXELS,
    SUPPORTED_FORMATS,
    ImageFacts,
    probe_image,
    probe_image_bytes,
)

WIDTH, HEIGHT = 37, 23  # odd and different, so a swapped or rounded size shows


# ---------------------------------------------------------------------------------------------
# Fixture builders: every file is generated here with Pillow (or by hand where Pillow cannot).


def _encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def _rgb(width: int = WIDTH, height: int = HEIGHT, seed: int = 0) -> Image.Image:
    """A noisy RGB picture: noise keeps lossy encoders honest and files of a useful size."""
    rng = random.Random(seed)
    return Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))


def _rgba() -> Image.Image:
    image = _rgb().convert("RGBA")
    image.putalpha(Image.linear_gradient("L").resize((WIDTH, HEIGHT)))
    return image


def _palette() -> Image.Image:
    return _rgb().convert("P", palette=Image.Palette.ADAPTIVE, colors=16)


def _png_chunk(chunk_type: bytes, data: bytes) -> bytes:
    body = chunk_type + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def _raw_png(bit_depth: int, colour_type: int, samples: int, extra: bytes = b"") -> bytes:
    """A PNG Pillow cannot write (e.g. 16-bit grey+alpha), with zero-valued pixels."""
    row = b"\x00" + bytes((WIDTH * samples * bit_depth + 7) // 8)
    ihdr = struct.pack(">IIBBBBB", WIDTH, HEIGHT, bit_depth, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + extra
        + _png_chunk(b"IDAT", zlib.compress(row * HEIGHT))
        + _png_chunk(b"IEND", b"")
    )


def _raw_bmp(bits: int, palette_size: int = 0) -> bytes:
    """An uncompressed BMP of any depth (Pillow writes only 1, 8, 24 and 32 bits)."""
    pixels = bytes(((WIDTH * bits + 31) // 32) * 4 * HEIGHT)
    palette = bytes(4 * palette_size)
    offset = 14 + 40 + len(palette)
    info = struct.pack(
        "<IiiHHIIiiII", 40, WIDTH, HEIGHT, 1, bits, 0, len(pixels), 2835, 2835, palette_size, 0
    )
    header = struct.pack("<2sIHHI", b"BM", offset + len(pixels), 0, 0, offset)
    return header + info + palette + pixels


def _animated_gif(transparency: int | None = None) -> bytes:
    frames = [_rgb(seed=seed).convert("P", palette=Image.Palette.ADAPTIVE) for seed in range(3)]
    params: dict[str, object] = {"save_all": True, "append_images": frames[1:]}
    if transparency is not None:
        params["transparency"] = transparency
    return _encode(frames[0], "GIF", **params)


def _animated_webp(image: Image.Image, **params: object) -> bytes:
    return _encode(image, "WEBP", save_all=True, append_images=[image.rotate(90)], **params)


def _with_pixels_in_header(data: bytes, fmt: str, width: int, height: int) -> bytes:
    """Rewrites the size recorded in a header (the pixel data stays small): a decompression bomb."""
    out = bytearray(data)
    if fmt == "png":
        out[16:24] = struct.pack(">II", width, height)
        out[29:33] = struct.pack(">I", zlib.crc32(bytes(out[12:29])))
    elif fmt == "jpeg":
        sof = out.index(b"\xff\xc0")
        out[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    elif fmt == "gif":
        out[6:10] = struct.pack("<HH", width, height)
    elif fmt == "bmp":
        out[18:26] = struct.pack("<ii", width, height)
    elif fmt == "webp":  # lossy VP8: 14-bit sizes at bytes 26 and 28
        out[26:30] = struct.pack("<HH", width, height)
    return bytes(out)


# name -> (builder, expected facts). test_channels_match_tensorflow checks every expectation
# against tf.io.decode_image; the comments note where TensorFlow differs from Pillow's mode.
FACT_CASES: dict[str, tuple[Callable[[], bytes], ImageFacts]] = {
    "jpeg_L": (lambda: _encode(_rgb().convert("L"), "JPEG"), ImageFacts("jpeg", WIDTH, HEIGHT, 1)),
    "jpeg_RGB": (lambda: _encode(_rgb(), "JPEG"), ImageFacts("jpeg", WIDTH, HEIGHT, 3)),
    # TensorFlow converts CMYK to RGB itself: 3 channels, not 4.
    "jpeg_CMYK": (
        lambda: _encode(_rgb().convert("CMYK"), "JPEG"),
        ImageFacts("jpeg", WIDTH, HEIGHT, 3),
    ),
    "jpeg_progressive": (
        lambda: _encode(_rgb(), "JPEG", progressive=True),
        ImageFacts("jpeg", WIDTH, HEIGHT, 3),
    ),
    "mpo": (
        lambda: _encode(_rgb(), "MPO", save_all=True, append_images=[_rgb(seed=1)]),
        ImageFacts("jpeg", WIDTH, HEIGHT, 3),
    ),
    "png_1": (lambda: _encode(_rgb().convert("1"), "PNG"), ImageFacts("png", WIDTH, HEIGHT, 1)),
    "png_L": (lambda: _encode(_rgb().convert("L"), "PNG"), ImageFacts("png", WIDTH, HEIGHT, 1)),
    "png_LA": (lambda: _encode(_rgba().convert("LA"), "PNG"), ImageFacts("png", WIDTH, HEIGHT, 2)),
    "png_RGB": (lambda: _encode(_rgb(), "PNG"), ImageFacts("png", WIDTH, HEIGHT, 3)),
    "png_RGBA": (lambda: _encode(_rgba(), "PNG"), ImageFacts("png", WIDTH, HEIGHT, 4)),
    "png_P": (lambda: _encode(_palette(), "PNG"), ImageFacts("png", WIDTH, HEIGHT, 3)),
    "png_P_transparent_index": (
        lambda: _encode(_palette(), "PNG", transparency=0),
        ImageFacts("png", WIDTH, HEIGHT, 4),
    ),
    # A tRNS chunk that makes nothing transparent still gives TensorFlow an alpha channel.
    "png_P_opaque_tRNS": (
        lambda: _encode(_palette(), "PNG", transparency=bytes([255] * 16)),
        ImageFacts("png", WIDTH, HEIGHT, 4),
    ),
    "png_I16": (
        lambda: _encode(Image.new("I;16", (WIDTH, HEIGHT), 1000), "PNG"),
        ImageFacts("png", WIDTH, HEIGHT, 1),
    ),
    # Pillow opens 16-bit grey+alpha as RGBA; TensorFlow keeps 2 channels.
    "png_LA_16bit": (lambda: _raw_png(16, 4, 2), ImageFacts("png", WIDTH, HEIGHT, 2)),
    "png_L_2bit": (lambda: _raw_png(2, 0, 1), ImageFacts("png", WIDTH, HEIGHT, 1)),
    # tRNS on grey or RGB does not add an alpha channel in TensorFlow.
    "png_L_tRNS": (
        lambda: _raw_png(8, 0, 1, _png_chunk(b"tRNS", b"\x00\x05")),
        ImageFacts("png", WIDTH, HEIGHT, 1),
    ),
    "png_RGB_tRNS": (
        lambda: _raw_png(8, 2, 3, _png_chunk(b"tRNS", bytes(6))),
        ImageFacts("png", WIDTH, HEIGHT, 3),
    ),
    "apng": (
        lambda: _encode(_rgb(), "PNG", save_all=True, append_images=[_rgb(seed=1)]),
        ImageFacts("png", WIDTH, HEIGHT, 3),
    ),
    # TensorFlow decodes every GIF to RGB, with or without transparency or animation.
    "gif_P": (lambda: _encode(_palette(), "GIF"), ImageFacts("gif", WIDTH, HEIGHT, 3)),
    "gif_P_transparent": (
        lambda: _encode(_palette(), "GIF", transparency=0),
        ImageFacts("gif", WIDTH, HEIGHT, 3),
    ),
    "gif_L": (lambda: _encode(_rgb().convert("L"), "GIF"), ImageFacts("gif", WIDTH, HEIGHT, 3)),
    "gif_animated": (_animated_gif, ImageFacts("gif", WIDTH, HEIGHT, 3)),
    "gif_animated_transparent": (
        lambda: _animated_gif(transparency=0),
        ImageFacts("gif", WIDTH, HEIGHT, 3),
    ),
    # TensorFlow returns bits_per_pixel / 8 channels for BMP: palette indices come back as 1
    # channel, and a 32-bit file is 4 channels although Pillow reads it as RGB.
    "bmp_RGB": (lambda: _encode(_rgb(), "BMP"), ImageFacts("bmp", WIDTH, HEIGHT, 3)),
    "bmp_RGBA": (lambda: _encode(_rgba(), "BMP"), ImageFacts("bmp", WIDTH, HEIGHT, 4)),
    "bmp_L": (lambda: _encode(_rgb().convert("L"), "BMP"), ImageFacts("bmp", WIDTH, HEIGHT, 1)),
    "bmp_P": (lambda: _encode(_palette(), "BMP"), ImageFacts("bmp", WIDTH, HEIGHT, 1)),
    "webp_RGB": (lambda: _encode(_rgb(), "WEBP"), ImageFacts("webp", WIDTH, HEIGHT, 3)),
    "webp_RGBA": (lambda: _encode(_rgba(), "WEBP"), ImageFacts("webp", WIDTH, HEIGHT, 4)),
    "webp_lossless_RGB": (
        lambda: _encode(_rgb(), "WEBP", lossless=True),
        ImageFacts("webp", WIDTH, HEIGHT, 3),
    ),
    "webp_lossless_RGBA": (
        lambda: _encode(_rgba(), "WEBP", lossless=True),
        ImageFacts("webp", WIDTH, HEIGHT, 4),
    ),
    # An alpha channel that is fully opaque is dropped by the encoder: 3 channels.
    "webp_lossless_opaque_RGBA": (
        lambda: _encode(_rgb().convert("RGBA"), "WEBP", lossless=True),
        ImageFacts("webp", WIDTH, HEIGHT, 3),
    ),
    "webp_VP8X_icc": (
        lambda: _encode(_rgb(), "WEBP", icc_profile=b"\x00" * 3000),
        ImageFacts("webp", WIDTH, HEIGHT, 3),
    ),
}

# Files TensorFlow 2.21 cannot decode: the probe refuses them (image_formats.check_bmp_layout).
UNDECODABLE_CASES: dict[str, tuple[Callable[[], bytes], ImageFacts]] = {
    "bmp_1bit": (lambda: _encode(_rgb().convert("1"), "BMP"), ImageFacts("bmp", WIDTH, HEIGHT, 1)),
    "bmp_4bit": (lambda: _raw_bmp(4, palette_size=16), ImageFacts("bmp", WIDTH, HEIGHT, 1)),
    "bmp_16bit": (lambda: _raw_bmp(16), ImageFacts("bmp", WIDTH, HEIGHT, 3)),
}


def _large(fmt: str) -> bytes:
    """A file well past the 64 KiB head, so the probe must read the end separately."""
    image = _rgb(300, 300, seed=7)
    if fmt == "gif":
        return _encode(image.convert("P"), "GIF")
    params = {"jpeg": {"quality": 95}, "webp": {"lossless": True}}.get(fmt, {})
    return _encode(image, fmt.upper(), **params)


def _small(fmt: str) -> bytes:
    image = _rgb(64, 48, seed=3)
    if fmt == "gif":
        return _encode(image.convert("P"), "GIF")
    return _encode(image, fmt.upper())


def _kind(call: Callable[[], object]) -> str:
    with pytest.raises(InputError) as caught:
        call()
    return caught.value.kind


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes any pixel decode fail the test."""

    def refuse(self: ImageFile.ImageFile) -> None:
        raise AssertionError(f"{self.format} pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    monkeypatch.setattr(WebPImagePlugin.WebPImageFile, "load", refuse)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _probe_file(path: Path, **kwargs: int) -> ImageFacts:
    with path.open("rb") as stream:
        return probe_image(stream, path.stat().st_size, **kwargs)


# ---------------------------------------------------------------------------------------------
# Facts and channels.


def test_public_constants() -> None:
    assert DEFAULT_MAX_PIXELS == 89_478_485
    assert SUPPORTED_FORMATS == frozenset({"jpeg", "png", "gif", "bmp", "webp"})


@pytest.mark.parametrize("name", sorted(FACT_CASES))
def test_probe_reports_facts(name: str, tmp_path: Path) -> None:
    build, expected = FACT_CASES[name]
    data = build()
    path = _write(tmp_path, f"{name}.img", data)

    assert _probe_file(path) == expected
    assert probe_image_bytes(data) == expected


@pytest.mark.parametrize("name", sorted(FACT_CASES))
def test_channels_match_tensorflow(name: str, tf) -> None:
    build, expected = FACT_CASES[name]
    decoded = tf.io.decode_image(build(), expand_animations=False)

    assert tuple(decoded.shape) == (expected.height, expected.width, expected.channels)


@pytest.mark.parametrize("name", sorted(UNDECODABLE_CASES))
def test_low_and_16_bit_bmps_that_tensorflow_cannot_decode_are_refused(name: str, tf) -> None:
    build, _ = UNDECODABLE_CASES[name]
    with pytest.raises(tf.errors.InvalidArgumentError, match="Number of channels"):
        tf.io.decode_image(build(), expand_animations=False)
    assert _kind(lambda: probe_image_bytes(build())) == "UnsupportedImageFormat"


@pytest.mark.parametrize("fmt", sorted(SUPPORTED_FORMATS))
def test_large_files_probe_like_small_ones(fmt: str, tmp_path: Path, tf) -> None:
    data = _large(fmt)
    assert len(data) > 64 * 1024
    path = _write(tmp_path, f"large.{fmt}", data)

    facts = _probe_file(path)

    assert facts == probe_image_bytes(data)
    assert (facts.format, facts.width, facts.height) == (fmt, 300, 300)
    assert tf.io.decode_image(data, expand_animations=False).shape[-1] == facts.channels


def test_format_comes_from_the_bytes_not_the_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "holiday.jpg", _encode(_rgb(), "PNG"))
    assert _probe_file(path) == ImageFacts("png", WIDTH, HEIGHT, 3)


def test_jpeg_header_beyond_the_first_64_kib(tmp_path: Path) -> None:
    data = _encode(_rgb(), "JPEG", icc_profile=random.Random(1).randbytes(200_000))
    assert data.index(b"\xff\xc0") > 64 * 1024  # the size (SOF) really is past the head
    path = _write(tmp_path, "big_icc.jpg", data)

    assert _probe_file(path) == ImageFacts("jpeg", WIDTH, HEIGHT, 3)
    assert probe_image_bytes(data) == ImageFacts("jpeg", WIDTH, HEIGHT, 3)


@pytest.mark.parametrize("icc_bytes", [20_000, 50_000])
def test_jpeg_header_past_the_first_read_is_read_on_to(icc_bytes: int) -> None:
    """The probe reads 16 KiB first, then 64 KiB when the header needs more, without a seek."""
    data = _encode(_rgb(), "JPEG", icc_profile=random.Random(1).randbytes(icc_bytes))
    assert 16 * 1024 < data.index(b"\xff\xc0") < 64 * 1024
    reader = _CountingReader(data)

    assert probe_image(reader, len(data)) == ImageFacts("jpeg", WIDTH, HEIGHT, 3)
    assert probe_image_bytes(data) == ImageFacts("jpeg", WIDTH, HEIGHT, 3)
    assert reader.seeks <= 1  # the tail's
    assert reader.bytes_read <= 64 * 1024 + 12


def test_webp_with_large_icc_before_the_bitstream(tmp_path: Path) -> None:
    data = _encode(_rgba(), "WEBP", icc_profile=random.Random(2).randbytes(100_000))
    path = _write(tmp_path, "big_icc.webp", data)
    assert _probe_file(path) == ImageFacts("webp", WIDTH, HEIGHT, 4)


# ---------------------------------------------------------------------------------------------
# Files that are not (supported) images.


def test_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "empty.png", b"")
    with pytest.raises(InputError) as caught:
        _probe_file(path)
    assert (caught.value.kind, caught.value.message) == ("EmptyFile", "the file is empty (0 bytes)")
    assert _kind(lambda: probe_image_bytes(b"")) == "EmptyFile"


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("text", b"hello world, this is not a picture\n" * 40),
        ("csv", b"path,label\nimages/a.jpg,cat\nimages/b.jpg,dog\n" * 100),
        ("random", random.Random(42).randbytes(100_000)),
        ("short", b"GI"),
    ],
)
def test_not_an_image(name: str, data: bytes, tmp_path: Path) -> None:
    path = _write(tmp_path, f"{name}.jpg", data)
    with pytest.raises(InputError) as caught:
        _probe_file(path)

    assert caught.value.kind == "NotAnImage"
    # No message quotes what the file holds (a CSV row may name any file on the machine).
    assert caught.value.message == (
        "not a recognised image (none of bmp, gif, jpeg, png, webp by its first bytes)"
    )
    assert repr(data[:4])[2:-1] not in caught.value.message
    assert _kind(lambda: probe_image_bytes(data)) == "NotAnImage"


@pytest.mark.parametrize(("fmt", "pillow_name"), [("TIFF", "TIFF"), ("ICO", "ICO")])
def test_unsupported_pillow_formats(fmt: str, pillow_name: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "picture.png", _encode(_rgb(), fmt))
    with pytest.raises(InputError) as caught:
        _probe_file(path)

    assert caught.value.kind == "UnsupportedImageFormat"
    assert caught.value.message == (
        f"{pillow_name} images are not supported (supported: bmp, gif, jpeg, png, webp)"
    )


def _animated_webp_bomb() -> bytes:
    data = bytearray(_animated_webp(_rgb()))
    data[24:30] = (40000 - 1).to_bytes(3, "little") * 2  # VP8X canvas: 40000x40000
    return bytes(data)


# Animated WebPs are rejected: tf.io.decode_image in TF 2.21 corrupts the heap and aborts the
# process on those without alpha (its animated-WebP path assumes 4 channels), so no test here
# hands one to TensorFlow. Animated GIFs stay supported (see FACT_CASES).
ANIMATED_WEBP_CASES: dict[str, Callable[[], bytes]] = {
    "RGB": lambda: _animated_webp(_rgb()),
    "RGBA": lambda: _animated_webp(_rgba()),
    "lossless": lambda: _animated_webp(_rgb(), lossless=True),
    "large": lambda: _animated_webp(_rgb(300, 300, seed=7), lossless=True),  # past the head
    # Neither an inconclusive end, a missing end nor a huge canvas gets as far as a decode.
    "appended": lambda: _animated_webp(_rgb()) + b"appended" * 10,
    "truncated": lambda: _animated_webp(_rgb())[:-20],
    "bomb": _animated_webp_bomb,
}


@pytest.mark.parametrize("name", sorted(ANIMATED_WEBP_CASES))
def test_animated_webp_is_rejected_from_the_header(
    name: str, tmp_path: Path, no_decoding: None, no_webp_decoder: None
) -> None:
    data = ANIMATED_WEBP_CASES[name]()
    assert data[12:16] == b"VP8X" and data[20] & 0x02  # the VP8X animation flag is set
    path = _write(tmp_path, f"{name}.webp", data)

    with pytest.raises(InputError) as caught:
        _probe_file(path)

    assert caught.value.kind == "UnsupportedImageFormat"
    assert "animated WebP" in caught.value.message
    assert _kind(lambda: probe_image_bytes(data)) == "UnsupportedImageFormat"
    reader = _CountingReader(data)
    with pytest.raises(InputError):
        probe_image(reader, len(data))
    # The first read only (16 KiB): the animation flag is in the first chunk.
    assert (reader.seeks, reader.bytes_read) == (0, min(len(data), 16 * 1024))


def test_animated_webp_message() -> None:
    with pytest.raises(InputError) as caught:
        probe_image_bytes(_animated_webp(_rgb()))
    assert caught.value.message == (
        "animated WebP images are not supported (TensorFlow cannot decode them reliably); "
        "convert them to GIF or still images"
    )


# ---------------------------------------------------------------------------------------------
# Truncated and corrupt files.

TRUNCATIONS = [
    # (format, bytes kept: "half" or a negative count cut from the end)
    ("jpeg", "half"),
    ("jpeg", -2),  # exactly the EOI marker
    ("jpeg", -5),
    ("png", "half"),
    ("png", -12),  # exactly the IEND chunk
    ("png", -3),
    ("gif", "half"),
    ("gif", -2),  # the trailer and the last block terminator
    ("gif", -5),
    ("bmp", "half"),
    ("bmp", -3),
    ("webp", "half"),
    ("webp", -3),
]


def _cut(data: bytes, keep: str | int) -> bytes:
    return data[: len(data) // 2] if keep == "half" else data[:keep]


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize(("fmt", "keep"), TRUNCATIONS)
def test_truncated_files(fmt: str, keep: str | int, size: str, tmp_path: Path, tf) -> None:
    data = _cut((_small if size == "small" else _large)(fmt), keep)
    path = _write(tmp_path, f"cut.{fmt}", data)

    with pytest.raises(InputError) as caught:
        _probe_file(path)

    assert caught.value.kind == "TruncatedImage", caught.value.message
    assert caught.value.message.startswith(f"the {fmt.upper()} file is truncated")
    assert _kind(lambda: probe_image_bytes(data)) == "TruncatedImage"
    with pytest.raises(tf.errors.InvalidArgumentError):  # training could not read it either
        tf.io.decode_image(data, expand_animations=False)


def test_gif_missing_only_its_trailer_is_accepted(tf) -> None:
    # Every block is complete; giflib (hence TensorFlow) and Pillow both decode it.
    data = _small("gif")[:-1]
    facts = probe_image_bytes(data)

    assert facts == ImageFacts("gif", 64, 48, 3)
    assert tuple(tf.io.decode_image(data, expand_animations=False).shape) == (48, 64, 3)


def _corrupt_jpeg_header() -> bytes:
    # SOI, a JFIF segment, then EOI: a well-ended JPEG with no frame header at all.
    jfif = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    return b"\xff\xd8\xff\xe0" + struct.pack(">H", len(jfif) + 2) + jfif + b"\xff\xd9"


def _png_with_bad_ihdr_crc() -> bytes:
    data = bytearray(_small("png"))
    data[29] ^= 0xFF
    return bytes(data)


def _gif_with_unknown_block() -> bytes:
    # An unknown block where the first image should start (Pillow skips it, giflib does not),
    # and bytes after the trailer so that the end check cannot vouch for the file.
    data = _small("gif")
    first_block = 13 + (3 << ((data[10] & 7) + 1))
    return data[:first_block] + b"\x99" + data[first_block:] + b"appended"


def _webp_with_bad_start_code() -> bytes:
    data = bytearray(_small("webp"))
    data[23:26] = b"\x00\x00\x00"
    return bytes(data)


def _jpeg_with_random_scan_and_appended_data() -> bytes:
    data = _small("jpeg")
    scan = data.index(b"\xff\xda")
    return data[: scan + 20] + random.Random(1).randbytes(1000) + b"\xff\xd9appended"


def _jpeg_with_bad_precision_and_appended_data() -> bytes:
    return _small("jpeg").replace(b"\xff\xc0\x00\x11\x08", b"\xff\xc0\x00\x11\x07", 1) + b"xx"


def _png_with_bad_compressed_data_and_appended_data() -> bytes:
    data = bytearray(_small("png"))
    idat = data.index(b"IDAT")
    data[idat + 4 : idat + 30] = random.Random(2).randbytes(26)
    return bytes(data) + b"appended"


def _bmp_with_unsupported_depth() -> bytes:
    data = bytearray(_small("bmp"))
    data[28:30] = struct.pack("<H", 7)
    return bytes(data)


@pytest.mark.parametrize(
    "build",
    [
        _corrupt_jpeg_header,
        _png_with_bad_ihdr_crc,
        _gif_with_unknown_block,
        _webp_with_bad_start_code,
        _jpeg_with_random_scan_and_appended_data,
        _jpeg_with_bad_precision_and_appended_data,
        _png_with_bad_compressed_data_and_appended_data,
        _bmp_with_unsupported_depth,
    ],
    ids=lambda build: build.__name__.lstrip("_"),
)
def test_corrupt_files(build: Callable[[], bytes], tmp_path: Path, tf) -> None:
    data = build()
    path = _write(tmp_path, "corrupt.img", data)

    with pytest.raises(InputError) as caught:
        _probe_file(path)

    assert caught.value.kind == "CorruptImage", caught.value.message
    assert _kind(lambda: probe_image_bytes(data)) == "CorruptImage"
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(data, expand_animations=False)


@pytest.mark.parametrize(
    ("fmt", "build", "expected"),
    [
        # Camera "motion photos" append a whole video after the JPEG's EOI marker.
        ("jpeg", lambda: _small("jpeg") + random.Random(3).randbytes(5000), (64, 48, 3)),
        ("jpeg", lambda: _large("jpeg") + random.Random(3).randbytes(5000), (300, 300, 3)),
        ("png", lambda: _small("png") + b"appended after IEND" * 10, (64, 48, 3)),
        ("png", lambda: _large("png") + b"appended after IEND" * 10, (300, 300, 3)),
        ("gif", lambda: _small("gif") + b"appended" * 10, (64, 48, 3)),
        # Many writers leave bfSize at 0: the quick end check is inconclusive; for a BMP the
        # layout check (its exact size) vouches for the file, as it does for TensorFlow.
        ("bmp", lambda: _small("bmp")[:2] + bytes(4) + _small("bmp")[6:], (64, 48, 3)),
        ("webp", lambda: _small("webp") + b"appended" * 10, (64, 48, 3)),
    ],
    ids=["jpeg", "jpeg_large", "png", "png_large", "gif", "bmp_bfSize_zero", "webp"],
)
def test_data_after_the_end_is_accepted_after_decoding(
    fmt: str,
    build: Callable[[], bytes],
    expected: tuple[int, int, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tf,
) -> None:
    data = build()
    path = _write(tmp_path, f"appended.{fmt}", data)
    decoded: list[str] = []
    real_load = ImageFile.ImageFile.load

    def counting_load(self: ImageFile.ImageFile):
        decoded.append(self.format)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)

    assert _probe_file(path) == ImageFacts(fmt, *expected)
    if fmt == "bmp":
        # TensorFlow copies a BMP's pixel array as stored: the layout check (the exact size) is
        # its whole check, and Pillow's decoder, which refuses palette and RLE-flagged files
        # TensorFlow decodes, is not asked.
        assert not decoded
    else:
        assert decoded  # the end check was inconclusive, so the pixels were decoded to decide
    assert probe_image_bytes(data) == ImageFacts(fmt, *expected)
    assert tf.io.decode_image(data, expand_animations=False).shape[-1] == expected[2]


def test_bmp_with_appended_data_is_refused_as_tensorflow_refuses_it(tf) -> None:
    # Pillow decodes it; TensorFlow insists that a BMP is exactly header + rows long, and a
    # record it cannot decode must not be written: the probe holds BMPs to its rule.
    data = _small("bmp") + b"appended"
    assert _kind(lambda: probe_image_bytes(data)) == "CorruptImage"
    with pytest.raises(tf.errors.InvalidArgumentError, match="Input size should match"):
        tf.io.decode_image(data, expand_animations=False)


# ---------------------------------------------------------------------------------------------
# Decompression bombs and max_pixels.

BOMB_MESSAGE = (
    "the image is 40000x40000 = 1,600,000,000 pixels, which exceeds the limit of 89,478,485 "
    "(--max-image-pixels)"
)


@pytest.fixture
def no_webp_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if libwebp's decoder (which allocates the whole canvas) is created."""

    def refuse(data: bytes) -> None:
        raise AssertionError("the WebP decoder was created")

    monkeypatch.setattr(WebPImagePlugin._webp, "WebPAnimDecoder", refuse)


@pytest.mark.parametrize(
    ("fmt", "width", "height"),
    [
        ("png", 40000, 40000),
        ("jpeg", 40000, 40000),
        ("gif", 40000, 40000),
        ("bmp", 40000, 40000),
        ("webp", 16383, 16383),  # the largest a lossy VP8 header can state
    ],
)
def test_decompression_bombs_are_rejected_undecoded(
    fmt: str, width: int, height: int, tmp_path: Path, no_decoding: None, no_webp_decoder: None
) -> None:
    data = _with_pixels_in_header(_small(fmt), fmt, width, height)
    path = _write(tmp_path, f"bomb.{fmt}", data)

    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        with pytest.raises(InputError) as caught:
            _probe_file(path)
        assert _kind(lambda: probe_image_bytes(data)) == "DecompressionBomb"

    assert caught.value.kind == "DecompressionBomb"
    assert f"{width}x{height} = {width * height:,} pixels" in caught.value.message
    assert caught_warnings == []


def test_png_bomb_message(no_decoding: None) -> None:
    data = _with_pixels_in_header(_small("png"), "png", 40000, 40000)
    with pytest.raises(InputError) as caught:
        probe_image_bytes(data)
    assert caught.value.message == BOMB_MESSAGE


def test_bomb_just_over_pillows_limit_raises_no_warning(no_decoding: None) -> None:
    data = _with_pixels_in_header(_small("png"), "png", 10000, 10000)
    with pytest.warns(Image.DecompressionBombWarning):  # what Image.open would have done
        Image.open(io.BytesIO(data))

    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        assert _kind(lambda: probe_image_bytes(data)) == "DecompressionBomb"

    assert caught_warnings == []


@pytest.mark.parametrize("side", [10000, 40000])
def test_gif_frame_larger_than_its_screen(side: int, no_decoding: None) -> None:
    # Pillow grows a GIF to fit its first frame and checks that size itself while opening (a
    # warning above 89 million pixels, an error above twice that): we must check it first.
    data = bytearray(_small("gif"))
    descriptor = 13 + (3 << ((data[10] & 7) + 1))
    assert data[descriptor] == 0x2C
    data[descriptor + 5 : descriptor + 9] = struct.pack("<HH", side, side)

    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        with pytest.raises(InputError) as caught:
            probe_image_bytes(bytes(data))

    assert caught.value.kind == "DecompressionBomb"
    assert f"{side}x{side} = {side * side:,} pixels" in caught.value.message
    assert caught_warnings == []


def test_max_pixels_is_a_strict_upper_bound() -> None:
    data = _encode(_rgb(), "PNG")
    assert probe_image_bytes(data, max_pixels=WIDTH * HEIGHT).width == WIDTH
    assert _kind(lambda: probe_image_bytes(data, max_pixels=WIDTH * HEIGHT - 1)) == (
        "DecompressionBomb"
    )


def test_max_pixels_above_pillows_own_limit_is_honoured(tmp_path: Path, no_decoding: None) -> None:
    # 225 million pixels: more than twice Pillow's global limit, so Image.open refuses the file.
    data = _with_pixels_in_header(_small("png"), "png", 15000, 15000)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(data))
    path = _write(tmp_path, "huge.png", data)

    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        facts = _probe_file(path, max_pixels=300_000_000)

    assert facts == ImageFacts("png", 15000, 15000, 3)
    assert caught_warnings == []
    assert Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS  # Pillow's global was left alone


# ---------------------------------------------------------------------------------------------
# Cost of the normal path.


@pytest.mark.parametrize("name", sorted(FACT_CASES))
def test_normal_path_does_not_decode(
    name: str, tmp_path: Path, no_decoding: None, no_webp_decoder: None
) -> None:
    build, expected = FACT_CASES[name]
    path = _write(tmp_path, name, build())

    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        assert _probe_file(path) == expected

    assert caught_warnings == []


class _CountingReader(io.RawIOBase):
    """A file that counts seeks and bytes read, like a metered cloud-storage reader."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.seeks = 0
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        self.bytes_read += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.seeks += 1
        return self._data.seek(offset, whence)

    def tell(self) -> int:
        return self._data.tell()


@pytest.mark.parametrize("fmt", sorted(SUPPORTED_FORMATS - {"gif"}))
def test_normal_path_reads_the_head_and_the_tail_only(fmt: str, no_decoding: None) -> None:
    data = _large(fmt)
    reader = _CountingReader(data)

    facts = probe_image(reader, len(data))

    assert (facts.width, facts.height) == (300, 300)
    assert reader.seeks <= 1
    assert reader.bytes_read <= 64 * 1024 + 12


def test_a_gif_is_read_once_through_its_blocks_without_decoding(no_decoding: None) -> None:
    # TensorFlow sizes a GIF by its widest and tallest frames, which only the whole block walk
    # finds; the walk reads each byte once and decodes no pixels.
    data = _large("gif")
    reader = _CountingReader(data)

    facts = probe_image(reader, len(data))

    assert (facts.width, facts.height) == (300, 300)
    assert len(data) > 64 * 1024 + 12
    assert reader.bytes_read <= len(data) + 12


def test_stream_failures_propagate_unchanged() -> None:
    data = _large("jpeg")

    class FlakyReader(_CountingReader):
        def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
            raise TimeoutError("the storage service did not answer")

    with pytest.raises(TimeoutError, match="did not answer"):
        probe_image(FlakyReader(data), len(data))


def test_concurrent_probes_agree() -> None:
    cases = [(build(), expected) for build, expected in FACT_CASES.values()] * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda case: probe_image_bytes(case[0]), cases))
    assert results == [expected for _, expected in cases]
