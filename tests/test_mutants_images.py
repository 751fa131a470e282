"""The image probe (core/images/probe.py, formats.py) on files the other tests lack.

Written for mutation testing (docs/testing.md): WebP files whose VP8X alpha flag and bitstream
disagree (TensorFlow is the oracle for their channels), OS/2 BMPs, corrupt WebP bitstream
headers, and the exact words of truncation reports.
"""

from __future__ import annotations

import io
import os
import random
import struct

import pytest
from PIL import Image

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.probe import (
    ImageFacts,
    _describe,
    decode_image_bytes,
    probe_image,
    probe_image_bytes,
)

WIDTH, HEIGHT = 37, 23


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def rgb() -> Image.Image:
    rng = random.Random(0)
    return Image.frombytes("RGB", (WIDTH, HEIGHT), rng.randbytes(WIDTH * HEIGHT * 3))


def rgba() -> Image.Image:
    image = rgb().convert("RGBA")
    image.putalpha(Image.linear_gradient("L").resize((WIDTH, HEIGHT)))
    return image


def vp8x_alpha_flag(data: bytes, on: bool) -> bytes:
    """The WebP with its VP8X alpha flag set or cleared, the bitstream left as it is."""
    assert data[12:16] == b"VP8X"
    out = bytearray(data)
    out[20] = out[20] | 0x10 if on else out[20] & ~0x10
    return bytes(out)


ICC = {"icc_profile": b"\x00" * 100}  # metadata makes Pillow write the extended (VP8X) format
# name -> (file, channels). libwebp reports a lossless bitstream's own alpha bit whatever the
# VP8X flag says; for a lossy one, the flag or an ALPH chunk.
WEBP_ALPHA_CASES = {
    "vp8x_lossless_opaque": (lambda: encode(rgb(), "WEBP", lossless=True, **ICC), 3),
    "vp8x_lossless_alpha": (lambda: encode(rgba(), "WEBP", lossless=True, **ICC), 4),
    "vp8x_lossless_opaque_flagged": (
        lambda: vp8x_alpha_flag(encode(rgb(), "WEBP", lossless=True, **ICC), True),
        3,
    ),
    "vp8x_lossless_alpha_unflagged": (
        lambda: vp8x_alpha_flag(encode(rgba(), "WEBP", lossless=True, **ICC), False),
        4,
    ),
    "vp8x_lossy_alph_chunk_unflagged": (lambda: vp8x_alpha_flag(encode(rgba(), "WEBP"), False), 4),
    "vp8x_lossy_flagged_without_alph": (
        lambda: vp8x_alpha_flag(encode(rgb(), "WEBP", **ICC), True),
        4,
    ),
}


@pytest.mark.parametrize("name", sorted(WEBP_ALPHA_CASES))
def test_webp_alpha_as_libwebp_reports_it(name):
    build, channels = WEBP_ALPHA_CASES[name]
    assert probe_image_bytes(build()) == ImageFacts("webp", WIDTH, HEIGHT, channels)


@pytest.mark.parametrize("name", sorted(WEBP_ALPHA_CASES))
def test_webp_alpha_matches_tensorflow(name):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    build, channels = WEBP_ALPHA_CASES[name]
    decoded = tf.io.decode_image(build(), expand_animations=False)
    assert tuple(decoded.shape) == (HEIGHT, WIDTH, channels)


