"""The JPEG structure check (core/images/integrity.py's _check_jpeg and _ScanEnds, and
jpeg_segments.py) on files the other tests lack.

Written for mutation testing (docs/testing.md): Pillow's JPEGs (baseline, optimized,
progressive, grayscale, CMYK, restart intervals) edited segment by segment with `struct` (frame
headers, quantization and Huffman tables, scan headers, DAC and DRI segments changed, removed
or cut), every refusal's kind and exact words, and the boundaries libjpeg-turbo draws (65500
pixels, ten blocks in a unit, quantization and Huffman table indices, progressive scan
parameters, restart markers and fill bytes in the scan data). TensorFlow is the oracle for the
few files whose fate is not plain from libjpeg-turbo's source.
"""

from __future__ import annotations

import io
import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.integrity import _ScanEnds, check_structure
from recordforge.transforms.core.images.jpeg_segments import JpegHeader

CORRUPT = "the JPEG file is corrupt: "
TRUNCATED = "the JPEG file is truncated: "
SOF0, SOF1, SOF2, SOF9, SOF10 = 0xC0, 0xC1, 0xC2, 0xC9, 0xCA
DHT, DQT, DAC, SOS, DRI, COM = 0xC4, 0xDB, 0xCC, 0xDA, 0xDD, 0xFE


def pillow_jpeg(mode: str = "RGB", size=(32, 24), **save) -> bytes:
    rng = random.Random(0)
    image = Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **save)
    return buffer.getvalue()


