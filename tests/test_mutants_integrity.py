"""The writer's structure checks (core/images/integrity.py) on files the other tests lack.

Written for mutation testing (docs/testing.md): files of no supported format, and every refusal
of the PNG, GIF and WebP walks, in words (kind and message), against files built by hand with
`struct` and `zlib` (chunk CRCs from zlib.crc32) or made by Pillow and then damaged; the size a
PNG's image data must inflate to, interlaced (the Adam7 passes laid out here pixel by pixel,
read back by Pillow) or of a colour type it does not know; a PNG stream inflated in pieces (over
1 MiB in one chunk, output held back at a chunk's end, many small chunks); a GIF pixel beyond
its colour table (TensorFlow refuses it) and a grey local table Pillow does not keep; a WebP
chunk's padding at the file's end; a VP8 first partition at its bound; and `check_pixels`'
`max_pixels`. The JPEG checks are tests/test_mutants_jpeg_checks.py's.
"""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from PIL import Image

from recordforge.pipelines.inspection.contact_sheet import make_thumbnail
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.formats import webp_with_pad_byte
from recordforge.transforms.core.images.integrity import check_pixels, check_structure
from recordforge.transforms.core.images.probe import decode_image_bytes, open_image
from recordforge.transforms.core.reports.summary import describe_image

MiB = 1 << 20


def verdict(check, data: bytes) -> tuple[str, str] | None:
    """(kind, message) of the InputError `check(data)` raises, or None when it passes."""
    try:
        check(data)
    except InputError as error:
        return error.kind, error.message
    return None


def refusal(data: bytes) -> tuple[str, str] | None:
    return verdict(check_structure, data)


def truncated(fmt: str, words: str) -> tuple[str, str]:
    return "TruncatedImage", f"the {fmt} file is truncated: {words}"


def corrupt(fmt: str, words: str) -> tuple[str, str]:
    return "CorruptImage", f"the {fmt} file is corrupt: {words}"


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def picture(width: int = 37, height: int = 23) -> Image.Image:
    rng = random.Random(0)
    return Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))


@pytest.mark.parametrize(
    "data",
    [
        b"GIF90a" + bytes(20),
        b"RIFF" + struct.pack("<I", 20) + b"WAVE" + bytes(16),  # RIFF, not WebP
        b"RIFX" + struct.pack("<I", 20) + b"WEBP" + bytes(16),
    ],
)
def test_a_file_of_no_supported_format(data):
    assert refusal(data) == (
        "CorruptImage",
        "the file is no longer an image of a supported format",
    )


# --- PNG -------------------------------------------------------------------------------------

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def ihdr(width: int, height: int, colour: int = 0, interlace: int = 0) -> bytes:
    """An IHDR chunk of 8 bits per sample."""
    return png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, interlace))


IEND = png_chunk(b"IEND", b"")


def png(head: bytes, *streams: bytes) -> bytes:
    """A PNG: its signature, `head` (IHDR and any other chunk), an IDAT chunk per piece of
    compressed data, IEND."""
    return SIGNATURE + head + b"".join(png_chunk(b"IDAT", piece) for piece in streams) + IEND


def grey_raw(width: int, height: int) -> bytes:
    """The image data of an 8-bit grey image: a filter byte 0 and `width` pixels per row."""
    rng = random.Random(width * 1000 + height)
    return b"".join(b"\x00" + rng.randbytes(width) for _ in range(height))


RAW = grey_raw(20, 10)  # 210 bytes
STREAM = zlib.compress(RAW)
GREY = png(ihdr(20, 10), STREAM)  # its IDAT chunk at byte 8 + 25 = 33


def test_the_hand_built_png_is_one_pillow_reads():
    with Image.open(io.BytesIO(GREY)) as image:
        assert (image.size, image.mode) == ((20, 10), "L")
        assert image.tobytes() == b"".join(RAW[r * 21 + 1 : r * 21 + 21] for r in range(10))
    assert refusal(GREY) is None