def os2_bmp(bits: int, palette_entries: int = 0) -> bytes:
    """An OS/2 1.x BMP: a 12-byte BITMAPCOREHEADER (16-bit sizes), 3-byte palette entries."""
    pixels = bytes(((WIDTH * bits + 31) // 32) * 4 * HEIGHT)
    palette = bytes(3 * palette_entries)
    offset = 14 + 12 + len(palette)
    core = struct.pack("<IHHHH", 12, WIDTH, HEIGHT, 1, bits)
    return (
        struct.pack("<2sIHHI", b"BM", offset + len(pixels), 0, 0, offset) + core + palette + pixels
    )


@pytest.mark.parametrize(("bits", "palette"), [(24, 0), (8, 256), (1, 2)])
def test_os2_bmps_are_refused_by_name_as_tensorflow_refuses_them(bits, palette):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    data = os2_bmp(bits, palette)
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert raised.value.kind == "UnsupportedImageFormat"
    assert "OS/2 BMP files (a 12-byte header) are not supported" in str(raised.value)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(data, expand_animations=False)


def corrupt(data: bytes, at: int, value: int | None = None, *, xor: int = 0) -> bytes:
    out = bytearray(data)
    out[at] = value if value is not None else out[at] ^ xor
    return bytes(out)


LOSSLESS = encode(rgb(), "WEBP", lossless=True)  # RIFF, WEBP, VP8L chunk: bitstream at 20
LOSSY = encode(rgb(), "WEBP")  # RIFF, WEBP, "VP8 " chunk: frame tag at 20, sizes at 26 and 28


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (corrupt(LOSSLESS, 20, 0x2E), "bad VP8L signature or version"),
        (corrupt(LOSSLESS, 24, xor=0x20), "bad VP8L signature or version"),  # version 1
        (corrupt(LOSSY, 20, xor=0x01), "bad VP8 key frame header"),  # not a key frame
        (LOSSY[:26] + struct.pack("<H", 0) + LOSSY[28:], "bad VP8 key frame header"),
        (LOSSY[:28] + struct.pack("<H", 0) + LOSSY[30:], "bad VP8 key frame header"),
    ],
)
def test_corrupt_webp_bitstream_headers(data, message):
    assert LOSSLESS[12:16] == b"VP8L" and LOSSY[12:16] == b"VP8 "
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, str(raised.value)) == (
        "CorruptImage",
        f"the WEBP file is corrupt: {message}",
    )


PNG = encode(rgb(), "PNG")
GIF = encode(rgb().convert("P"), "GIF")
JPEG = encode(rgb(), "JPEG", quality=95)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (PNG[:-12], "the PNG file is truncated: the file ends before the PNG IEND chunk"),
        (PNG[:-4], "the PNG file is truncated: the file ends before the PNG IEND chunk"),
        # Pillow's SyntaxError says "broken", but comes from running out of data.
        (PNG[:30], "the PNG file is truncated: broken PNG file (incomplete checksum in <bytes>)"),
        (GIF[:-2], "the GIF file is truncated: the file ends inside a GIF data block"),
        (GIF[:-3], "the GIF file is truncated: the file ends inside a GIF data block"),
    ],
)
def test_truncation_is_reported_in_words(data, message):
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, str(raised.value)) == ("TruncatedImage", message)