def split(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The segments (marker, body) from SOI to the first scan's header, and the rest."""
    offset, segments = 2, []
    while True:
        marker, length = data[offset + 1], struct.unpack_from(">H", data, offset + 2)[0]
        segments.append((marker, data[offset + 4 : offset + 2 + length]))
        offset += 2 + length
        if marker == SOS:
            return segments, data[offset:]


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body


def join(segments: list[tuple[int, bytes]], rest: bytes) -> bytes:
    return b"\xff\xd8" + b"".join(segment(marker, body) for marker, body in segments) + rest


def where(data: bytes, marker: int, nth: int = 0) -> int:
    """The offset of the nth segment with this marker before the first scan's data."""
    offset = 2
    for found, body in split(data)[0]:
        if found == marker:
            if not nth:
                return offset
            nth -= 1
        offset += 4 + len(body)
    raise AssertionError(f"no segment 0xFF{marker:02X}")


def body_of(data: bytes, marker: int, nth: int = 0) -> bytes:
    return [body for found, body in split(data)[0] if found == marker][nth]


def edited(data: bytes, marker: int, edit, nth: int = 0) -> bytes:
    """`data` with the nth segment of this marker's body replaced by edit(body) (None: removed);
    `marker` may be changed with a (marker, body) result."""
    segments, rest = split(data)
    index = [i for i, (found, _) in enumerate(segments) if found == marker][nth]
    new = edit(segments[index][1])
    if new is None:
        del segments[index]
    else:
        segments[index] = new if isinstance(new, tuple) else (marker, new)
    return join(segments, rest)


def inserted(data: bytes, before: int, marker: int, body: bytes) -> bytes:
    """`data` with a segment inserted before the first segment with marker `before`."""
    segments, rest = split(data)
    index = [i for i, (found, _) in enumerate(segments) if found == before][0]
    segments.insert(index, (marker, body))
    return join(segments, rest)


def patched(body: bytes, position: int, *values: int) -> bytes:
    out = bytearray(body)
    out[position : position + len(values)] = bytes(values)
    return bytes(out)


def refusal(data: bytes) -> tuple[str, str]:
    with pytest.raises(InputError) as caught:
        check_structure(data)
    return caught.value.kind, caught.value.message


def corrupt(what: str) -> tuple[str, str]:
    return "CorruptImage", CORRUPT + what


def truncated(what: str) -> tuple[str, str]:
    return "TruncatedImage", TRUNCATED + what


BASELINE = pillow_jpeg()  # 4:2:0, Pillow's (the standard) Huffman tables
GREY = pillow_jpeg("L")
PROGRESSIVE = pillow_jpeg(progressive=True)
SCAN = where(BASELINE, SOS)  # 609
FRAME = where(BASELINE, SOF0)  # 158
GREY_SCAN = where(GREY, SOS)
PROGRESSIVE_SCAN = where(PROGRESSIVE, SOS)


def frame_body(height=24, width=32, components=((1, 0x22, 0), (2, 0x11, 1), (3, 0x11, 1))):
    return struct.pack(">BHHB", 8, height, width, len(components)) + b"".join(
        bytes(component) for component in components
    )


def with_frame(body: bytes, data: bytes = BASELINE, marker: int = SOF0) -> bytes:
    frame = [found for found, _ in split(data)[0] if found in (SOF0, SOF1, SOF2, SOF9, SOF10)]
    return edited(data, frame[0], lambda _: (marker, body))


def with_scan(body: bytes, data: bytes = BASELINE) -> bytes:
    return edited(data, SOS, lambda _: body)


def scan_body(components, start=0, end=63, approximation=0) -> bytes:
    return bytes([len(components), *[b for pair in components for b in pair]]) + bytes(
        [start, end, approximation]
    )


RGB_SCAN = ((1, 0x00), (2, 0x11), (3, 0x11))


def without_huffman_tables(data: bytes) -> bytes:
    segments, rest = split(data)
    return join([(m, b) for m, b in segments if m != DHT], rest)


def huffman_table(kind: int, index: int, counts: list[int], symbols: bytes) -> bytes:
    return bytes([kind << 4 | index, *counts, *[0] * (16 - len(counts))]) + symbols


# --- accepted: files libjpeg-turbo decodes ------------------------------------------------------

ACCEPTED = {
    "baseline": lambda: BASELINE,
    "optimized": lambda: pillow_jpeg(optimize=True),
    "progressive": lambda: PROGRESSIVE,
    "progressive_grey": lambda: pillow_jpeg("L", progressive=True),
    "grey": lambda: GREY,
    "cmyk": lambda: pillow_jpeg("CMYK"),
    "restart_every_unit": lambda: pillow_jpeg(restart_marker_blocks=1),
    "subsampling_444": lambda: pillow_jpeg(subsampling=0),
    "subsampling_422": lambda: pillow_jpeg(subsampling=1),
    # Motion-JPEG style: no Huffman tables; libjpeg-turbo supplies the standard 0 and 1.
    "baseline_without_huffman_tables": lambda: without_huffman_tables(BASELINE),
    "extended_sequential_frame": lambda: with_frame(body_of(BASELINE, SOF0), marker=SOF1),
    # Arithmetic coding: 16 tables, each with defaults; no Huffman table is looked for.
    "arithmetic_sequential_frame": lambda: with_scan(
        scan_body(((1, 0xFF), (2, 0x5A), (3, 0x11))),
        without_huffman_tables(with_frame(body_of(BASELINE, SOF0), marker=SOF9)),
    ),
    "arithmetic_progressive_frame": lambda: without_huffman_tables(
        with_frame(body_of(PROGRESSIVE, SOF2), PROGRESSIVE, marker=SOF10)
    ),
    # Restart markers and TEM carry no length, wherever they are.
    "restart_marker_in_header": lambda: BASELINE[:20] + b"\xff\xd0" + BASELINE[20:],
    "last_restart_marker_in_header": lambda: BASELINE[:20] + b"\xff\xd7" + BASELINE[20:],
    "tem_marker_in_header": lambda: BASELINE[:20] + b"\xff\x01" + BASELINE[20:],
    "fill_bytes_before_markers": lambda: BASELINE[:20] + b"\xff\xff\xff" + BASELINE[20:],
    "empty_comment": lambda: inserted(BASELINE, SOF0, COM, b""),
    "empty_quantization_segment": lambda: inserted(BASELINE, SOF0, DQT, b""),
    "empty_huffman_segment": lambda: inserted(BASELINE, SOS, DHT, b""),
    "empty_arithmetic_conditioning": lambda: inserted(BASELINE, SOS, DAC, b""),
    "restart_interval": lambda: inserted(BASELINE, SOS, DRI, b"\x00\x04"),
    "data_after_end_of_image": lambda: BASELINE + b"motion photo video" * 3,
    # A 0xFF, fill bytes, then a stuffed zero: one 0xFF of data (jdhuff.c's fill_bit_buffer).
    "fill_bytes_in_scan_data": lambda: (
        BASELINE[: SCAN + 30] + b"\xff\xff\x00" + BASELINE[SCAN + 30 :]
    ),
    "restart_markers_in_scan_data": lambda: (
        BASELINE[: SCAN + 30] + b"\xff\xd0\xff\xd7" + BASELINE[SCAN + 30 :]
    ),
    "four_tables_in_one_quantization_segment": lambda: edited(
        edited(BASELINE, DQT, lambda body: None, nth=1),
        DQT,
        lambda body: (
            body + body_of(BASELINE, DQT, 1) + bytes([0x12]) + bytes(128) + b"\x03" + bytes(64)
        ),
    ),
    "quantization_table_3": lambda: edited(
        inserted(BASELINE, SOF0, DQT, b"\x03" + bytes(range(1, 65))),
        SOF0,
        lambda body: patched(body, 14, 3),
    ),
    "huffman_tables_3": lambda: with_scan(
        scan_body(((1, 0x33), (2, 0x11), (3, 0x11))),
        inserted(
            inserted(BASELINE, SOS, DHT, b"\x03" + body_of(BASELINE, DHT, 0)[1:]),
            SOS,
            DHT,
            b"\x13" + body_of(BASELINE, DHT, 1)[1:],
        ),
    ),
    "largest_dimensions": lambda: with_frame(frame_body(65500, 65500)),
    "sampling_4x4_one_component": lambda: edited(GREY, SOF0, lambda body: patched(body, 7, 0x44)),
    "sampling_1x4_one_component": lambda: edited(GREY, SOF0, lambda body: patched(body, 7, 0x14)),
    "sampling_4x1_one_component": lambda: edited(GREY, SOF0, lambda body: patched(body, 7, 0x41)),
    # 4 + 4 + 2 blocks: ten, libjpeg's most in a unit.
    "ten_blocks_in_a_unit": lambda: with_frame(
        frame_body(components=((1, 0x22, 0), (2, 0x22, 1), (3, 0x21, 1)))
    ),
    "arithmetic_conditioning_bounds": lambda: inserted(
        BASELINE, SOS, DAC, bytes([0, 0x00, 15, 0xFF, 16, 0x0F, 31, 0x01, 0, 0x11])
    ),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_jpegs_libjpeg_decodes_pass(name):
    check_structure(ACCEPTED[name]())


def test_a_file_without_huffman_tables_decodes_with_the_standard_ones(tf):
    data = without_huffman_tables(BASELINE)
    assert np.array_equal(tf.io.decode_jpeg(data).numpy(), tf.io.decode_jpeg(BASELINE).numpy())


# --- _check_jpeg: the marker walk ------------------------------------------------------------


def _header_only() -> bytes:
    return BASELINE[:SCAN]


WALK_REFUSALS = {
    "ends_after_a_segment": (_header_only, truncated("it ends before its end-of-image marker")),
    "ends_in_fill_bytes": (
        lambda: _header_only() + b"\xff\xff",
        truncated("it ends before its end-of-image marker"),
    ),
    "ends_after_an_empty_segment": (
        lambda: b"\xff\xd8" + segment(COM, b""),
        truncated("it ends before its end-of-image marker"),
    ),
    "no_marker": (
        lambda: BASELINE[:20] + b"\x00" + BASELINE[20:],
        corrupt("no marker where one belongs (at byte 20)"),
    ),
    "segment_length_one_short": (
        lambda: b"\xff\xd8" + b"\xff\xfe\x00\x03ab" + BASELINE[2:],
        corrupt("no marker where one belongs (at byte 7)"),
    ),
    "end_of_image_before_any_scan": (
        lambda: _header_only() + b"\xff\xd9",
        corrupt("it ends before any image data"),
    ),
    "end_of_image_at_once": (lambda: b"\xff\xd8\xff\xd9", corrupt("it ends before any image data")),
    "unknown_marker": (
        lambda: BASELINE[:20] + segment(0xDE, b"\x00\x00") + BASELINE[20:],
        corrupt("an invalid marker 0xFFDE at byte 20"),
    ),
    "unknown_marker_after_fill_bytes": (
        lambda: BASELINE[:20] + b"\xff\xff" + segment(0x02, b"") + BASELINE[20:],
        corrupt("an invalid marker 0xFF02 at byte 22"),
    ),
    "start_of_image_again": (
        lambda: BASELINE[:20] + b"\xff\xd8" + BASELINE[20:],
        corrupt("an invalid marker 0xFFD8 at byte 20"),
    ),
    "ends_after_a_marker": (
        lambda: _header_only() + b"\xff\xfe",
        truncated("it ends inside a segment header"),
    ),
    "ends_inside_a_length": (
        lambda: _header_only() + b"\xff\xfe\x00",
        truncated("it ends inside a segment header"),
    ),
    "length_zero": (
        lambda: BASELINE[:20] + b"\xff\xfe\x00\x00" + BASELINE[20:],
        corrupt("a segment of impossible length at byte 20"),
    ),
    "length_one": (
        lambda: BASELINE[:20] + b"\xff\xfe\x00\x01" + BASELINE[20:],
        corrupt("a segment of impossible length at byte 20"),
    ),
    "segment_one_byte_past_the_end": (
        lambda: _header_only() + b"\xff\xfe\x00\x05ab",
        truncated(f"a segment at byte {SCAN:,} runs past the file's end"),
    ),
    "segment_to_the_end": (
        lambda: _header_only() + b"\xff\xfe\x00\x04ab",
        truncated("it ends before its end-of-image marker"),
    ),
    "no_end_of_image": (
        lambda: BASELINE[:-2],
        truncated("its image data ends without an end-of-image marker"),
    ),
    "no_end_of_image_last_byte_ff": (
        lambda: BASELINE[:-2] + b"\xff",
        truncated("its image data ends without an end-of-image marker"),
    ),
    "scan_header_is_the_last_thing": (
        lambda: BASELINE[: SCAN + 14],
        truncated("its image data ends without an end-of-image marker"),
    ),
    "second_start_of_image_in_scan_data": (
        lambda: BASELINE[: SCAN + 30] + b"\xff\xd8" + BASELINE[SCAN + 30 :],
        corrupt(f"an invalid marker 0xFFD8 at byte {SCAN + 30:,}"),
    ),
    "unknown_marker_in_scan_data": (
        lambda: BASELINE[: SCAN + 30] + b"\xff\xcf\x00\x02" + BASELINE[SCAN + 30 :],
        corrupt("its frame type (0xFFCF) is one TensorFlow does not decode"),
    ),
    "reserved_marker_in_scan_data": (
        lambda: BASELINE[: SCAN + 30] + b"\xff\x02" + BASELINE[SCAN + 30 :],
        corrupt(f"an invalid marker 0xFF02 at byte {SCAN + 30:,}"),
    ),
    "scan_header_length_too_long": (
        lambda: BASELINE[:SCAN] + b"\xff\xda\x00\x0e" + BASELINE[SCAN + 4 :],
        corrupt(f"its scan header at byte {SCAN:,} has the wrong length"),
    ),
}


@pytest.mark.parametrize("name", sorted(WALK_REFUSALS))
def test_the_marker_walk_refuses_with_these_words(name):
    make, expected = WALK_REFUSALS[name]
    assert refusal(make()) == expected


@pytest.mark.parametrize("marker", [b"\xff\x01", b"\xff\xd0", b"\xff\xd7"])
def test_the_walk_goes_on_after_a_marker_without_a_length(marker):
    data = BASELINE[:20] + marker + BASELINE[20:-2]  # and no end-of-image marker
    assert refusal(data) == truncated("its image data ends without an end-of-image marker")


def test_a_scan_is_followed_past_its_restart_markers_to_the_next_segment():
    data = pillow_jpeg(restart_marker_blocks=1)
    scan = where(data, SOS)
    damaged = data[:-2] + b"\xff\xde" + data[-2:]
    assert refusal(damaged) == corrupt(f"an invalid marker 0xFFDE at byte {len(data) - 2:,}")
    assert scan < len(data) - 2


def test_a_progressive_files_later_segments_are_checked():
    # The second scan's Huffman table names class 2: found only by walking past the first scan.
    segments, rest = split(PROGRESSIVE)
    later = rest.index(b"\xff\xc4")
    damaged = bytearray(PROGRESSIVE)
    position = len(PROGRESSIVE) - len(rest) + later
    damaged[position + 4] = 0x20 | damaged[position + 4] & 15
    index = damaged[position + 4] & 15
    assert refusal(bytes(damaged)) == corrupt(
        f"a Huffman table at byte {position:,} has class 2, index {index}"
    )


# --- _ScanEnds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "offset", "end"),
    [
        (b"", 0, None),
        (b"\xff", 0, None),
        (b"\xff\xd9", 0, 0),
        (b"\xff\xd9", 1, None),
        (b"\xff\x00\xff\xd0\xff\xd7\xff\xcf\xff\xd8", 0, 6),
        (b"\xff\x00\xff\xd0\xff\xd7\xff\xcf\xff\xd8", 7, 8),
        (b"\xff\xff\xff\xd9\xff", 0, 2),
        (b"\x00\xff\x01\xff\xfe", 0, 1),
        (b"\x00\xff\x01\xff\xfe", 2, 3),
        (b"\xff\xd0\x00\xff\xd8", 0, 3),
        (b"\xff\xd7\xff\xcf", 0, 2),
        (b"\xff\xd0\xff\xff\x00", 0, None),
    ],
)
@pytest.mark.parametrize("one_by_one", [1, 16])
def test_a_scan_ends_at_a_marker_not_at_stuffed_bytes_restarts_or_fill_bytes(
    data, offset, end, one_by_one
):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_ScanEnds, "_ONE_BY_ONE", one_by_one)
        assert _ScanEnds(data).after(offset) == end