def named_chunk(kind: bytes) -> bytes:
    """A PNG whose chunk after IHDR (at byte 33) is of type `kind`, its CRC wrong."""
    return SIGNATURE + ihdr(20, 10) + png_chunk(kind, b"abc", crc=0) + IEND


def pieces_of(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


_END_OF_IDAT = len(GREY) - len(IEND)
_START_OF_IDAT = GREY.index(b"IDAT") - 4
_BAD_CRC = zlib.crc32(b"IDAT" + STREAM) ^ 1

PNG_REFUSALS = {
    "no IEND: it ends after a chunk": (
        GREY[:_END_OF_IDAT],
        truncated("PNG", f"it ends inside a chunk header (at byte {_END_OF_IDAT:,})"),
    ),
    "cut in a chunk header": (
        GREY[: _END_OF_IDAT + 11],
        truncated("PNG", f"it ends inside a chunk header (at byte {_END_OF_IDAT:,})"),
    ),
    "cut in a chunk header after 1,000 bytes": (
        SIGNATURE + ihdr(20, 10) + png_chunk(b"tEXt", bytes(1000)) + png_chunk(b"IDAT", STREAM),
        truncated("PNG", f"it ends inside a chunk header (at byte {1045 + 12 + len(STREAM):,})"),
    ),
    "cut in its IDAT chunk": (
        GREY[: _END_OF_IDAT - 5],
        truncated("PNG", f"its IDAT chunk at byte {_START_OF_IDAT:,} runs past the file's end"),
    ),
    "cut in its IHDR chunk, under 29 bytes": (
        GREY[:28],
        truncated("PNG", "its IHDR chunk at byte 8 runs past the file's end"),
    ),
    "cut in its IHDR chunk, 29 bytes": (
        GREY[:29],
        truncated("PNG", "its IHDR chunk at byte 8 runs past the file's end"),
    ),
    "a damaged chunk cut": (
        SIGNATURE + ihdr(20, 10) + b"\x00\x00\x01\x00ID\x01Tabcd",
        truncated("PNG", "its damaged chunk at byte 33 runs past the file's end"),
    ),
    "an IDAT chunk's CRC": (
        SIGNATURE + ihdr(20, 10) + png_chunk(b"IDAT", STREAM, _BAD_CRC) + IEND,
        corrupt("PNG", "the CRC of its IDAT chunk at byte 33 does not match its data"),
    ),
    "a CRC after 1,000 bytes": (
        SIGNATURE
        + ihdr(20, 10)
        + png_chunk(b"tEXt", bytes(1000))
        + png_chunk(b"IDAT", STREAM, _BAD_CRC)
        + IEND,
        corrupt("PNG", "the CRC of its IDAT chunk at byte 1,045 does not match its data"),
    ),
    "a digit in a chunk type": (
        named_chunk(b"ID4T"),
        corrupt("PNG", "the CRC of its damaged chunk at byte 33 does not match its data"),
    ),
    "a space in a chunk type": (
        named_chunk(b"ID T"),
        corrupt("PNG", "the CRC of its damaged chunk at byte 33 does not match its data"),
    ),
    "a byte beyond ASCII in a chunk type": (
        named_chunk(b"\xc9DAT"),
        corrupt("PNG", "the CRC of its damaged chunk at byte 33 does not match its data"),
    ),
    "a Latin-1 letter in a chunk type": (
        named_chunk("IDAé".encode("latin-1")),
        corrupt("PNG", "the CRC of its damaged chunk at byte 33 does not match its data"),
    ),
    "a lower-case chunk type": (
        named_chunk(b"idat"),
        corrupt("PNG", "the CRC of its idat chunk at byte 33 does not match its data"),
    ),
    "no IDAT": (
        SIGNATURE + ihdr(20, 10) + IEND,
        corrupt("PNG", "it has no image data (IDAT)"),
    ),
    "an empty IDAT": (
        png(ihdr(20, 10), b""),
        corrupt("PNG", "it has no image data (IDAT)"),
    ),
    "a stream cut short": (
        png(ihdr(20, 10), STREAM[:-6]),
        truncated("PNG", "its compressed image data ends before the end of its stream"),
    ),
    "a complete stream a row short": (
        png(ihdr(20, 10), zlib.compress(RAW[:-21])),
        truncated("PNG", "its image data holds 189 bytes where its size needs 210"),
    ),
    "a complete stream a byte short": (
        png(ihdr(20, 10), zlib.compress(RAW[:-1])),
        truncated("PNG", "its image data holds 209 bytes where its size needs 210"),
    ),
    "a complete stream a byte short, in many chunks": (
        png(
            ihdr(20, 10),
            *pieces_of(zlib.compress(RAW[:-1]), 7),
        ),
        truncated("PNG", "its image data holds 209 bytes where its size needs 210"),
    ),
    "a complete stream of nothing": (
        png(ihdr(20, 10), zlib.compress(b"")),
        truncated("PNG", "its image data holds 0 bytes where its size needs 210"),
    ),
    "a large image a byte short": (
        png(ihdr(2000, 1000), zlib.compress(bytes(2001 * 1000 - 1))),
        truncated("PNG", "its image data holds 2,000,999 bytes where its size needs 2,001,000"),
    ),
}


@pytest.mark.parametrize("name", sorted(PNG_REFUSALS))
def test_png_refusals_in_words(name):
    data, expected = PNG_REFUSALS[name]
    assert refusal(data) == expected


def test_a_damaged_stream_is_refused_with_zlibs_own_words():
    stream = bytearray(STREAM)
    stream[2] |= 0x06  # the first block's type 3: reserved
    with pytest.raises(zlib.error) as info:  # zlib's words for it
        zlib.decompressobj().decompress(bytes(stream))
    words = str(info.value)
    assert "invalid block type" in words
    assert refusal(png(ihdr(20, 10), bytes(stream))) == corrupt(
        "PNG", f"its compressed image data is damaged ({words})"
    )


def test_image_data_in_many_chunks_is_counted_whole():
    pieces = pieces_of(STREAM, 7)
    assert len(pieces) > 10
    assert refusal(png(ihdr(20, 10), *pieces)) is None
    # Data after the stream's end is not read (as libpng does).
    assert refusal(png(ihdr(20, 10), STREAM + b"trailing", b"more")) is None


def test_more_than_a_mib_inflated_from_one_chunk():
    width, height = 2047, 600  # 1,228,800 bytes inflated, from one chunk of about 1.2 KB
    raw = bytes((width + 1) * height)
    stream = zlib.compress(raw, 9)
    assert refusal(png(ihdr(width, height), stream)) is None
    assert refusal(png(ihdr(width, height + 1), stream)) == truncated(
        "PNG", "its image data holds 1,228,800 bytes where its size needs 1,230,848"
    )


def held_back_split(stream: bytes) -> int:
    """Where to cut `stream` so that its first piece inflates to more than 1 MiB while a
    decompressor limited to 1 MiB of output takes all of its input: the rest of its output is
    held back, to be asked for without input."""
    total, crossing, inflater = 0, None, zlib.decompressobj()
    for end in range(1, len(stream) + 1):
        total += len(inflater.decompress(stream[end - 1 : end]))
        if total > MiB:
            crossing = end
            break
    assert crossing is not None
    for end in range(crossing - 3, crossing + 4):
        inflater = zlib.decompressobj()
        given = inflater.decompress(stream[:end], MiB)
        if len(given) == MiB and not inflater.unconsumed_tail:
            if inflater.decompress(b"", MiB):
                return end
    raise AssertionError("no such cut")


def test_output_held_back_at_the_end_of_a_chunk_is_counted():
    width, height = 2047, 600
    stream = zlib.compress(bytes((width + 1) * height), 9)
    cut = held_back_split(stream)
    assert refusal(png(ihdr(width, height), stream[:cut], stream[cut:])) is None
    assert refusal(png(ihdr(width, height + 1), stream[:cut], stream[cut:])) == truncated(
        "PNG", "its image data holds 1,228,800 bytes where its size needs 1,230,848"
    )


# The PNG specification's passes: first column, first row, column step, row step.
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2)]
ADAM7.append((0, 1, 1, 2))


