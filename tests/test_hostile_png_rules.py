"""PNGs (and a GIF) that Pillow reads but TensorFlow's decoders refuse (libpng 1.6.43 in
TensorFlow 2.21, giflib): refused by the probe or the writer's structure check, each with its
reason; and the channel count of a PNG with a tRNS chunk libpng ignores, as TensorFlow decodes it.

Every case is decoded by TensorFlow here: a refusal is tested against a file TensorFlow fails
on, an acceptance against one it decodes to the size and channels the probe gives.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from conftest import read_errors

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.integrity import check_structure
from recordforge.transforms.core.images.probe import probe_image_bytes

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def ihdr(width=4, height=4, depth=8, colour=0, compression=0, filter_method=0, interlace=0):
    return chunk(
        b"IHDR",
        struct.pack(
            ">IIBBBBB", width, height, depth, colour, compression, filter_method, interlace
        ),
    )


_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2))
_ADAM7 += ((0, 1, 1, 2),)


def raw(width=4, height=4, depth=8, colour=0, interlace=0) -> bytes:
    """Image data of the right size: rows of a filter byte 0 and bytes 0..n (palette indices
    kept at 0, within any palette)."""

    def rows(columns: int, count: int) -> bytes:
        if not columns or not count:
            return b""
        size = (columns * _SAMPLES[colour] * depth + 7) // 8
        row = bytes(size) if colour == 3 else bytes(i % 251 for i in range(size))
        return (b"\x00" + row) * count

    if not interlace:
        return rows(width, height)
    return b"".join(
        rows((width - x + dx - 1) // dx, (height - y + dy - 1) // dy) for x, y, dx, dy in _ADAM7
    )


IEND = chunk(b"IEND", b"")
GREY = zlib.compress(raw())
RGB = zlib.compress(raw(colour=2))
INDICES = zlib.compress(raw(colour=3))


def plte(colours: int) -> bytes:
    return chunk(b"PLTE", bytes(range(3)) * colours)


def png(*chunks: bytes) -> bytes:
    return SIGNATURE + b"".join(chunks) + IEND


def idat(data: bytes) -> bytes:
    return chunk(b"IDAT", data)


def tf_decodes(tf, data: bytes) -> tuple[int, ...] | None:
    """The shape TensorFlow decodes the file to, or None when it fails."""
    try:
        return tuple(tf.io.decode_image(data, expand_animations=False).shape)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return None


def refusal(data: bytes, *, max_pixels: int | None = None) -> tuple[str, str, str] | None:
    """(stage, kind, message) of the first refusal: by the probe, else the structure check."""
    try:
        if max_pixels is None:
            probe_image_bytes(data)
        else:
            probe_image_bytes(data, max_pixels=max_pixels)
    except InputError as error:
        return "probe", error.kind, error.message
    try:
        check_structure(data)
    except InputError as error:
        return "write", error.kind, error.message
    return None


def corrupt(what: str) -> tuple[str, str]:
    return "CorruptImage", f"the PNG file is corrupt: {what}"


# name: (file, stage, (kind, message))
REFUSED = {
    "a palette image without PLTE": (
        png(ihdr(colour=3), idat(INDICES)),
        "probe",
        corrupt("it is a palette image with no PLTE chunk before its image data"),
    ),
    "an empty PLTE": (
        png(ihdr(colour=3), chunk(b"PLTE", b""), idat(INDICES)),
        "probe",
        corrupt("its PLTE chunk is 0 bytes long, not 3 bytes for each of 1 to 256 colours"),
    ),
    "a PLTE of 4 bytes": (
        png(ihdr(colour=3), chunk(b"PLTE", b"\1\2\3\4"), idat(INDICES)),
        "probe",
        corrupt("its PLTE chunk is 4 bytes long, not 3 bytes for each of 1 to 256 colours"),
    ),
    "a PLTE of 257 colours": (
        png(ihdr(colour=3), plte(257), idat(INDICES)),
        "probe",
        corrupt("its PLTE chunk is 771 bytes long, not 3 bytes for each of 1 to 256 colours"),
    ),
    "a PLTE after IDAT": (
        png(ihdr(colour=3), idat(INDICES), plte(1)),
        "probe",
        corrupt("it is a palette image with no PLTE chunk before its image data"),
    ),
    "two PLTE chunks": (
        png(ihdr(colour=3), plte(2), plte(2), idat(INDICES)),
        "probe",
        corrupt("it has a second PLTE chunk (at byte 51)"),
    ),
    "an RGB image's second PLTE, after IDAT": (
        png(ihdr(colour=2), plte(2), idat(RGB), plte(2)),
        "write",
        corrupt(f"it has a second PLTE chunk (at byte {51 + 12 + len(RGB):,})"),
    ),
    "an RGB image's empty PLTE": (
        png(ihdr(colour=2), chunk(b"PLTE", b""), idat(RGB)),
        "probe",
        corrupt("its PLTE chunk is empty"),
    ),
    "an RGBA image's empty PLTE": (
        png(ihdr(colour=6), chunk(b"PLTE", b""), idat(zlib.compress(raw(colour=6)))),
        "probe",
        corrupt("its PLTE chunk is empty"),
    ),
    "two IHDR chunks": (
        png(ihdr(colour=2), ihdr(colour=2), idat(RGB)),
        "probe",
        corrupt("it has a second IHDR chunk (at byte 33)"),
    ),
    "an IHDR after IDAT": (
        png(ihdr(), idat(GREY), ihdr()),
        "write",
        corrupt(f"it has a second IHDR chunk (at byte {33 + 12 + len(GREY):,})"),
    ),
    "a tEXt chunk before IHDR": (
        png(chunk(b"tEXt", b"a\0b"), ihdr(colour=2), idat(RGB)),
        "probe",
        corrupt("its first chunk is tEXt, not IHDR"),
    ),
    "a gAMA chunk before IHDR": (
        png(chunk(b"gAMA", b"\0\0\0\1"), ihdr(), idat(GREY)),
        "probe",
        corrupt("its first chunk is gAMA, not IHDR"),
    ),
    "an IHDR of 14 bytes": (
        png(chunk(b"IHDR", ihdr()[8:21] + b"\0"), idat(GREY)),
        "probe",
        corrupt("its IHDR chunk is 14 bytes long, not 13"),
    ),
    "an unknown critical chunk": (
        png(ihdr(), chunk(b"ABCD", b"xyz"), idat(GREY)),
        "probe",
        corrupt("it has a critical chunk of an unknown type, ABCD (at byte 33)"),
    ),
    "an unknown critical chunk after IDAT": (
        png(ihdr(), idat(GREY), chunk(b"ABcD", b"")),
        "write",
        corrupt(f"it has a critical chunk of an unknown type, ABcD (at byte {45 + len(GREY):,})"),
    ),
    "Apple's CgBI chunk, first": (
        png(chunk(b"CgBI", b"\x50\x00\x20\x06"), ihdr(colour=2), idat(RGB)),
        "probe",
        corrupt("its first chunk is CgBI, not IHDR"),
    ),
    "Apple's CgBI chunk, after IHDR": (
        png(ihdr(colour=2), chunk(b"CgBI", b"\x50\x00\x20\x06"), idat(RGB)),
        "probe",
        (
            "UnsupportedImageFormat",
            "Apple's iPhone-optimised PNG files (a CgBI chunk) are not supported (TensorFlow "
            "cannot decode them); restore them to standard PNG (pngcrush "
            "-revert-iphone-optimizations)",
        ),
    ),
    "a chunk type with a digit": (
        png(ihdr(), chunk(b"a1b2", b"zz"), idat(GREY)),
        "probe",
        corrupt("the type of its chunk at byte 33 is not four letters"),
    ),
    "a chunk type with a digit, after IDAT": (
        png(ihdr(), idat(GREY), chunk(b"a1b2", b"zz")),
        "write",
        corrupt(f"the type of its chunk at byte {45 + len(GREY):,} is not four letters"),
    ),
    "IDAT split by a chunk": (
        png(ihdr(colour=2), idat(RGB[:5]), chunk(b"tEXt", b"a\0b"), idat(RGB[5:])),
        "write",
        corrupt(
            "its image data is split: a tEXt chunk at byte 50 comes before the end of its "
            "compressed stream"
        ),
    ),
    "IDAT split before its checksum": (
        png(ihdr(), idat(GREY[:-4]), chunk(b"tEXt", b"a\0b"), idat(GREY[-4:])),
        "write",
        corrupt(
            f"its image data is split: a tEXt chunk at byte {41 + len(GREY):,} comes before "
            "the end of its compressed stream"
        ),
    ),
    "an empty IDAT, a chunk, then the image data": (
        png(ihdr(), idat(b""), chunk(b"tEXt", b"a\0b"), idat(GREY)),
        "write",
        corrupt(
            "its image data is split: a tEXt chunk at byte 45 comes before the end of its "
            "compressed stream"
        ),
    ),
    "IEND before IDAT": (
        png(ihdr(), IEND, idat(GREY)),
        "probe",
        corrupt("it has no image data (IDAT) before its IEND chunk"),
    ),
    "compression method 1": (
        png(ihdr(compression=1), idat(GREY)),
        "probe",
        corrupt("its compression method 1 does not exist"),
    ),
    "filter method 1": (
        png(ihdr(filter_method=1), idat(GREY)),
        "probe",
        corrupt("its filter method 1 does not exist"),
    ),
    "interlace method 2": (
        png(ihdr(interlace=2), idat(GREY)),
        "probe",
        corrupt("its interlace method 2 does not exist"),
    ),
    "a width of 1,000,001": (
        png(ihdr(1_000_001, 1), idat(zlib.compress(bytes(1_000_002)))),
        "probe",
        (
            "UnsupportedImageFormat",
            "PNG images wider or taller than 1,000,000 pixels are not supported (TensorFlow's "
            "decoder, libpng, refuses them); this one is 1,000,001x1",
        ),
    ),
    "a height of 1,000,001": (
        png(ihdr(1, 1_000_001), idat(zlib.compress(bytes(2_000_002)))),
        "probe",
        (
            "UnsupportedImageFormat",
            "PNG images wider or taller than 1,000,000 pixels are not supported (TensorFlow's "
            "decoder, libpng, refuses them); this one is 1x1,000,001",
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_png_tensorflow_refuses_is_refused_with_its_reason(name, tf):
    data, stage, (kind, message) = REFUSED[name]
    assert tf_decodes(tf, data) is None  # the rule is TensorFlow's
    assert refusal(data) == (stage, kind, message)


def test_a_png_of_2_to_the_29_pixels_is_refused_even_under_max_image_pixels(tf):
    """TensorFlow's own limit ("PNG size too large for int"), read from the header."""
    data = png(ihdr(23_171, 23_171), idat(GREY))
    with pytest.raises(tf.errors.InvalidArgumentError, match="PNG size too large"):
        tf.io.decode_image(data, expand_animations=False)
    assert refusal(data, max_pixels=10**9) == (
        "probe",
        "UnsupportedImageFormat",
        "PNG images of 536,870,912 pixels or more are not supported (TensorFlow refuses them); "
        "this one is 23,171x23,171",
    )
    # Under the default --max-image-pixels it is a decompression bomb first, as before.
    assert refusal(data)[:2] == ("probe", "DecompressionBomb")


