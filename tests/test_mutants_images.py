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
import zlib

import pytest
from PIL import Image

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images import formats as image_formats
from recordforge.transforms.core.images.probe import (
    ImageFacts,
    _describe,
    _GuardedStream,
    decode_image_bytes,
    open_image,
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
        # Cut in its IHDR's CRC: the probe's walk of the chunks before the image data finds it.
        (PNG[:30], "the PNG file is truncated: its IHDR chunk at byte 8 runs past the file's end"),
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


# --- TensorFlow's BMP rules, from headers built by hand (image_formats.check_bmp_layout) -------


def bmp_head(width: int, height: int, bits: int = 24, offset: int = 54, core: int = 40) -> bytes:
    """A BMP's file header and the start of its info header (54 bytes): offset, width and height
    as signed 32-bit fields, bits per pixel as a 16-bit one, packed here as raw bytes."""
    head = struct.pack("<2sI4sI", b"BM", 0, bytes(4), offset & 0xFFFFFFFF)
    info = struct.pack(
        "<I4s4sH2s",
        core,
        (width & 0xFFFFFFFF).to_bytes(4, "little"),
        (height & 0xFFFFFFFF).to_bytes(4, "little"),
        1,
        (bits & 0xFFFF).to_bytes(2, "little"),
    )
    return (head + info).ljust(54, b"\0")


def bmp_size(width: int, height: int, bits: int = 24, offset: int = 54) -> int:
    """The size TensorFlow requires: the offset plus rows of 4-byte-padded pixel bytes."""
    row = width * (bits // 8)
    return offset + (row + (-row) % 4) * abs(height)


def bmp_refusal(head: bytes, size: int) -> tuple[str, str] | None:
    try:
        image_formats.check_bmp_layout(head, size)
    except InputError as error:
        return error.kind, error.message
    return None


IMPOSSIBLE = ("CorruptImage", "the BMP file is corrupt: its header is impossible")


def test_an_os2_bmp_is_known_from_its_first_18_bytes():
    head = struct.pack("<2sI4sII", b"BM", 0, bytes(4), 26, 12)
    assert len(head) == 18
    assert bmp_refusal(head, 1000) == (
        "UnsupportedImageFormat",
        "OS/2 BMP files (a 12-byte header) are not supported (TensorFlow decodes Windows BMPs "
        "only); convert them to PNG",
    )
    # 17 bytes: too short to tell; a header cut there is truncated, as any under 32 bytes.
    truncated = ("TruncatedImage", "the BMP file is truncated: it ends in its header")
    assert bmp_refusal(head[:17], 1000) == truncated
    assert bmp_refusal(bmp_head(4, 4)[:31], bmp_size(4, 4)) == truncated
    # 32 bytes hold every field read (the writer's integrity check passes exactly 32).
    assert bmp_refusal(bmp_head(4, 4)[:32], bmp_size(4, 4)) is None


@pytest.mark.parametrize(
    ("bits", "words"), [(16, "16"), (1, "1"), (0xFFF8, "-8")], ids=["16", "1", "signed"]
)
def test_bmp_depths_tensorflow_cannot_decode(bits, words):
    assert bmp_refusal(bmp_head(4, 4, bits), 1000) == (
        "UnsupportedImageFormat",
        f"BMP files of {words} bits per pixel are not supported (TensorFlow decodes 8, 24 and "
        "32, and --encode/--resize read a BMP as it does); convert them to PNG files first",
    )


@pytest.mark.parametrize(
    ("width", "height", "offset", "refused"),
    [
        (0, 4, 54, True),
        (-4, 4, 54, True),  # a signed field: not 2^32 - 4
        (4, 0, 54, True),
        (4, 4, -1, True),  # a signed field: not 2^32 - 1
        (1, 4, 54, False),
        (4, 1, 54, False),
        (4, -4, 54, False),  # rows stored top-down
        (4, 4, 0, False),
    ],
)
def test_a_bmp_header_that_is_impossible(width, height, offset, refused):
    head = bmp_head(width, height, offset=offset)
    found = bmp_refusal(head, bmp_size(width, height, offset=offset))
    assert found == (IMPOSSIBLE if refused else None)


def test_a_bmp_too_large_for_tensorflow_to_decode():
    too_large = ("CorruptImage", "the BMP file is corrupt: it is too large to decode")
    limit = (2**31 - 1) // 8  # TensorFlow's bound on width * height
    assert 16383 * 16385 == limit
    assert bmp_refusal(bmp_head(16383, 16385), bmp_size(16383, 16385)) == too_large
    assert bmp_refusal(bmp_head(16383, -16385), bmp_size(16383, 16385)) == too_large
    assert bmp_refusal(bmp_head(2, (limit - 1) // 2), bmp_size(2, (limit - 1) // 2)) is None


def test_a_bmp_of_another_size_than_its_header_makes_it():
    size = bmp_size(5, 3)  # rows of 15 bytes padded to 16
    assert size == 54 + 16 * 3
    assert bmp_refusal(bmp_head(5, 3), size) is None
    assert bmp_refusal(bmp_head(5, 3), size - 1) == (
        "TruncatedImage",
        f"the BMP file is truncated: its header makes it {size:,} bytes, the file has "
        f"{size - 1:,} (TensorFlow decodes it only when they are equal)",
    )
    assert bmp_refusal(bmp_head(5, 3), size + 1) == (
        "CorruptImage",
        f"the BMP file is longer than its pixels: its header makes it {size:,} bytes, the file "
        f"has {size + 1:,} (TensorFlow decodes it only when they are equal)",
    )


# --- PNG chunks, GIF screens and WebP canvases -------------------------------------------------


def test_a_png_chunk_length_is_unsigned():
    """A length of 2^32 - 4 runs past the end; read as -4 it would step back onto an IEND."""
    data = (
        b"\x89PNG\r\n\x1a\n"
        + b"\xff\xff\xff\xfcabcd"
        + b"\x00\x00\x00\x00IEND"
        + struct.pack(">I", zlib.crc32(b"IEND"))
    )
    with pytest.raises(EOFError, match="the file ends before the PNG IEND chunk"):
        image_formats.check_png_chunks(data)


def test_a_gif_screen_wider_than_int16_is_a_bomb_when_its_blocks_are_checked():
    screen = struct.pack("<6sHHBBB", b"GIF89a", 40000, 3000, 0, 0, 0)
    frame = b"\x2c" + struct.pack("<4HB", 0, 0, 2, 2, 0) + b"\x02\x02\x44\x01\x00"
    data = screen + frame + b"\x3b"
    image_formats.check_gif_blocks(data, 40000 * 3000)
    with pytest.raises(InputError) as raised:
        image_formats.check_gif_blocks(data, 40000 * 3000 - 1)
    assert raised.value.kind == "DecompressionBomb"
    assert "40000x3000 = 120,000,000 pixels" in raised.value.message


def test_a_webp_canvas_that_differs_from_its_bitstream_is_corrupt_in_words():
    data = bytearray(encode(rgb(), "WEBP", **ICC))
    assert data[12:16] == b"VP8X"
    data[24:27] = WIDTH.to_bytes(3, "little")  # the canvas one pixel wider (stored minus 1)
    with pytest.raises(InputError) as raised:
        probe_image_bytes(bytes(data))
    assert (raised.value.kind, raised.value.message) == (
        "CorruptImage",
        f"the WEBP file is corrupt: VP8X canvas ({WIDTH + 1}, {HEIGHT}) differs from the "
        "bitstream's size",
    )


# --- a WebP's metadata chunks (image_formats.webp_metadata) and open_image ---------------------


def exif_turned(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def webp_metadata_of(data: bytes) -> dict[str, bytes]:
    return image_formats.webp_metadata(image_formats.Source(io.BytesIO(data), len(data), data))


def riff(chunks: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WEBP" + chunks


def chunk(fourcc: bytes, data: bytes) -> bytes:
    return fourcc + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)


XMP = b"<x:xmpmeta>odd</x:xmpmeta>"


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"lossless": True},
        {"exif": exif_turned(6) + b"\0"},  # an odd length: the chunk is padded
        {"exif": exif_turned(3), "xmp": XMP + b"!", "icc_profile": b"\0" * 101},
    ],
    ids=["simple", "lossless", "exif", "exif_xmp_icc"],
)
def test_webp_metadata_is_what_pillow_reads(params):
    data = encode(rgb(), "WEBP", **params)
    info = Image.open(io.BytesIO(data)).info
    expected = {key: info[key] for key in ("exif", "xmp") if key in info}
    assert ("exif" in expected) == ("exif" in params)
    assert ("xmp" in expected) == ("xmp" in params)
    assert webp_metadata_of(data) == expected


def test_the_walk_of_webp_chunks():
    """Chunks after the bitstream, built by hand: padded odd lengths, the first EXIF of two, a
    chunk that ends exactly at the file's end, and one cut short (the walk stops there)."""
    base = encode(rgb(), "WEBP", **ICC)
    assert base[12:16] == b"VP8X"
    body = base[12:]
    first, second = b"II*\0first!", b"II*\0second"  # 10 and 11 bytes
    data = riff(body + chunk(b"abcd", b"odd") + chunk(b"EXIF", first) + chunk(b"EXIF", second))
    assert webp_metadata_of(data) == {"exif": first}
    data = riff(body + chunk(b"XMP ", XMP) + b"EXIF" + struct.pack("<I", 0))
    assert webp_metadata_of(data) == {"xmp": XMP, "exif": b""}  # a header exactly at the end
    cut = riff(body + chunk(b"XMP ", b"x" * 10) + chunk(b"EXIF", first))
    assert webp_metadata_of(cut) == {"xmp": b"x" * 10, "exif": first}
    assert webp_metadata_of(cut[:-1]) == {"xmp": b"x" * 10}
    assert webp_metadata_of(cut[: -len(first) - 4]) == {"xmp": b"x" * 10}  # within its header
    simple = encode(rgb(), "WEBP")
    assert simple[12:16] == b"VP8 "
    assert webp_metadata_of(simple + chunk(b"EXIF", first)) == {}  # only VP8X files have them


@pytest.mark.parametrize(("fmt", "plugin"), [("JPEG", "JPEG"), ("PNG", "PNG"), ("WEBP", "WEBP")])
def test_open_image_reads_the_orientation_and_opens_for_decoding(fmt, plugin):
    data = encode(rgb(), fmt, exif=exif_turned(6))
    facts, image = open_image(data)
    assert facts == ImageFacts(fmt.lower(), WIDTH, HEIGHT, 3, 6)
    assert image.format == plugin and image.size == (WIDTH, HEIGHT)
    assert image.tobytes() == Image.open(io.BytesIO(data)).convert(image.mode).tobytes()


def test_open_image_applies_max_pixels():
    data = encode(rgb(), "PNG")
    assert open_image(data, max_pixels=WIDTH * HEIGHT)[0].width == WIDTH
    with pytest.raises(InputError) as raised:
        open_image(data, max_pixels=WIDTH * HEIGHT - 1)
    assert raised.value.kind == "DecompressionBomb"


def test_a_webp_the_probe_accepts_and_pillow_cannot_open_is_corrupt():
    """Its EXIF chunk runs past the file's end: metadata never makes an image unusable to the
    probe, but libwebp's demuxer refuses the file."""
    data = bytearray(encode(rgb(), "WEBP", exif=exif_turned(6)))
    at = data.index(b"EXIF")
    data[at + 4 : at + 8] = struct.pack("<I", 10**6)
    assert probe_image_bytes(bytes(data), orientation=True).orientation == 1
    with pytest.raises(InputError) as raised:
        open_image(bytes(data))
    assert (raised.value.kind, raised.value.message) == (
        "CorruptImage",
        "the WEBP file is corrupt: could not create decoder object",
    )
    assert isinstance(raised.value.__cause__, OSError)


# --- GIF frames a full decode reaches ----------------------------------------------------------


def test_every_frame_of_a_gif_is_decoded():
    """TensorFlow decodes every frame: damage in the second frame's pixel data (its blocks
    intact) is found by the full decode, not by the probe, whose look at the end is clean."""
    second = descriptor_offsets(ANIMATED)[1]
    flags = ANIMATED[second + 9]
    code_size = second + 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    data = bytearray(ANIMATED)
    length = data[code_size + 1]
    data[code_size + 2 : code_size + 2 + length] = b"\xff" * length
    assert probe_image_bytes(bytes(data)) == ImageFacts("gif", WIDTH, HEIGHT, 3)
    with pytest.raises(InputError) as raised:
        decode_image_bytes(bytes(data))
    assert (raised.value.kind, raised.value.message) == (
        "CorruptImage",
        "the GIF file is corrupt: broken data stream when reading image file",
    )


def test_a_later_gif_frame_far_off_its_screen_is_a_bomb_before_decoding():
    """Pillow's decode spans every frame's right and bottom edge: the limit applies to them."""
    second = descriptor_offsets(ANIMATED)[1]
    data = bytearray(ANIMATED)
    struct.pack_into("<H", data, second + 1, 40000)  # its left edge
    right = 40000 + WIDTH
    assert decode_image_bytes(bytes(data), max_pixels=right * HEIGHT) == ImageFacts(
        "gif", WIDTH, HEIGHT, 3
    )
    with pytest.raises(InputError) as raised:
        decode_image_bytes(bytes(data), max_pixels=right * HEIGHT - 1)
    assert raised.value.kind == "DecompressionBomb"
    assert f"{right}x{HEIGHT} = {right * HEIGHT:,} pixels" in raised.value.message


# --- BMP channels, WebP headers, the guarded stream --------------------------------------------


@pytest.mark.parametrize(
    ("bits", "channels"),
    [(8, 1), (24, 3), (32, 4), (1, 1), (4, 1), (16, 3), (0xFFF8, 3)],
    ids=["8", "24", "32", "1", "4", "16", "unsigned"],
)
def test_bmp_channels_from_the_header(bits, channels):
    """TensorFlow's bits / 8; for depths it cannot decode (refused elsewhere) the closest
    decodable cousin's: 1 below 8 bits, 3 above. The depth is an unsigned 16-bit field, at
    byte 28 of a Windows header and at byte 24 of an OS/2 one (a 12-byte header)."""
    windows = bmp_head(4, 4, bits)
    assert image_formats.channels("bmp", None, windows) == channels
    os2 = struct.pack("<2sI4sIIHHHH", b"BM", 0, bytes(4), 26, 12, 4, 4, 1, bits) + b"\x20" * 8
    assert len(os2) == 34 and os2[28:30] != windows[28:30]
    assert image_formats.channels("bmp", None, os2) == channels


def test_the_guarded_stream_passes_seeks_on_as_asked():
    stream = _GuardedStream(io.BytesIO(b"0123456789"))
    assert stream.seek(-3, io.SEEK_END) == 7 and stream.read(1) == b"7"
    assert stream.seek(-4, io.SEEK_CUR) == 4 and stream.tell() == 4
    assert stream.seek(2) == 2 and stream.read() == b"23456789"


@pytest.mark.parametrize(
    ("fourcc", "header_bytes", "channels"),
    [(b"VP8L", 5, 4), (b"VP8 ", 10, 3)],
)
def test_a_bitstream_header_is_its_first_bytes(fourcc, header_bytes, channels):
    """As libwebp: a lossless bitstream's size and alpha are in its first 5 bytes
    (WebPGetFeatures), a lossy one's key frame header is 10 bytes (VP8GetInfo), so a file that
    ends right after them still has them."""
    if fourcc == b"VP8L":
        data = encode(rgba(), "WEBP", lossless=True)
    else:
        data = encode(rgb(), "WEBP")
    assert data[12:16] == fourcc
    cut = data[: 20 + header_bytes]
    assert image_formats.webp_facts(image_formats.Source(io.BytesIO(cut), len(cut), cut)) == (
        WIDTH,
        HEIGHT,
        channels,
    )


def test_a_riff_chunk_length_is_unsigned():
    """2^32 - 24 runs past the file's end, so the walk stops; read as -24 it would step back
    into the chunk before, where these bytes make a chunk header that ends the walk too."""
    body = encode(rgb(), "WEBP", **ICC)[12:]
    trap = b"wxyz" + struct.pack("<I", 0x7FFFFFF0)  # 16 bytes back from the EXIF header
    data = riff(body + chunk(b"abcd", bytes(8) + trap) + b"EXIF" + struct.pack("<I", 2**32 - 24))
    assert webp_metadata_of(data) == {}


def three_frame_gif() -> bytes:
    frames = [
        rgb().rotate(angle).convert("P", palette=Image.Palette.ADAPTIVE) for angle in (0, 90, 180)
    ]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)


def test_the_third_frame_of_a_gif_is_decoded_too():
    data = three_frame_gif()
    third = [i for i, (kind, _, _) in enumerate(gif_blocks(data)) if kind == "image"][2]
    start = gif_blocks(data)[third - 1][1] + 1
    flags = data[start + 9]
    code_size = start + 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    damaged = bytearray(data)
    length = damaged[code_size + 1]
    damaged[code_size + 2 : code_size + 2 + length] = b"\xff" * length
    assert decode_image_bytes(data) == ImageFacts("gif", WIDTH, HEIGHT, 3)
    with pytest.raises(InputError) as raised:
        decode_image_bytes(bytes(damaged))
    assert raised.value.kind == "CorruptImage"


# --- the GIF block walk (image_formats.gif_frames), on blocks built by hand ---------------------


def gif(*blocks: bytes, screen: tuple[int, int] = (8, 8), colours: bool = False) -> bytes:
    """A GIF89a without a global colour table (with one of 2 colours when `colours`: a frame
    needs one, its own or the global one, for TensorFlow), then `blocks` as given."""
    table = b"\x80" + bytes(2) + bytes(6) if colours else bytes(3)
    return struct.pack("<6sHH", b"GIF89a", *screen) + table + b"".join(blocks)


# Pixel data: 4 pixels of index 0 as Pillow writes them (LZW code size 8), and a shorter stream
# that the block walk accepts but that decodes to less than 4 pixels.
PIXELS_2X2 = b"\x08\x06\x00\x01\x08\x04\x10\x10\x00"
SHORT_PIXELS = b"\x02\x02\x44\x01\x00"


def image_block(left=0, top=0, width=2, height=2, flags=0, table=b"", pixels=SHORT_PIXELS):
    return b"\x2c" + struct.pack("<4HB", left, top, width, height, flags) + table + pixels


def test_gif_blocks_before_the_first_image_in_words():
    with pytest.raises(SyntaxError, match=r"^unexpected GIF block 0x99 at byte 13$"):
        list(image_formats.gif_frames(gif(b"\x99", image_block())))
    with pytest.raises(SyntaxError, match=r"^unexpected GIF block 0x3c at byte 13$"):
        list(image_formats.gif_frames(gif(b"\x3c", image_block())))
    with pytest.raises(SyntaxError, match=r"^its first image is 0x5 pixels$"):
        list(image_formats.gif_frames(gif(image_block(width=0, height=5))))
    with pytest.raises(SyntaxError, match=r"^its first image is 5x0 pixels$"):
        list(image_formats.gif_frames(gif(image_block(width=5, height=0))))
    # After a complete image, unknown bytes or an empty image end the walk (giflib stops there).
    assert list(image_formats.gif_frames(gif(image_block(), b"\x99\x99"))) == [(0, 0, 2, 2)]
    assert list(image_formats.gif_frames(gif(image_block(), image_block(width=0)))) == [
        (0, 0, 2, 2)
    ]
    with pytest.raises(SyntaxError, match=r"^the GIF file holds no image$"):
        image_formats.gif_decoded_size(gif(b"\x3b"))


def test_a_gif_colour_table_is_there_only_with_its_flag():
    """Flags 0x01: a table size of 12 bytes, but no table flag (0x80): no table follows."""
    frames = [(0, 0, 2, 2), (1, 1, 3, 3)]
    data = gif(image_block(flags=0x01), image_block(1, 1, 3, 3), b"\x3b")
    assert list(image_formats.gif_frames(data)) == frames
    data = gif(image_block(flags=0x81, table=bytes(12)), image_block(1, 1, 3, 3), b"\x3b")
    assert list(image_formats.gif_frames(data)) == frames


@pytest.mark.parametrize("blocks", [b"\x3b", b"\x99\x3b"], ids=["trailer", "unknown_block"])
@pytest.mark.parametrize("screen", [(0, 100), (100, 0)])
def test_a_gif_screen_without_area_and_without_images_is_corrupt_not_a_bomb(screen, blocks):
    with pytest.raises(InputError) as raised:
        probe_image_bytes(gif(blocks, screen=screen), max_pixels=50)
    assert raised.value.kind == "CorruptImage"


# --- Source: reads within the size the caller reported, the head extended in place -------------


def test_a_header_is_read_within_the_size_the_caller_reported():
    data = encode(rgba(), "WEBP", lossless=True)

    def facts(stream: bytes, size: int):
        return image_formats.webp_facts(image_formats.Source(io.BytesIO(stream), size, data[:16]))

    assert facts(data, 25) == (WIDTH, HEIGHT, 4)  # the VP8L header ends at byte 25
    # A stream longer than the size (a file that grew since it was listed): cut at the size.
    with pytest.raises(EOFError, match=r"^the file ends inside its header \(at byte 24\)$"):
        facts(data, 24)
    # A stream shorter than the size (a file that shrank): cut where it ends.
    with pytest.raises(EOFError, match=r"^the file ends inside its header \(at byte 1,000\)$"):
        facts(data[:22], 1000)


def test_the_head_is_extended_with_the_bytes_after_it_wherever_the_stream_is():
    data = bytes(range(100))
    source = image_formats.Source(io.BytesIO(data), len(data), data[:4])
    assert source.read_at(50, 2) == data[50:52]  # the stream is now at byte 52
    assert source.extend_head(8) is True and source.head == data[:8]
    assert source.extend_head(8) is False and source.head == data[:8]  # nothing more wanted
    assert source.extend_head(12) is True and source.head == data[:12]  # straight on
    assert source.extend_head(1000) is True and source.head == data and source.complete
    assert source.extend_head(2000) is False


def test_a_gif_one_byte_longer_than_the_first_read_is_read_whole():
    """The GIF is read whole (its last byte too) before its blocks are walked: here that byte
    ends its last frame's data (there is no trailer)."""
    body = ANIMATED[:-1]  # without its trailer: accepted, as TensorFlow accepts it
    table = 3 << ((ANIMATED[10] & 7) + 1)
    missing = 16 * 1024 + 1 - len(body) - 3  # a comment extension's introducer, label, end
    sub_blocks = b"".join(
        bytes([len(part)]) + part
        for part in (b"c" * 255,) * (missing // 256) + (b"c" * (missing % 256 - 1),)
    )
    data = body[: 13 + table] + b"\x21\xfe" + sub_blocks + b"\x00" + body[13 + table :]
    assert len(data) == 16 * 1024 + 1 and data[-1] == 0
    expected = ImageFacts("gif", WIDTH, HEIGHT, 3)
    assert probe_image_bytes(data) == expected
    assert probe_image(io.BytesIO(data), len(data)) == expected


def test_a_header_past_the_first_read_is_read_on_to_64_kib_no_more():
    noise = Image.frombytes("RGB", (300, 300), random.Random(2).randbytes(300 * 300 * 3))
    data = encode(noise, "JPEG", quality=95, icc_profile=random.Random(1).randbytes(20_000))
    assert 16 * 1024 < data.index(b"\xff\xc0") < 64 * 1024 and len(data) > 100 * 1024

    class Counting(io.BytesIO):
        bytes_read = 0

        def read(self, n=-1):
            chunk = super().read(n)
            self.bytes_read += len(chunk)
            return chunk

    stream = Counting(data)
    assert probe_image(stream, len(data)) == ImageFacts("jpeg", 300, 300, 3)
    assert stream.bytes_read <= 64 * 1024 + 12  # the head, then the tail's 12 bytes


def test_a_foreign_plugin_that_fails_on_a_file_is_not_the_last_one_asked(monkeypatch):
    """Pillow's plugins are asked in turn: one whose sniffer accepts the bytes but whose parser
    fails just means "not this format", and the next ones are still asked."""
    data = encode(rgb(), "TIFF")
    Image.init()

    def failing(fp, filename):
        raise RuntimeError("not mine after all")

    monkeypatch.setitem(Image.OPEN, "FAILING", (failing, lambda prefix: True))
    monkeypatch.setattr(Image, "ID", ["FAILING", *Image.ID])
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, raised.value.message) == (
        "UnsupportedImageFormat",
        "TIFF images are not supported (supported: bmp, gif, jpeg, png, webp)",
    )


def test_a_failing_read_reaches_the_caller_as_it_is():
    class FailingRead(io.BytesIO):
        def read(self, n=-1):
            raise ConnectionResetError("the connection was reset")

    with pytest.raises(ConnectionResetError, match="the connection was reset"):
        probe_image(FailingRead(encode(rgb(), "PNG")), 100)


def test_reads_and_seeks_of_a_source():
    class Counting(io.BytesIO):
        seeks = 0

        def seek(self, offset, whence=io.SEEK_SET):
            self.seeks += 1
            return super().seek(offset, whence)

    data = bytes(range(100))
    stream = Counting(data + b"appended since the size was taken")
    source = image_formats.Source(stream, len(data), data[:16])
    assert source.read_at(4, 12) == data[4:16] and stream.seeks == 0  # the head has them
    assert source.read_at(10, 8) == data[10:18] and stream.seeks == 1
    assert source.tail(3) == data[-3:]  # the last bytes within the reported size
    short = image_formats.Source(io.BytesIO(b"abc"), 3, b"a")
    assert short.tail(12) == b"abc"


def test_read_up_to_reads_on_until_it_has_them_or_the_stream_ends():
    class Trickle(io.BytesIO):
        def read(self, n=-1):
            return super().read(min(n, 1) if n >= 0 else 1)

    data = b"0123456789"
    assert image_formats.read_up_to(Trickle(data), 10) == data
    assert image_formats.read_up_to(Trickle(data), 1) == b"0"
    assert image_formats.read_up_to(Trickle(data), 0) == b""
    assert image_formats.read_up_to(Trickle(data), 50) == data


def test_a_gif_has_3_channels_whatever_its_bytes():
    """TensorFlow decodes every GIF to RGB: its bytes are not read for a depth (this one is too
    short to hold a BMP header's)."""
    data = gif(image_block(), b"\x3b", colours=True)
    assert probe_image_bytes(data) == ImageFacts("gif", 2, 2, 3)


@pytest.mark.parametrize("declared", [1000, 2**31])
def test_a_bmp_cut_after_its_size_field_is_truncated_in_words(declared):
    data = b"BM" + struct.pack("<I", declared)
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, raised.value.message) == (
        "TruncatedImage",
        f"the BMP file is truncated: its header declares {declared:,} bytes but the file has 6",
    )