def interlaced_raw(pixels: list[bytes]) -> bytes:
    """The image data of an interlaced 8-bit grey image, pass by pass, row by row: an empty
    pass (no column or no row) has no rows, and so no filter bytes."""
    height, width = len(pixels), len(pixels[0])
    out = bytearray()
    for x0, y0, dx, dy in ADAM7:
        columns, rows = range(x0, width, dx), range(y0, height, dy)
        if len(columns) and len(rows):
            for y in rows:
                out += b"\x00" + bytes(pixels[y][x] for x in columns)
    return bytes(out)


@pytest.mark.parametrize("height", range(1, 11))
def test_the_size_of_interlaced_image_data(height):
    for width in range(1, 11):
        rng = random.Random(width * 100 + height)
        pixels = [rng.randbytes(width) for _ in range(height)]
        raw = interlaced_raw(pixels)
        data = png(ihdr(width, height, interlace=1), zlib.compress(raw))
        with Image.open(io.BytesIO(data)) as image:  # the layout is right: Pillow reads it
            assert image.tobytes() == b"".join(pixels)
        assert refusal(data) is None, (width, height)
        short = png(ihdr(width, height, interlace=1), zlib.compress(raw[:-1]))
        assert refusal(short) == truncated(
            "PNG", f"its image data holds {len(raw) - 1:,} bytes where its size needs {len(raw):,}"
        ), (width, height)


