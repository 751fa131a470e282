"""The PNG check inflates with zlib-ng (transforms/core/images/integrity.py): its verdicts must
be those of zlib, which libpng (TensorFlow's PNG decoder) inflates with.

Damaged zlib streams and damaged PNG files are checked twice, once as the writer does and once
with the standard library's zlib in zlib-ng's place: every verdict, message included, and every
count of inflated bytes must agree. ISA-L, which was measured faster, fails this: it accepts a
stream whose Huffman distance codes zlib refuses ("invalid distances set").
"""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images import integrity


def _verdict(data: bytes) -> tuple[str, str] | None:
    try:
        integrity.check_structure(data)
    except InputError as error:
        return error.kind, error.message
    return None


def _inflated(module, stream: bytes, piece: int) -> tuple:
    """(inflated bytes, at the stream's end) as the check inflates `piece` bytes at a time, or
    the error's words."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(integrity, "zlib_ng", module)  # the errors the check catches, too
        patch.setattr(integrity, "_INFLATE_PIECE", piece)
        inflater = module.decompressobj()
        try:
            return integrity._inflate(inflater, memoryview(stream)), inflater.eof
        except InputError as error:
            return (error.message,)


@st.composite
def damaged(draw, data: bytes, *, skip: int = 0) -> bytes:
    """`data` with bits flipped, bytes dropped or doubled, or cut short, after byte `skip`."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        if len(out) <= skip + 1:
            break
        at = draw(st.integers(skip, len(out) - 1))
        how = draw(st.sampled_from(["flip", "drop", "double", "cut"]))
        if how == "flip":
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "drop":
            del out[at : at + draw(st.integers(1, 4))]
        elif how == "double":
            out[at:at] = out[at : at + draw(st.integers(1, 4))]
        else:
            del out[at:]
    return bytes(out)


_RAW = st.one_of(
    st.binary(max_size=600),
    st.integers(0, 20_000).map(bytes),
    st.tuples(st.binary(min_size=1, max_size=8), st.integers(1, 2_000)).map(lambda t: t[0] * t[1]),
)


def test_damage_found_while_draining_held_back_output_is_a_damaged_image():
    # Found by the test below: all of the stream is taken in without an error, and the damage
    # shows only when the output held back is drained (an uncaught zlib error, before).
    stream = b"x\x9cc`\x18\x05\xa3`\x14\x0c\x00\x00\x03\xc4\x00\x01"
    verdict = _inflated(integrity.zlib_ng, stream, 7)
    assert verdict == _inflated(zlib, stream, 7)
    assert verdict == (
        "the PNG file is corrupt: its compressed image data is damaged "
        "(Error -3 while decompressing data: invalid distance too far back)",
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), _RAW, st.sampled_from([0, 1, 6, 9]), st.sampled_from([7, 1 << 20]))
def test_a_damaged_stream_inflates_as_zlib_inflates_it(data, raw, level, piece):
    stream = data.draw(damaged(zlib.compress(raw, level)))
    with_zlib = _inflated(zlib, stream, piece)
    assert _inflated(integrity.zlib_ng, stream, piece) == with_zlib


def _photo_png(seed: int) -> bytes:
    """A PNG of smooth colour with grain, as photographs compress (mostly literals)."""
    rng = random.Random(seed)
    width, height = rng.randrange(8, 90), rng.randrange(8, 60)
    image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    noise = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    image = Image.blend(image, noise, 0.25)
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=rng.choice([1, 6, 9]))
    return buffer.getvalue()


def _with_idat_checksums(data: bytes) -> bytes:
    """The PNG with every chunk's CRC made right again, so damage reaches the inflater."""
    out, offset = bytearray(data[:8]), 8
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        end = offset + 12 + length
        if end > len(data):
            break
        body = data[offset + 4 : end - 4]
        out += data[offset : end - 4] + struct.pack(">I", zlib.crc32(body))
        offset = end
    return bytes(out + data[offset:])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(0, 10_000))
def test_a_damaged_png_gets_the_verdict_it_gets_with_zlib(data, seed):
    png = _photo_png(seed)
    broken = _with_idat_checksums(data.draw(damaged(png, skip=33)))
    with_zlib_ng = _verdict(broken)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(integrity, "zlib_ng", zlib)
        assert _verdict(broken) == with_zlib_ng


def test_the_check_inflates_with_zlib_ng():
    # The verdicts above compare two modules only if the check uses the one it says it does.
    inflater = integrity.zlib_ng.decompressobj()
    assert type(inflater).__module__.startswith("zlib_ng")
    assert integrity.zlib_ng is not zlib