def test_a_webp_declaring_2_gib_is_truncated_in_words():
    data = b"RIFF" + struct.pack("<I", 2**31) + b"WEBPVP8 "
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, raised.value.message) == (
        "TruncatedImage",
        f"the WEBP file is truncated: its header declares {2**31 + 8:,} bytes but the file has 16",
    )


def test_a_one_byte_file_is_not_empty():
    with pytest.raises(InputError) as raised:
        probe_image(io.BytesIO(b"x"), 1)
    assert raised.value.kind == "NotAnImage"


def test_the_orientation_is_read_only_when_asked():
    data = encode(rgb(), "JPEG", exif=exif_turned(6))
    assert probe_image_bytes(data).orientation == 1
    assert probe_image(io.BytesIO(data), len(data)).orientation == 1
    assert probe_image_bytes(data, orientation=True).orientation == 6
    assert probe_image(io.BytesIO(data), len(data), orientation=True).orientation == 6


def test_a_gif_frame_pillow_refuses_to_size_is_a_bomb_in_words():
    """Past Pillow's own limit (twice Image.MAX_IMAGE_PIXELS), which a caller's max_pixels may
    exceed: Pillow refuses to grow the image to a later frame's extent, before decoding it."""
    data = gif(
        image_block(pixels=PIXELS_2X2),
        image_block(0, 0, 15000, 15000, pixels=PIXELS_2X2),
        b"\x3b",
        screen=(2, 2),
        colours=True,
    )
    assert 15000 * 15000 > 2 * Image.MAX_IMAGE_PIXELS
    assert probe_image_bytes(data, max_pixels=300_000_000) == ImageFacts("gif", 15000, 15000, 3)
    with pytest.raises(InputError) as raised:
        decode_image_bytes(data, max_pixels=300_000_000)
    assert raised.value.kind == "DecompressionBomb"
    assert raised.value.message.startswith(
        "the GIF file has a frame too large to decode: Image size (225000000 pixels) exceeds limit"
    )