def test_pillows_truncation_words_are_replaced():
    with pytest.raises(InputError) as raised:
        probe_image_bytes(JPEG[: len(JPEG) // 2])
    assert raised.value.kind == "TruncatedImage"
    message = str(raised.value)
    assert message.startswith("the JPEG file is truncated: the image data ends early (")
    assert message.endswith(" bytes not processed)")


def test_decoding_finds_damage_that_a_clean_end_hides():
    """Corrupt pixel data in a PNG that ends with its IEND chunk: the probe trusts the end,
    a decode (what verify --deep runs) does not."""
    damaged = corrupt(PNG, PNG.index(b"IDAT") + 10, xor=0xFF)
    assert probe_image_bytes(damaged) == ImageFacts("png", WIDTH, HEIGHT, 3)
    with pytest.raises(InputError) as raised:
        decode_image_bytes(damaged)
    assert raised.value.kind == "CorruptImage"
    assert str(raised.value).startswith("the PNG file is corrupt: ")


class FailingTell(io.BytesIO):
    def tell(self) -> int:
        raise OSError("tell failed")


def test_a_failing_tell_reaches_the_caller_as_it_is():
    """A GIF larger than the first read makes the probe read on (after a tell)."""
    big = encode(Image.frombytes("L", (300, 300), random.Random(1).randbytes(90_000)), "GIF")
    assert len(big) > 16 * 1024
    with pytest.raises(OSError, match="tell failed"):
        probe_image(FailingTell(big), len(big))


@pytest.mark.parametrize(
    ("error", "described"),
    [
        (ValueError("first line\nsecond line"), "first line"),
        (ValueError("  "), "ValueError"),
        (EOFError(), "EOFError"),
        (ValueError("x" * 160), "x" * 160),
        (ValueError("x" * 161), "x" * 157 + "..."),
    ],
)
def test_pillow_errors_are_described_in_one_short_line(error, described):
    assert _describe(error) == described


def animated_gif() -> bytes:
    """Two frames with the blocks GIF writers use: an application extension (loop), a comment,
    graphic control extensions, and a local colour table on the second frame."""
    first = rgb().convert("P", palette=Image.Palette.ADAPTIVE)
    second = rgb().rotate(90).convert("P", palette=Image.Palette.ADAPTIVE)
    return encode(
        first, "GIF", save_all=True, append_images=[second], comment=b"hello", duration=100, loop=0
    )


def gif_blocks(data: bytes) -> list[tuple[str, int, int]]:
    """(kind, offset of its last byte, flags) of each block after the header and the global
    colour table, walked here from the GIF spec."""
    table = 3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0
    offset, found = 13 + table, []
    while data[offset] != 0x3B:
        kind, flags = data[offset], 0
        if kind == 0x21:
            offset += 2
        else:
            flags = data[offset + 9]
            offset += 11 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
        while data[offset]:
            offset += 1 + data[offset]
        found.append(("image" if kind == 0x2C else "extension", offset, flags))
        offset += 1
    return found


ANIMATED = animated_gif()
IMAGES = [i for i, (kind, _, _) in enumerate(gif_blocks(ANIMATED)) if kind == "image"]


def descriptor_offsets(data: bytes) -> list[int]:
    """Where each image descriptor starts: the end of the block before it, plus one."""
    blocks = gif_blocks(data)
    return [blocks[i - 1][1] + 1 for i in IMAGES]


def test_the_test_gif_has_extensions_and_a_local_colour_table():
    blocks = gif_blocks(ANIMATED)
    assert blocks[0][0] == "extension" and len(IMAGES) == 2
    assert blocks[IMAGES[1]][2] & 0x80  # the second frame's own colour table


def test_a_gif_with_extensions_and_local_colour_tables_decodes():
    assert decode_image_bytes(ANIMATED) == ImageFacts("gif", WIDTH, HEIGHT, 3)


def test_a_colour_table_size_without_the_table_flag_means_no_table():
    """The size bits count only when the flag (0x80) is set; TensorFlow decodes it."""
    first = descriptor_offsets(ANIMATED)[0]
    assert ANIMATED[first + 9] == 0
    data = corrupt(ANIMATED, first + 9, 0x07)
    assert decode_image_bytes(data) == ImageFacts("gif", WIDTH, HEIGHT, 3)


@pytest.mark.parametrize(
    ("into", "message"),
    [
        (5, "the file ends inside a GIF image descriptor"),
        (9, "the file ends inside a GIF image descriptor"),
        (10, "the file ends inside a GIF data block"),  # the descriptor whole, nothing after
        (11, "the file ends inside a GIF data block"),
    ],
)
def test_a_gif_cut_in_its_second_frame(into, message):
    second = descriptor_offsets(ANIMATED)[1]
    with pytest.raises(InputError) as raised:
        probe_image_bytes(ANIMATED[: second + into])
    assert (raised.value.kind, str(raised.value)) == (
        "TruncatedImage",
        f"the GIF file is truncated: {message}",
    )


def test_unknown_bytes_after_a_complete_frame_end_the_gif():
    """As TensorFlow (giflib) reads it: appended data, not a damaged image."""
    assert decode_image_bytes(ANIMATED[:-1] + b"junk") == ImageFacts("gif", WIDTH, HEIGHT, 3)


def test_a_gif_without_any_frame_is_corrupt():
    table = 3 << ((ANIMATED[10] & 7) + 1)
    data = ANIMATED[: 13 + table] + b";"  # the header, the global colour table, the trailer
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, str(raised.value)) == (
        "CorruptImage",
        "the GIF file is corrupt: no more images in GIF file",
    )


@pytest.mark.parametrize("length", [13, None])
def test_a_gif_screen_wider_than_int16_is_a_bomb_from_its_header(length):
    """40000 x 3000 = 120 M pixels in the logical screen alone; the header is enough."""
    data = ANIMATED[:6] + struct.pack("<HH", 40_000, 3_000) + ANIMATED[10:]
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data[:length])
    assert raised.value.kind == "DecompressionBomb"
    assert "40000x3000 = 120,000,000 pixels" in str(raised.value)


def test_a_first_frame_beyond_the_first_64_kib_is_found_from_the_stream():
    data = encode(rgb().convert("P"), "GIF", comment=b"c" * 70_000)
    assert gif_blocks(data)[0][1] > 64 * 1024
    assert probe_image(io.BytesIO(data), len(data)) == ImageFacts("gif", WIDTH, HEIGHT, 3)