def test_a_colour_type_it_does_not_know_needs_a_filter_byte_per_row():
    # Colour type 5 does not exist (the probe refuses it): no samples, the rows' filter bytes.
    head = ihdr(5, 4, colour=5)
    assert refusal(png(head, zlib.compress(bytes(4)))) is None
    assert refusal(png(head, zlib.compress(bytes(3)))) == truncated(
        "PNG", "its image data holds 3 bytes where its size needs 4"
    )


def test_without_an_ihdr_no_size_is_expected_of_the_image_data():
    # The probe has read the header before; alone, the walk checks the stream is complete.
    assert refusal(SIGNATURE + png_chunk(b"IDAT", zlib.compress(b"")) + IEND) is None
    assert refusal(SIGNATURE + png_chunk(b"IDAT", zlib.compress(bytes(50))) + IEND) is None


def test_check_pixels_applies_max_pixels():
    data = encode(picture(37, 23), "PNG")
    check_pixels(data, max_pixels=37 * 23)
    assert verdict(lambda d: check_pixels(d, max_pixels=37 * 23 - 1), data) == (
        "DecompressionBomb",
        "the image is 37x23 = 851 pixels, which exceeds the limit of 850 (--max-image-pixels)",
    )


# --- GIF -------------------------------------------------------------------------------------