def test_a_gif_without_any_colour_table_is_refused(tf):
    data = (
        b"GIF89a"
        + struct.pack("<HHBBB", 4, 4, 0, 0, 0)
        + b"\x2c"
        + struct.pack("<HHHHB", 0, 0, 4, 4, 0)
        + b"\x02\x04\x84\x8f\xa9\x0b\x00\x3b"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="missing color map"):
        tf.io.decode_image(data, expand_animations=False)
    message = "the GIF file is corrupt: its frame 1 has no colour table, and the file no global one"
    assert refusal(data) == ("probe", "CorruptImage", message)
    with pytest.raises(InputError, match="has no colour table"):
        check_structure(data)


# --- accepted: what libpng only warns about, and every valid kind of PNG --------------------


def every_colour_type_and_depth():
    for colour, depths in {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16)}.items():
        for depth in depths:
            for interlace in (0, 1):
                yield (
                    f"colour {colour}, {depth} bits, interlace {interlace}",
                    (colour, depth, interlace),
                )
    for depth in (8, 16):
        for interlace in (0, 1):
            yield f"colour 6, {depth} bits, interlace {interlace}", (6, depth, interlace)


def valid_png(colour: int, depth: int, interlace: int, *extra: bytes, width=13, height=11) -> bytes:
    head = ihdr(width, height, depth, colour, interlace=interlace)
    palette = plte(1 << depth) if colour == 3 else b""
    data = zlib.compress(raw(width, height, depth, colour, interlace))
    return png(head, palette, *extra, idat(data))