def test_a_full_decode_does_not_read_the_orientation():
    data = encode(rgb(), "JPEG", exif=exif_turned(6))
    assert decode_image_bytes(data) == ImageFacts("jpeg", WIDTH, HEIGHT, 3, 1)


@pytest.mark.parametrize("length", [9, 11, 12])
def test_a_vp8x_chunk_of_another_length_is_corrupt_as_libwebp_and_tensorflow_say(length):
    """The WebP container's VP8X chunk holds 10 bytes; libwebp refuses a file whose VP8X chunk
    is longer or shorter (the chunks after it walked past correctly), so the probe refuses it."""
    import tensorflow as tf

    base = encode(rgb(), "WEBP", **ICC)
    assert base[12:16] == b"VP8X" and struct.unpack_from("<I", base, 16)[0] == 10
    vp8x = (base[20:30] + b"\0" * 2)[:length]
    data = riff(chunk(b"VP8X", vp8x) + base[30:])
    with pytest.raises(InputError) as raised:
        probe_image_bytes(data)
    assert (raised.value.kind, raised.value.message) == (
        "CorruptImage",
        f"the WEBP file is corrupt: its VP8X chunk is {length} bytes long, not 10",
    )
    with pytest.raises(OSError):
        Image.open(io.BytesIO(data)).load()
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(data)