def _scan_end_by_definition(data: bytes, offset: int) -> int | None:
    for position in range(offset, len(data) - 1):
        if data[position] == 0xFF and data[position + 1] not in {0, 0xFF, *range(0xD0, 0xD8)}:
            return position
    return None


# The bytes either side of each boundary the scan draws: 0x00/0x01, 0xCF/0xD0, 0xD7/0xD8, 0xFE/0xFF.
_BOUNDARY_BYTES = st.sampled_from([0x00, 0x01, 0xCF, 0xD0, 0xD7, 0xD8, 0xD9, 0xFE, 0xFF])


@pytest.mark.parametrize("one_by_one", [1, 16, 1000])
@settings(max_examples=300, deadline=None)
@given(values=st.lists(_BOUNDARY_BYTES, max_size=80), offset=st.integers(0, 80))
def test_a_scan_ends_where_its_definition_says_stepped_or_filtered(one_by_one, values, offset):
    # Runs of restarts and fill bytes longer than the steps taken one at a time go to the
    # filter; both ways must agree with the definition.
    data = bytes(values)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_ScanEnds, "_ONE_BY_ONE", one_by_one)
        assert _ScanEnds(data).after(offset) == _scan_end_by_definition(data, offset)


def test_a_scan_of_many_restart_markers_is_checked_as_one_of_few():
    restarts = b"".join(bytes([0x12, 0xFF, 0xD0 + index % 8]) for index in range(50_000))
    data = b"\xff\xd8" + restarts + b"\xff\xd9"
    assert _ScanEnds(data).after(2) == len(data) - 2