ACCEPTED = dict(
    [(name, valid_png(*args)) for name, args in every_colour_type_and_depth()]
    + [
        ("a palette with a valid tRNS", valid_png(3, 8, 0, chunk(b"tRNS", b"\0\x80"))),
        ("a 2-bit palette with a tRNS of 4", valid_png(3, 2, 0, chunk(b"tRNS", bytes(4)))),
        ("grey with a tRNS", valid_png(0, 8, 0, chunk(b"tRNS", b"\0\1"))),
        ("RGB with a tRNS", valid_png(2, 16, 0, chunk(b"tRNS", bytes(6)))),
        ("an unknown ancillary chunk", valid_png(0, 8, 0, chunk(b"abcd", b"x"))),
        ("a private chunk", valid_png(2, 8, 1, chunk(b"prIv", b"private"))),
        ("a safe-to-copy chunk", valid_png(2, 8, 1, chunk(b"abcD", b""))),
        ("a grey image's PLTE (ignored)", valid_png(0, 8, 0, plte(3))),
        ("an RGB image's PLTE of 257 colours", valid_png(2, 8, 0, plte(257))),
        ("an RGB image's PLTE of 4 bytes", valid_png(2, 8, 0, chunk(b"PLTE", b"1234"))),
        ("a grey+alpha image's empty PLTE", valid_png(4, 8, 0, chunk(b"PLTE", b""))),
        ("an RGB image's PLTE after IDAT", png(ihdr(colour=2), idat(RGB), plte(2))),
        (
            "a 1-bit palette of 3 colours",
            png(ihdr(depth=1, colour=3), plte(3), idat(zlib.compress(bytes(8)))),
        ),
        ("a palette of 256 colours", png(ihdr(colour=3), plte(256), idat(INDICES))),
        (
            "IDAT after a chunk, once the stream has ended",
            png(ihdr(), idat(GREY), chunk(b"tEXt", b"a\0b"), idat(b"")),
        ),
        (
            "IDAT in many pieces",
            png(ihdr(), *(idat(GREY[i : i + 3]) for i in range(0, len(GREY), 3))),
        ),
        ("an IEND with data", SIGNATURE + ihdr() + idat(GREY) + chunk(b"IEND", b"x")),
        ("a width of 1,000,000", png(ihdr(1_000_000, 1), idat(zlib.compress(bytes(1_000_001))))),
    ]
)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_png_tensorflow_decodes_is_accepted_with_its_shape(name, tf):
    data = ACCEPTED[name]
    shape = tf_decodes(tf, data)
    assert shape is not None
    facts = probe_image_bytes(data)
    assert (facts.height, facts.width, facts.channels) == shape
    check_structure(data)


