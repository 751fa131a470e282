"""Images the benchmark's fuzzing (benchmarks/hostile.py) found accepted wrongly, and the rules
of TensorFlow's decoders they showed: libjpeg-turbo's arithmetic conditioning (DAC) segments,
sampling factors and marker set, and the size TensorFlow gives a GIF (its largest frames, not
its logical screen). tests/data/fuzzed_images holds the files as the fuzzing made them."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from conftest import make_image
from PIL import Image

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.integrity import check_structure
from recordforge.transforms.core.images.probe import probe_image_bytes

FUZZED = Path(__file__).parent / "data" / "fuzzed_images"


def _accepted(data: bytes):
    """The probe's facts when the probe and the writer's structure checks accept `data`, else
    the InputError's kind."""
    try:
        facts = probe_image_bytes(data)
        check_structure(data)
    except InputError as error:
        return error.kind
    return facts


def _tensorflow_shape(tf, data: bytes):
    try:
        return tuple(tf.io.decode_image(data, expand_animations=False).shape)
    except tf.errors.InvalidArgumentError:
        return None


@pytest.mark.parametrize(
    "name",
    ["jpeg_bad_dac_odd_length.jpeg", "jpeg_bad_dac_baseline.jpeg", "jpeg_fractional_sampling.jpeg"],
)
def test_fuzzed_jpegs_tensorflow_cannot_decode_are_refused(tf, name):
    data = (FUZZED / name).read_bytes()
    assert _tensorflow_shape(tf, data) is None
    assert _accepted(data) == "CorruptImage"


@pytest.mark.parametrize(
    "name", ["gif_frame_beyond_screen.gif", "gif_screen_taller_than_frame.gif"]
)
def test_fuzzed_gifs_get_the_size_tensorflow_decodes_them_to(tf, name):
    data = (FUZZED / name).read_bytes()
    facts = _accepted(data)
    assert (facts.height, facts.width, facts.channels) == _tensorflow_shape(tf, data) == (64, 96, 3)


# --- JPEG: the rules behind those files, on files made for them ------------------------------


def _jpeg(tmp_path, **save) -> bytes:
    return make_image(tmp_path / "a.jpg", "JPEG", size=(64, 48), **save)


def _segments(data: bytes) -> list[tuple[int, int]]:
    """(marker, offset) of the header segments up to the first scan."""
    found, offset = [], 2
    while True:
        marker, length = data[offset + 1], struct.unpack_from(">H", data, offset + 2)[0]
        found.append((marker, offset))
        if marker == 0xDA:
            return found
        offset += 2 + length


def _with_segment(data: bytes, marker: int, body: bytes) -> bytes:
    """`data` with a segment inserted just before its first scan."""
    scan = dict(_segments(data))[0xDA]
    segment = bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body
    return data[:scan] + segment + data[scan:]


def _with_sampling(data: bytes, factors: list[int]) -> bytes:
    """`data` with its components' sampling factors (0xHV each) set in its frame header."""
    frame = dict(_segments(data))[0xC0]
    out = bytearray(data)
    for index, factor in enumerate(factors):
        out[frame + 11 + 3 * index] = factor
    return bytes(out)


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (b"\x00\x10", False),  # DC table 0: lower bound 0, upper 1
        (b"\x10\x05", False),  # AC table 0: any value
        (b"\x01\x05", True),  # DC table 1: lower bound 5 above upper 0
        (b"\x20\x11", True),  # table 32: there are 32 (16 DC, 16 AC)
        (b"\x00\x10\x01", True),  # a half pair: the wrong length
    ],
)
def test_a_jpegs_arithmetic_conditioning_segment_is_checked_as_libjpeg_does(
    tmp_path, tf, body, refused
):
    data = _with_segment(_jpeg(tmp_path), 0xCC, body)  # read even in a Huffman-coded file
    assert (_tensorflow_shape(tf, data) is None) == refused
    assert (_accepted(data) == "CorruptImage") == refused


@pytest.mark.parametrize(
    ("factors", "refused"),
    [
        ([0x22, 0x11, 0x11], False),  # 4:2:0
        ([0x41, 0x21, 0x11], False),  # whole multiples: 4 of 2 and of 1
        ([0x22, 0x11, 0x13], True),  # 2 rows of 3: not a whole multiple
        ([0x31, 0x21, 0x11], True),  # 3 columns of 2
        ([0x22, 0x22, 0x22], True),  # 12 blocks in a unit; libjpeg takes 10 at most
    ],
)
def test_a_jpegs_sampling_factors_are_held_to_what_libjpeg_can_upsample(
    tmp_path, tf, factors, refused
):
    data = _with_sampling(_jpeg(tmp_path, subsampling=0), factors)
    # Different factors change how the scan's data is read: libjpeg only warns about that.
    assert (_tensorflow_shape(tf, data) is None) == refused
    assert (_accepted(data) == "CorruptImage") == refused


@pytest.mark.parametrize("marker", [0xC8, 0xDE, 0xDF, 0xF0, 0xFD, 0x50])
def test_a_marker_libjpeg_does_not_know_is_refused(tmp_path, tf, marker):
    data = _with_segment(_jpeg(tmp_path), marker, b"\x00\x00")
    assert _tensorflow_shape(tf, data) is None
    assert _accepted(data) == "CorruptImage"


# --- GIF ---------------------------------------------------------------------------------------


def _gif(frames: list[tuple[int, int]]) -> bytes:
    """An animated GIF whose frames have these sizes (each placed at the top left)."""
    images = [Image.new("P", size, index + 1) for index, size in enumerate(frames)]
    for image in images:
        image.putpalette(list(range(256)) * 3)
    out = io.BytesIO()
    images[0].save(out, "GIF", save_all=True, append_images=images[1:], optimize=False)
    return out.getvalue()


def _with_screen(data: bytes, width: int, height: int) -> bytes:
    return data[:6] + struct.pack("<HH", width, height) + data[10:]


@pytest.mark.parametrize(
    ("frames", "screen"),
    [
        ([(40, 30)], (200, 30)),  # a logical screen wider than the image
        ([(40, 30)], (10, 10)),  # one smaller
        ([(40, 30), (20, 50)], None),  # frames of different shapes: the widest and the tallest
    ],
)
def test_a_gif_is_as_large_as_tensorflow_decodes_it(tf, frames, screen):
    data = _gif(frames)
    if screen:
        data = _with_screen(data, *screen)
    facts = _accepted(data)
    assert (facts.height, facts.width, facts.channels) == _tensorflow_shape(tf, data)


def test_a_gif_whose_first_frame_has_no_width_is_refused(tf):
    data = bytearray(_gif([(40, 30), (20, 20)]))
    first = data.index(b"\x2c\x00\x00\x00\x00\x28\x00\x1e\x00")  # its descriptor: 40x30
    data[first + 5 : first + 7] = b"\x00\x00"
    assert _tensorflow_shape(tf, bytes(data)) is None
    assert _accepted(bytes(data)) == "CorruptImage"