# --- segment: frame types and restart intervals ---------------------------------------------


@pytest.mark.parametrize("marker", [0xC3, 0xC5, 0xC6, 0xC7, 0xC8, 0xCB, 0xCD, 0xCE, 0xCF])
def test_frame_types_tensorflow_does_not_decode_are_refused(marker):
    data = with_frame(body_of(BASELINE, SOF0), marker=marker)
    assert refusal(data) == corrupt(
        f"its frame type (0xFF{marker:02X}) is one TensorFlow does not decode"
    )


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x00\x04\x00"])
def test_a_restart_interval_segment_of_the_wrong_length_is_refused(body):
    data = inserted(BASELINE, SOS, DRI, body)
    offset = where(data, DRI)
    assert refusal(data) == corrupt(
        f"its restart interval segment at byte {offset:,} has the wrong length"
    )


# --- _frame ------------------------------------------------------------------------------------

FRAME_REFUSALS = {
    "second_frame": (
        lambda: inserted(BASELINE, SOS, SOF0, body_of(BASELINE, SOF0)),
        f"a second frame header at byte {SCAN:,}",
    ),
    "second_frame_of_another_type": (
        lambda: inserted(BASELINE, SOS, SOF2, body_of(BASELINE, SOF0)),
        f"a second frame header at byte {SCAN:,}",
    ),
    "five_bytes": (
        lambda: with_frame(frame_body()[:5]),
        f"its frame header at byte {FRAME} is too short",
    ),
    "six_bytes": (
        lambda: with_frame(frame_body()[:6]),
        f"its frame header at byte {FRAME} has the wrong length",
    ),
    "empty": (lambda: with_frame(b""), f"its frame header at byte {FRAME} is too short"),
    "twelve_bits": (
        lambda: with_frame(patched(frame_body(), 0, 12)),
        "its samples have 12 bits; TensorFlow decodes 8",
    ),
    "no_height": (
        lambda: with_frame(frame_body(height=0)),
        "its frame header declares an empty image",
    ),
    "no_width": (
        lambda: with_frame(frame_body(width=0)),
        "its frame header declares an empty image",
    ),
    "too_wide": (
        lambda: with_frame(frame_body(width=65501)),
        "it is 65501x24, beyond libjpeg's 65500 pixels",
    ),
    "too_tall": (
        lambda: with_frame(frame_body(height=65501)),
        "it is 32x65501, beyond libjpeg's 65500 pixels",
    ),
    "no_components": (
        lambda: with_frame(frame_body(components=())),
        "it has 0 colour components; TensorFlow decodes 1, 3 or 4",
    ),
    "two_components": (
        lambda: with_frame(frame_body(components=((1, 0x11, 0), (2, 0x11, 1)))),
        "it has 2 colour components; TensorFlow decodes 1, 3 or 4",
    ),
    "five_components": (
        lambda: with_frame(frame_body(components=tuple((i, 0x11, 0) for i in range(1, 6)))),
        "it has 5 colour components; TensorFlow decodes 1, 3 or 4",
    ),
    "a_byte_too_many": (
        lambda: with_frame(frame_body() + b"\x00"),
        f"its frame header at byte {FRAME} has the wrong length",
    ),
    "a_byte_too_few": (
        lambda: with_frame(frame_body()[:-1]),
        f"its frame header at byte {FRAME} has the wrong length",
    ),
    "quantization_table_4": (
        lambda: with_frame(frame_body(components=((1, 0x22, 4), (2, 0x11, 1), (3, 0x11, 1)))),
        "a component uses quantization table 4, beyond 0-3",
    ),
    "quantization_table_3_not_defined": (
        lambda: with_frame(frame_body(components=((1, 0x22, 0), (2, 0x11, 1), (3, 0x11, 3)))),
        "quantization table 3 is used, not defined",
    ),
    "rows_not_a_whole_multiple": (
        lambda: with_frame(frame_body(components=((1, 0x22, 0), (2, 0x11, 1), (3, 0x13, 1)))),
        "its components' sampling factors are not whole multiples of each other",
    ),
    "columns_not_a_whole_multiple": (
        lambda: with_frame(frame_body(components=((1, 0x31, 0), (2, 0x21, 1), (3, 0x11, 1)))),
        "its components' sampling factors are not whole multiples of each other",
    ),
    "eleven_blocks_in_a_unit": (
        lambda: with_frame(frame_body(components=((1, 0x42, 0), (2, 0x21, 1), (3, 0x21, 1)))),
        f"its scan at byte {SCAN:,} has more than 10 blocks in a unit",
    ),
}