# --- a tRNS chunk libpng ignores: the channels TensorFlow decodes -------------------------------

TRANSPARENCY = {
    "empty": (png(ihdr(colour=3), plte(2), chunk(b"tRNS", b""), idat(INDICES)), 3),
    "before PLTE": (png(ihdr(colour=3), chunk(b"tRNS", b"\0"), plte(2), idat(INDICES)), 3),
    "longer than the palette": (
        png(ihdr(colour=3), plte(1), chunk(b"tRNS", b"\0\1\2"), idat(INDICES)),
        3,
    ),
    "longer than the palette a 1-bit image keeps": (
        png(
            ihdr(depth=1, colour=3),
            plte(3),
            chunk(b"tRNS", bytes(3)),
            idat(zlib.compress(bytes(8))),
        ),
        3,
    ),
    "after IDAT": (png(ihdr(colour=3), plte(2), idat(INDICES), chunk(b"tRNS", b"\0")), 3),
    "as long as the palette": (
        png(ihdr(colour=3), plte(2), chunk(b"tRNS", b"\0\0"), idat(INDICES)),
        4,
    ),
    "a second, after one ignored": (
        png(ihdr(colour=3), plte(2), chunk(b"tRNS", b""), chunk(b"tRNS", b"\0"), idat(INDICES)),
        4,
    ),
    "a second, after one before PLTE": (
        png(ihdr(colour=3), chunk(b"tRNS", b"\0"), plte(2), chunk(b"tRNS", b"\0"), idat(INDICES)),
        4,
    ),
    "grey+alpha": (
        png(ihdr(colour=4), chunk(b"tRNS", b"\0\0"), idat(zlib.compress(raw(colour=4)))),
        2,
    ),
    "RGBA": (png(ihdr(colour=6), chunk(b"tRNS", bytes(6)), idat(zlib.compress(raw(colour=6)))), 4),
    "grey, 3 bytes": (png(ihdr(), chunk(b"tRNS", b"\0\0\0"), idat(GREY)), 1),
    "RGB, 7 bytes": (png(ihdr(colour=2), chunk(b"tRNS", bytes(7)), idat(RGB)), 3),
}