def lzw(indices: list[int]) -> bytes:
    """GIF image data of code size 2 (indices 0-3): a clear code before every two literals, so
    that every code stays 3 bits wide; as sub-blocks, with the terminator."""
    clear, end = 4, 5
    codes = []
    for i in range(0, len(indices), 2):
        codes += [clear, *indices[i : i + 2]]
    codes.append(end)
    bits = sum(code << (3 * i) for i, code in enumerate(codes))
    packed = bits.to_bytes((3 * len(codes) + 7) // 8, "little")
    blocks = b"".join(
        bytes([len(packed[i : i + 255])]) + packed[i : i + 255] for i in range(0, len(packed), 255)
    )
    return b"\x02" + blocks + b"\x00"


def table_flags(table: bytes) -> int:
    """The colour table flag and size bits of a table of 2, 4, ... colours (none when empty)."""
    return 0x80 | ((len(table) // 3).bit_length() - 2) if table else 0


def gif(*blocks: bytes, table: bytes = b"", screen: tuple[int, int] = (2, 2)) -> bytes:
    head = b"GIF89a" + struct.pack("<HHBBB", *screen, table_flags(table), 0, 0)
    return head + table + b"".join(blocks) + b"\x3b"


def image(indices: list[int], size=(2, 2), table: bytes = b"") -> bytes:
    descriptor = struct.pack("<HHHHB", 0, 0, *size, table_flags(table))
    return b"\x2c" + descriptor + table + lzw(indices)


RED_BLUE = bytes([255, 0, 0, 0, 0, 255])  # two colours
FOUR = bytes([255, 0, 0, 0, 0, 255, 0, 255, 0, 9, 9, 9])


def test_the_hand_built_gif_is_one_pillow_reads():
    data = gif(image([0, 1, 2, 3]), table=FOUR)
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.mode == "P"
        assert list(decoded.getdata()) == [0, 1, 2, 3]
    assert refusal(data) is None


GIF_REFUSALS = {
    "12 bytes": (b"GIF89a" + bytes(6), truncated("GIF", "it ends inside its header")),
    "its header only": (b"GIF89a" + bytes(7), corrupt("GIF", "it holds no image")),
    "its header and trailer": (gif(), corrupt("GIF", "it holds no image")),
    "cut in an image descriptor": (
        gif(table=RED_BLUE)[:-1] + b"\x2c\x00\x00",
        truncated("GIF", "the file ends inside a GIF image descriptor"),
    ),
    "cut in its image data": (
        gif(image([0, 1, 1, 0]), table=RED_BLUE)[:-3],
        truncated("GIF", "the file ends inside a GIF data block"),
    ),
    "an unknown block": (
        gif(b"\x99", table=RED_BLUE),
        corrupt("GIF", "unexpected GIF block 0x99 at byte 19"),
    ),
    "an empty first image": (
        gif(image([], size=(0, 2)), table=RED_BLUE),
        corrupt("GIF", "its first image is 0x2 pixels"),
    ),
}


@pytest.mark.parametrize("name", sorted(GIF_REFUSALS))
def test_gif_refusals_in_words(name):
    data, expected = GIF_REFUSALS[name]
    assert refusal(data) == expected


@pytest.mark.parametrize(
    "indices, refused",
    [
        ([0, 1, 1, 0], None),
        ([0, 1, 1, 2], corrupt("GIF", "a pixel has colour index 2, beyond its 2 colours")),
        ([3, 1, 1, 0], corrupt("GIF", "a pixel has colour index 3, beyond its 2 colours")),
    ],
)
def test_a_colour_index_beyond_the_colour_table_as_tensorflow_refuses_it(indices, refused, tf):
    data = gif(image(indices), table=RED_BLUE)
    assert refusal(data) == refused
    if refused is None:
        assert tf.io.decode_gif(data).shape == (1, 2, 2, 3)
    else:
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.io.decode_gif(data)


def test_a_grey_local_table_pillow_does_not_keep_is_not_checked_against_the_global_one(tf):
    # Pillow opens a first frame whose own table is the grey ramp 0, 1, 2, 3 as "L" (grey
    # values, not indices) with the global palette kept: index 3 is within its own table.
    grey = bytes(v for i in range(4) for v in (i, i, i))
    data = gif(image([3, 1, 2, 0], table=grey), table=RED_BLUE)
    with Image.open(io.BytesIO(data)) as decoded:
        decoded.load()
        assert decoded.mode == "L" and decoded.palette is not None
    assert refusal(data) is None
    assert (
        tf.io.decode_gif(data).numpy().reshape(-1).tolist() == [3] * 3 + [1] * 3 + [2] * 3 + [0] * 3
    )


# --- WebP ------------------------------------------------------------------------------------


def riff(body: bytes, size: int | None = None) -> bytes:
    return b"RIFF" + struct.pack("<I", len(body) + 4 if size is None else size) + b"WEBP" + body


def chunk(fourcc: bytes, data: bytes, length: int | None = None) -> bytes:
    """A RIFF chunk as written (its length, and a pad byte after odd data): `length` claims
    another length, for damage."""
    length = len(data) if length is None else length
    return fourcc + struct.pack("<I", length) + data + b"\x00" * (len(data) & 1)


LOSSLESS = encode(picture(), "WEBP", lossless=True)
LOSSY = encode(picture(), "WEBP", quality=80)
BODY = LOSSLESS[12:]  # its VP8L chunk
END = len(LOSSLESS)


def test_the_webps_are_simple_files_of_one_bitstream():
    assert LOSSLESS[12:16] == b"VP8L" and LOSSY[12:16] == b"VP8 "
    for data in (LOSSLESS, LOSSY, riff(BODY)):
        assert refusal(data) is None


WEBP_REFUSALS = {
    "a size beyond 2 GiB declared": (
        riff(BODY, size=0xFFFFFFFF),
        truncated("WEBP", f"its header declares 4,294,967,303 bytes, the file has {END:,}"),
    ),
    "a byte more declared": (
        riff(BODY, size=len(BODY) + 5),
        truncated("WEBP", f"its header declares {END + 1:,} bytes, the file has {END:,}"),
    ),
    "4 bytes after its chunks": (
        riff(BODY + b"ZZZZ"),
        truncated("WEBP", f"it ends inside a chunk header (at byte {END:,})"),
    ),
    "7 bytes after its chunks": (
        riff(BODY + b"ZZZZ\x00\x00\x00"),
        truncated("WEBP", f"it ends inside a chunk header (at byte {END:,})"),
    ),
    "a chunk length beyond 2 GiB": (
        riff(BODY + b"ZZZZ" + struct.pack("<I", 0xFFFFFFFF) + b"abcd"),
        truncated("WEBP", f"a chunk at byte {END:,} runs past the file's end"),
    ),
    "an even chunk a byte short": (
        riff(BODY + chunk(b"ZZZZ", b"abcde", length=6)[:-1]),
        truncated("WEBP", f"a chunk at byte {END:,} runs past the file's end"),
    ),
    "an even chunk of 6 mod 4 a byte short": (
        riff(BODY + chunk(b"ZZZZ", b"abcdefghi", length=10)[:-1]),
        truncated("WEBP", f"a chunk at byte {END:,} runs past the file's end"),
    ),
    "an odd chunk a byte and its pad short": (
        riff(BODY + chunk(b"ZZZZ", b"abcd", length=5)),
        truncated("WEBP", f"a chunk at byte {END:,} runs past the file's end"),
    ),
    "an odd chunk two bytes and its pad short": (
        riff(BODY + chunk(b"ZZZZ", b"abc", length=5)[:-1]),
        truncated("WEBP", f"a chunk at byte {END:,} runs past the file's end"),
    ),
    "two bitstreams": (riff(BODY + BODY), corrupt("WEBP", "it holds 2 image bitstreams, not one")),
    "a lossy and a lossless bitstream": (
        riff(LOSSY[12:] + BODY),
        corrupt("WEBP", "it holds 2 image bitstreams, not one"),
    ),
    "no bitstream": (
        riff(chunk(b"ZZZZ", b"")),
        corrupt("WEBP", "it holds 0 image bitstreams, not one"),
    ),
}


@pytest.mark.parametrize("name", sorted(WEBP_REFUSALS))
def test_webp_refusals_in_words(name):
    data, expected = WEBP_REFUSALS[name]
    assert refusal(data) == expected


def test_an_empty_chunk_ending_the_file_is_whole(tf):
    data = riff(BODY + chunk(b"ZZZZ", b""))
    assert refusal(data) is None
    assert tf.io.decode_webp(data).shape == (1, 23, 37, 3)


def gradient_webp(width: int) -> bytes:
    """A lossless WebP of `width` x 5 pixels (of 1 and 3 pixels, its VP8L chunk's length odd)."""
    grey = Image.linear_gradient("L").resize((width, 5))
    return encode(grey.convert("RGB"), "WEBP", lossless=True)


@pytest.mark.parametrize("width, length", [(1, 51), (3, 61)])
def test_a_last_chunk_without_its_pad_byte_is_accepted_as_tensorflow_decodes_it(width, length, tf):
    data = gradient_webp(width)
    assert struct.unpack_from("<I", data, 16)[0] == length and len(data) == 20 + length + 1
    unpadded = riff(data[12:-1])
    # libwebp's decoder (TensorFlow's) reads the file; Pillow's demuxer alone would refuse it.
    decoded = tf.io.decode_webp(unpadded).numpy()
    assert decoded.shape == (1, 5, width, 3)
    with pytest.raises(OSError):
        Image.open(io.BytesIO(unpadded)).load()
    assert refusal(unpadded) is None
    # Resizing and re-encoding open it too, to the pixels TensorFlow decodes.
    facts, image = open_image(unpadded)
    assert (facts.format, facts.width, facts.height) == ("webp", width, 5)
    assert image.convert("RGB").tobytes() == decoded[0].tobytes()
    # So do the reports: the summary's description and the contact sheet's thumbnail.
    assert describe_image(unpadded).startswith(f"WEBP {width}×5 RGB")
    thumbnail = make_thumbnail(unpadded)
    assert thumbnail.error is None and (thumbnail.width, thumbnail.height) == (width, 5)


def test_a_missing_pad_byte_is_added_only_to_an_odd_length_webp():
    data = gradient_webp(3)
    unpadded = riff(data[12:-1])
    assert webp_with_pad_byte(unpadded) == data
    assert webp_with_pad_byte(data) is data
    odd_png = encode(picture(), "PNG") + b"x" * (1 - len(encode(picture(), "PNG")) % 2)
    assert len(odd_png) % 2 == 1 and webp_with_pad_byte(odd_png) is odd_png
    wave = b"RIFF" + struct.pack("<I", 5) + b"WAVE" + b"x"
    assert webp_with_pad_byte(wave) is wave


def test_a_chunk_ending_two_bytes_past_the_file_is_truncated():
    data = gradient_webp(3)
    cut = riff(data[12:-2])
    assert refusal(cut) == truncated("WEBP", "a chunk at byte 12 runs past the file's end")


def with_first_partition(data: bytes, size: int) -> bytes:
    """The lossy WebP with its VP8 frame tag's first partition size (bits 5-23) set."""
    tag = int.from_bytes(data[20:23], "little")
    tag = (tag & 0x1F) | (size << 5)
    return data[:20] + tag.to_bytes(3, "little") + data[23:]


def test_a_vp8_first_partition_past_its_frame():
    length = struct.unpack_from("<I", LOSSY, 16)[0]
    first = int.from_bytes(LOSSY[20:23], "little") >> 5
    assert 0 < first < length - 10
    past = with_first_partition(LOSSY, length - 9)
    assert refusal(past) == corrupt("WEBP", "its VP8 frame's first partition runs past the frame")
    # Up to the frame's end it fits: what is wrong then is the decoder's to find.
    fits = with_first_partition(LOSSY, length - 10)
    assert refusal(fits) == verdict(decode_image_bytes, fits)
    assert "first partition" not in refusal(fits)[1]


def vp8_header(first: int) -> bytes:
    """A VP8 key frame's 10-byte header: frame tag (key frame, version 0, shown, the first
    partition's size), start code, 8 x 8 pixels."""
    tag = 0x10 | (first << 5)
    return tag.to_bytes(3, "little") + b"\x9d\x01\x2a" + struct.pack("<HH", 8, 8)


def test_a_vp8_chunk_of_exactly_its_header():
    assert refusal(riff(chunk(b"VP8 ", vp8_header(1)))) == corrupt(
        "WEBP", "its VP8 frame's first partition runs past the frame"
    )
    empty = riff(chunk(b"VP8 ", vp8_header(0)))
    assert refusal(empty) == verdict(decode_image_bytes, empty)
    assert "first partition" not in refusal(empty)[1]