@pytest.mark.parametrize("name", sorted(FRAME_REFUSALS))
def test_frame_headers_libjpeg_refuses_are_refused_with_these_words(name):
    make, what = FRAME_REFUSALS[name]
    assert refusal(make()) == corrupt(what)


@pytest.mark.parametrize("factors", [0x04, 0x40, 0x05, 0x50, 0x54, 0x45, 0x00])
def test_sampling_factors_beyond_1_to_4_are_refused(factors):
    data = edited(GREY, SOF0, lambda body: patched(body, 7, factors))
    assert refusal(data) == corrupt("a component's sampling factors are out of range")


def test_a_frame_header_notes_components_tables_and_sampling():
    header = JpegHeader()
    header.segment(SOF2, frame_body(components=((5, 0x21, 2), (7, 0x11, 3), (9, 0x11, 0))), 0)
    assert header.frame == {5: 2, 7: 3, 9: 0}
    assert header.sampling == {5: (2, 1), 7: (1, 1), 9: (1, 1)}
    assert (header.progressive, header.arithmetic) == (True, False)
    for marker, flags in [(SOF0, (False, False)), (SOF1, (False, False)), (SOF9, (False, True))]:
        header = JpegHeader()
        header.segment(marker, frame_body(), 0)
        assert (header.progressive, header.arithmetic) == flags
    header = JpegHeader()
    header.segment(SOF10, frame_body(), 0)
    assert (header.progressive, header.arithmetic) == (True, True)


# --- _quantization_tables --------------------------------------------------------------------

DQT_AT = where(BASELINE, DQT)  # 20


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (lambda body: patched(body, 0, 0x04), f"a quantization table at byte {DQT_AT} has index 4"),
        (
            lambda body: patched(body, 0, 0x0F),
            f"a quantization table at byte {DQT_AT} has index 15",
        ),
        (lambda body: body[:-1], f"its quantization segment at byte {DQT_AT} has the wrong length"),
        (
            lambda body: body + b"\x00",
            f"its quantization segment at byte {DQT_AT} has the wrong length",
        ),
        # Flagged 16-bit: 128 bytes of values, not 64.
        (
            lambda body: patched(body, 0, 0x10),
            f"its quantization segment at byte {DQT_AT} has the wrong length",
        ),
        (
            lambda body: body + b"\x11" + bytes(127),
            f"its quantization segment at byte {DQT_AT} has the wrong length",
        ),
    ],
)
def test_quantization_segments_libjpeg_refuses_are_refused(edit, what):
    assert refusal(edited(BASELINE, DQT, edit)) == corrupt(what)


def test_sixteen_bit_quantization_tables_are_read_to_their_end():
    def sixteen_bits(body: bytes) -> bytes:
        return bytes([0x10 | body[0]]) + b"".join(struct.pack(">H", value) for value in body[1:])

    data = edited(edited(BASELINE, DQT, sixteen_bits), DQT, sixteen_bits, nth=1)
    check_structure(data)


def test_a_scan_needs_its_components_quantization_tables():
    data = edited(BASELINE, DQT, lambda body: None)
    assert refusal(data) == corrupt("quantization table 0 is used, not defined")
    data = edited(BASELINE, DQT, lambda body: None, nth=1)
    assert refusal(data) == corrupt("quantization table 1 is used, not defined")