@pytest.mark.parametrize("name", sorted(TRANSPARENCY))
def test_the_channels_of_a_png_with_a_trns_chunk_are_tensorflows(name, tf):
    data, channels = TRANSPARENCY[name]
    assert tf_decodes(tf, data) == (4, 4, channels)
    assert probe_image_bytes(data).channels == channels
    check_structure(data)


@pytest.mark.parametrize(
    ("colour", "length", "image"),
    [(0, 0, "a grey"), (0, 1, "a grey"), (2, 0, "an RGB"), (2, 2, "an RGB"), (2, 4, "an RGB")],
)
def test_a_short_trns_pillow_cannot_read_is_refused_in_words(colour, length, image, tf):
    """libpng ignores it (TensorFlow decodes the file); Pillow, which the probe and the writer
    read images with, fails on it: refused, with words rather than Python's `struct` error."""
    data = png(ihdr(colour=colour), chunk(b"tRNS", bytes(length)), idat(RGB if colour else GREY))
    assert tf_decodes(tf, data) is not None
    needed = 2 if colour == 0 else 6
    unit = "byte" if length == 1 else "bytes"
    assert refusal(data) == (
        "probe",
        *corrupt(
            f"its tRNS chunk is {length} {unit} long where {image} image's is {needed} "
            "(Pillow cannot read it)"
        ),
    )


# --- in a conversion --------------------------------------------------------------------------


def test_a_conversion_writes_only_what_tensorflow_decodes(tmp_path, cli, tf):
    root = tmp_path / "pngs" / "x"
    root.mkdir(parents=True)
    refused = {
        "no-plte.png": ("probe", REFUSED["a palette image without PLTE"][0]),
        "plte-257.png": ("probe", REFUSED["a PLTE of 257 colours"][0]),
        "two-ihdr.png": ("probe", REFUSED["two IHDR chunks"][0]),
        "critical.png": ("probe", REFUSED["an unknown critical chunk"][0]),
        "wide.png": ("probe", REFUSED["a width of 1,000,001"][0]),
        "split.png": ("write", REFUSED["IDAT split by a chunk"][0]),
        "ihdr-after-idat.png": ("write", REFUSED["an IHDR after IDAT"][0]),
    }
    for name, (_, data) in refused.items():
        (root / name).write_bytes(data)
    accepted = {
        "trns-empty.png": TRANSPARENCY["empty"],
        "trns-before-plte.png": TRANSPARENCY["before PLTE"],
        "trns-long.png": TRANSPARENCY["longer than the palette"],
        "trns-ok.png": TRANSPARENCY["as long as the palette"],
    }
    for name, (data, _) in accepted.items():
        (root / name).write_bytes(data)
    out = tmp_path / "out"
    for extra in ([], ["--check-pixels"]):
        result = cli("convert", root.parent, "-o", out, "--workers", "1", "--overwrite", *extra)
        assert result.returncode == 0, result.stderr
        errors = {
            Path(e["source"]["path"]).name: (e["stage"], e["error"]) for e in read_errors(out)
        }
        assert errors == {
            name: (stage, "UnsupportedImageFormat" if name == "wide.png" else "CorruptImage")
            for name, (stage, _) in refused.items()
        }
        manifest = json.loads((out / "dataset_info.json").read_text())
        assert manifest["num_records"] == len(accepted)
        from recordforge import iterate

        for record in iterate(str(out), "train"):
            name = record["image/filename"][0].decode()
            shape = tf_decodes(tf, record["image/encoded"][0])
            stored = (
                record["image/height"][0],
                record["image/width"][0],
                record["image/channels"][0],
            )
            assert shape == stored == (4, 4, accepted[Path(name).name][1]), name