# --- _huffman_tables and huffman_segment ------------------------------------------------------

DHT_AT = where(BASELINE, DHT)  # 177
STANDARD_DC = body_of(BASELINE, DHT, 0)


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"\x00" * 16, f"its Huffman segment at byte {DHT_AT} has the wrong length"),
        (STANDARD_DC + b"\x00", f"its Huffman segment at byte {DHT_AT} has the wrong length"),
        (b"\x20" + STANDARD_DC[1:], f"a Huffman table at byte {DHT_AT} has class 2, index 0"),
        (b"\x04" + STANDARD_DC[1:], f"a Huffman table at byte {DHT_AT} has class 0, index 4"),
        (STANDARD_DC[:-1], f"a Huffman table at byte {DHT_AT} is bogus"),
        (
            huffman_table(1, 0, [0] * 14 + [255, 2], bytes(257)),
            f"a Huffman table at byte {DHT_AT} is bogus",
        ),
        (
            huffman_table(0, 0, [2], b"\x00\x01"),
            f"a Huffman table at byte {DHT_AT} is bogus (its codes do not fit)",
        ),
        (
            huffman_table(0, 0, [1, 2], b"\x00\x01\x02"),
            f"a Huffman table at byte {DHT_AT} is bogus (its codes do not fit)",
        ),
        (
            huffman_table(0, 0, [1, 1], b"\x00\x10"),
            f"a DC Huffman table at byte {DHT_AT} has a symbol above 15",
        ),
    ],
)
def test_huffman_segments_libjpeg_refuses_are_refused(body, what):
    assert refusal(edited(BASELINE, DHT, lambda _: body)) == corrupt(what)


def test_huffman_codes_fit_up_to_the_all_ones_code():
    # Lengths 1 and 2: 0, 10; the all-ones 11 left unused. And 16 bits of 1 + 2 + ... codes.
    tables = [
        huffman_table(0, 0, [1, 1], b"\x00\x01"),
        huffman_table(1, 0, [0, 3], b"\x00\x01\x02"),
        huffman_table(1, 1, [0] * 15 + [255], bytes(range(255))),
        huffman_table(0, 1, [], b""),
    ]
    header = JpegHeader()
    header.segment(DHT, b"".join(tables), 0)
    assert header.huffman == {(0, 0), (1, 0), (1, 1), (0, 1)}
    assert header.bogus_huffman == {}
    # Codes that do not fit: noted, refused only by a scan that uses the table.
    header.segment(DHT, huffman_table(1, 2, [0, 4], b"\x00\x01\x02\x03"), 1234)
    assert header.bogus_huffman == {
        (1, 2): "a Huffman table at byte 1,234 is bogus (its codes do not fit)"
    }


# --- _check_huffman_tables_used ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tables", "what"),
    [
        (0x20, "DC Huffman table 2 is used, not defined"),
        (0x02, "AC Huffman table 2 is used, not defined"),
        (0x30, "DC Huffman table 3 is used, not defined"),
        (0x03, "AC Huffman table 3 is used, not defined"),
        (0x40, f"its scan at byte {SCAN:,} uses Huffman table 4"),
        (0x04, f"its scan at byte {SCAN:,} uses Huffman table 4"),
        (0x05, f"its scan at byte {SCAN:,} uses Huffman table 5"),
        (0x4F, f"its scan at byte {SCAN:,} uses Huffman table 15"),
        (0xF4, f"its scan at byte {SCAN:,} uses Huffman table 15"),
    ],
)
def test_a_sequential_scan_needs_both_its_huffman_tables(tables, what):
    data = with_scan(scan_body(((1, 0x00), (2, tables), (3, 0x11))))
    assert refusal(data) == corrupt(what)


def test_a_sequential_scan_falls_back_to_the_standard_tables_0_and_1():
    for tables in (0x00, 0x01, 0x10, 0x11):
        data = with_scan(
            scan_body(((1, tables), (2, tables), (3, tables))), without_huffman_tables(BASELINE)
        )
        check_structure(data)


def test_a_defined_huffman_table_beyond_the_standard_ones_is_found():
    extra = inserted(BASELINE, SOS, DHT, b"\x02" + STANDARD_DC[1:])
    check_structure(with_scan(scan_body(((1, 0x20), (2, 0x11), (3, 0x11))), extra))
    assert refusal(with_scan(scan_body(((1, 0x02), (2, 0x11), (3, 0x11))), extra)) == corrupt(
        "AC Huffman table 2 is used, not defined"
    )


def _progressive_header(*huffman) -> JpegHeader:
    header = JpegHeader()
    header.segment(SOF2, frame_body(), 0)
    header.segment(DQT, b"\x00" + bytes(64) + b"\x01" + bytes(64), 0)
    for kind, index in huffman:
        header.segment(DHT, huffman_table(kind, index, [1], b"\x00"), 0)
    return header


@pytest.mark.parametrize(
    ("components", "start", "end", "approximation", "huffman", "what"),
    [
        # DC first pass: its DC table, no defaults in a progressive file.
        (((1, 0x00),), 0, 0, 0x00, [], "DC Huffman table 0 is used, not defined"),
        (((1, 0x01),), 0, 0, 0x00, [(1, 1)], "DC Huffman table 0 is used, not defined"),
        (((1, 0x10),), 0, 0, 0x01, [(0, 0)], "DC Huffman table 1 is used, not defined"),
        # DC refinement: no table.
        (((1, 0x33),), 0, 0, 0x10, [], None),
        (((1, 0x33), (2, 0x33), (3, 0x33)), 0, 0, 0x21, [], None),
        (((1, 0x10), (2, 0x00), (3, 0x00)), 0, 0, 0x00, [(0, 0), (0, 1)], None),
        # AC scans: their AC table only.
        (((1, 0x32),), 1, 5, 0x00, [], "AC Huffman table 2 is used, not defined"),
        (((1, 0x32),), 1, 5, 0x00, [(1, 2)], None),
        (((1, 0x21),), 6, 63, 0x21, [(1, 2)], "AC Huffman table 1 is used, not defined"),
        (((1, 0x20),), 1, 63, 0x10, [(1, 0)], None),
    ],
)
def test_a_progressive_scan_needs_the_huffman_tables_its_pass_uses(
    components, start, end, approximation, huffman, what
):
    header = _progressive_header(*huffman)
    body = scan_body(components, start, end, approximation)
    if what is None:
        header.segment(SOS, body, 0)
    else:
        with pytest.raises(InputError) as caught:
            header.segment(SOS, body, 0)
        assert caught.value.message == CORRUPT + what


# DHT segments defining DC table 2 (no scan of BASELINE uses it) with codes libjpeg cannot build,
# and what is wrong with each (libjpeg-turbo finds it when a scan starts with the table).
UNUSED_BOGUS_TABLES = {
    "codes_do_not_fit": (
        huffman_table(0, 2, [3], b"\x00\x01\x02"),
        "a Huffman table at byte {:,} is bogus (its codes do not fit)",
    ),
    "dc_symbol_above_15": (
        huffman_table(0, 2, [1], b"\x10"),
        "a DC Huffman table at byte {:,} has a symbol above 15",
    ),
}
BASELINE_DHTS = sum(1 for marker, _ in split(BASELINE)[0] if marker == DHT)


@pytest.mark.parametrize(("table", "_"), UNUSED_BOGUS_TABLES.values(), ids=UNUSED_BOGUS_TABLES)
def test_a_bogus_huffman_table_no_scan_uses_is_accepted_as_tensorflow_decodes_it(tf, table, _):
    data = inserted(BASELINE, SOS, DHT, table)
    check_structure(data)
    assert np.array_equal(tf.io.decode_jpeg(data).numpy(), tf.io.decode_jpeg(BASELINE).numpy())


@pytest.mark.parametrize(("table", "what"), UNUSED_BOGUS_TABLES.values(), ids=UNUSED_BOGUS_TABLES)
def test_a_bogus_huffman_table_a_scan_uses_is_refused_as_tensorflow_refuses_it(tf, table, what):
    bogus = inserted(BASELINE, SOS, DHT, table)
    # The scan's first component now takes its DC codes from table 2.
    data = with_scan(patched(body_of(bogus, SOS), 2, 0x20), bogus)
    assert refusal(data) == corrupt(what.format(where(data, DHT, BASELINE_DHTS)))
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_jpeg(data)


def test_the_last_definition_of_a_huffman_table_is_the_one_a_scan_uses():
    good = body_of(BASELINE, DHT, 0)  # DC table 0, used by the first component
    bogus = huffman_table(0, 0, [3], b"\x00\x01\x02")
    # Bogus, then redefined good before the scan: accepted.
    check_structure(inserted(BASELINE, SOS, DHT, bogus + good))
    # Good, then redefined bogus: refused.
    data = inserted(BASELINE, SOS, DHT, good + bogus)
    assert refusal(data)[0] == "CorruptImage"
    assert "is bogus (its codes do not fit)" in refusal(data)[1]


def test_a_progressive_file_without_huffman_tables_is_refused_as_tensorflow_refuses_it(tf):
    segments, rest = split(PROGRESSIVE)
    data = join([(m, b) for m, b in segments if m != DHT], rest)
    assert refusal(data) == corrupt("DC Huffman table 0 is used, not defined")
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_jpeg(data)


# --- _scan -------------------------------------------------------------------------------------

SCAN_REFUSALS = {
    "before_the_frame": (
        lambda: join([(SOS, body_of(BASELINE, SOS))] + split(BASELINE)[0][:-1], split(BASELINE)[1]),
        "its image data comes before its frame header",
    ),
    "empty": (lambda: with_scan(b""), f"its scan header at byte {SCAN:,} has the wrong length"),
    "no_components": (
        lambda: with_scan(scan_body(())),
        f"its scan header at byte {SCAN:,} has the wrong length",
    ),
    "five_components": (
        lambda: with_scan(scan_body(RGB_SCAN + ((1, 0), (2, 0)))),
        f"its scan header at byte {SCAN:,} has the wrong length",
    ),
    "a_byte_too_many": (
        lambda: with_scan(scan_body(RGB_SCAN) + b"\x00"),
        f"its scan header at byte {SCAN:,} has the wrong length",
    ),
    "a_byte_too_few": (
        lambda: with_scan(scan_body(RGB_SCAN)[:-1]),
        f"its scan header at byte {SCAN:,} has the wrong length",
    ),
    "unknown_component": (
        lambda: with_scan(scan_body(((1, 0x00), (2, 0x11), (4, 0x11)))),
        f"its scan at byte {SCAN:,} names component 4",
    ),
    "component_twice": (
        lambda: with_scan(scan_body(((1, 0x00), (2, 0x11), (2, 0x11)))),
        f"its scan at byte {SCAN:,} names component 2",
    ),
    "sequential_start": (
        lambda: with_scan(scan_body(RGB_SCAN, start=1)),
        "a sequential scan has progressive parameters",
    ),
    "sequential_end": (
        lambda: with_scan(scan_body(RGB_SCAN, end=62)),
        "a sequential scan has progressive parameters",
    ),
    "sequential_high": (
        lambda: with_scan(scan_body(RGB_SCAN, approximation=0x10)),
        "a sequential scan has progressive parameters",
    ),
    "sequential_low": (
        lambda: with_scan(scan_body(RGB_SCAN, approximation=0x01)),
        "a sequential scan has progressive parameters",
    ),
    "progressive_frame_sequential_scan": (
        lambda: with_frame(body_of(BASELINE, SOF0), marker=SOF2),
        f"its progressive scan at byte {SCAN:,} has invalid parameters",
    ),
    "sequential_frame_progressive_scan": (
        lambda: with_frame(body_of(PROGRESSIVE, SOF2), PROGRESSIVE, marker=SOF0),
        "a sequential scan has progressive parameters",
    ),
}


@pytest.mark.parametrize("name", sorted(SCAN_REFUSALS))
def test_scan_headers_libjpeg_refuses_are_refused_with_these_words(name):
    make, what = SCAN_REFUSALS[name]
    assert refusal(make()) == corrupt(what)


def test_an_arithmetic_scan_checks_its_components_but_not_huffman_tables():
    data = without_huffman_tables(with_frame(body_of(BASELINE, SOF0), marker=SOF9))
    assert refusal(with_scan(scan_body(((1, 0xFF), (2, 0x11), (5, 0x11))), data)) == corrupt(
        f"its scan at byte {where(data, SOS):,} names component 5"
    )
    assert refusal(with_scan(scan_body(RGB_SCAN, start=1), data)) == corrupt(
        "a sequential scan has progressive parameters"
    )


@pytest.mark.parametrize(
    ("components", "start", "end", "approximation", "valid"),
    [
        (((1, 0x00), (2, 0x01), (3, 0x01)), 0, 0, 0x00, True),
        (((1, 0x00),), 0, 0, 0x0D, True),
        (((1, 0x00),), 0, 0, 0x0E, False),  # a point transform beyond 13
        (((1, 0x00),), 0, 0, 0xEF, False),
        (((1, 0x00),), 0, 1, 0x00, False),  # a DC scan has only the DC coefficient
        (((1, 0x00),), 0, 0, 0x21, True),
        (((1, 0x00),), 0, 0, 0x20, False),  # a refinement must lower the point transform by 1
        (((1, 0x00),), 0, 0, 0x22, False),
        (((1, 0x00),), 0, 0, 0x10, True),
        (((1, 0x00),), 1, 63, 0x00, True),
        (((1, 0x00),), 5, 5, 0x00, True),
        (((1, 0x00),), 63, 63, 0x00, True),
        (((1, 0x00),), 6, 5, 0x00, False),  # a band that ends before it starts
        (((1, 0x00),), 1, 64, 0x00, False),
        (((1, 0x00),), 64, 64, 0x00, False),
        (((1, 0x00), (2, 0x00)), 1, 63, 0x00, False),  # an AC scan has one component
        (((1, 0x00),), 1, 63, 0x32, True),
        (((1, 0x00),), 1, 63, 0x31, False),
        (((1, 0x00),), 1, 63, 0x0E, False),
        (((1, 0x00),), 1, 63, 0x0D, True),
    ],
)
def test_progressive_scan_parameters_are_held_to_libjpegs_rules(
    components, start, end, approximation, valid
):
    header = _progressive_header((0, 0), (1, 0))
    body = scan_body(components, start, end, approximation)
    if valid:
        header.segment(SOS, body, 0)
        return
    with pytest.raises(InputError) as caught:
        header.segment(SOS, body, 4321)
    assert (
        caught.value.message
        == CORRUPT + "its progressive scan at byte 4,321 has invalid parameters"
    )


def test_a_progressive_scan_with_bad_parameters_in_a_file_is_refused(tf):
    segments, rest = split(PROGRESSIVE)
    body = bytearray(segments[-1][1])
    body[-1] = 0x20  # Ah 2, Al 0: a refinement that does not lower the point transform by 1
    data = join(segments[:-1] + [(SOS, bytes(body))], rest)
    assert refusal(data) == corrupt(
        f"its progressive scan at byte {PROGRESSIVE_SCAN:,} has invalid parameters"
    )
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_jpeg(data)


def test_a_scan_of_one_component_has_one_block_per_unit_whatever_its_sampling():
    header = _progressive_header((0, 0), (1, 0))
    header.sampling[1] = (4, 4)
    header.segment(SOS, scan_body(((1, 0x00),), 1, 63, 0), 0)
    with pytest.raises(InputError) as caught:
        header.segment(SOS, scan_body(((1, 0x00), (2, 0x00)), 0, 0, 0), 99)
    assert caught.value.message == CORRUPT + "its scan at byte 99 has more than 10 blocks in a unit"


# --- _arithmetic_conditioning ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"\x00", "has the wrong length"),
        (b"\x00\x10\x01", "has the wrong length"),
        (b"\x20\x11", "names table 32"),
        (b"\x00\x10\xff\x11", "names table 255"),
        (b"\x01\x05", "has a bad value"),
        (b"\x10\x05\x0f\x01", "has a bad value"),
        (b"\x00\x10\x00\x0f", "has a bad value"),
    ],
)
def test_arithmetic_conditioning_libjpeg_refuses_is_refused(body, what):
    data = inserted(BASELINE, SOS, DAC, body)
    offset = where(data, DAC)
    assert refusal(data) == corrupt(
        f"its arithmetic conditioning segment at byte {offset:,} {what}"
    )
