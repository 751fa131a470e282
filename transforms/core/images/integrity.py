"""Damage an image's header does not show, found from the whole file's structure, cheaply.

The probe reads a header and the file's end, so a file damaged in its middle (a disk or copy
error, bytes overwritten) passes it, and then fails TensorFlow's decoder in the middle of a
training run. The writer reads every byte of the file anyway; these checks walk the bytes it
read, without decoding pixels:

- PNG: every chunk's CRC-32 (zlib.crc32), chunks that fit the file up to IEND, and the image
  data a complete zlib stream (inflated in pieces, the output thrown away; libpng rejects a
  stream that ends early). It is inflated by zlib-ng, zlib's faster fork, whose inflate checks
  a stream as zlib does (libpng's, TensorFlow's) with the same messages: the largest cost of
  checking a PNG (docs/performance.md). ISA-L, faster still, accepts streams zlib refuses.
- JPEG: the marker segments up to the end of image (EOI), their lengths inside the file, and
  the entropy-coded data of every scan free of markers that cannot occur there (a 0xFF byte is
  followed by a stuffed 0x00, a restart marker, or the next segment's marker, which must be one
  libjpeg knows), and every header segment as libjpeg checks it (jpeg_segments). The 0xFF bytes
  are found with numpy in one pass over the file.
- GIF: every block and data sub-block complete (as for the probe's frames).
- WebP: the RIFF chunks fill the file exactly and hold one bitstream chunk.
- BMP: the pixel array the header declares fits in the file.

`check_pixels` decodes every pixel instead (`--check-pixels`), for what only a decoder finds.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image
from zlib_ng import zlib_ng

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images import formats as image_formats
from recordforge.transforms.core.images.jpeg_segments import JpegHeader
from recordforge.transforms.core.images.probe import (
    DEFAULT_MAX_PIXELS,
    ImageFacts,
    decode_image_bytes,
    probe_image_bytes,
)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_INFLATE_PIECE = 1 << 20  # inflated bytes held at once while a PNG's stream is checked


def image_format(data: bytes) -> str | None:
    """The format of an image's bytes by their signature, or None."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == _PNG_SIGNATURE:
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    return None


def check_structure(data: bytes) -> None:
    """Check an image file's structure (see the module docstring).

    Raises:
        InputError: `CorruptImage` or `TruncatedImage`, saying where.
    """
    fmt = image_format(data)
    if fmt is None:
        raise InputError("CorruptImage", "the file is no longer an image of a supported format")
    _CHECKS[fmt](data)


def check_pixels(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
    """Decode every pixel (every frame of a GIF), as TensorFlow would.

    Raises:
        InputError: the kinds of transforms.core.images.probe.decode_image_bytes.
    """
    decode_image_bytes(data, max_pixels=max_pixels)


def check_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageFacts:
    """Judge an image's bytes as `convert --check-pixels` judges a file before writing it: the
    probe (its header, under `max_pixels`, before anything is decoded), `check_structure`, then
    `check_pixels`. `verify --deep` judges stored images so, to agree with the converter (and
    with TensorFlow, whose decoders these checks follow).

    Returns:
        The image's facts, from its decoded pixels.

    Raises:
        InputError: as the probe, `check_structure` or `check_pixels` would.
    """
    probe_image_bytes(data, max_pixels=max_pixels)
    check_structure(data)
    return decode_image_bytes(data, max_pixels=max_pixels)


def _corrupt(fmt: str, what: str) -> InputError:
    return InputError("CorruptImage", f"the {fmt.upper()} file is corrupt: {what}")


def _truncated(fmt: str, what: str) -> InputError:
    return InputError("TruncatedImage", f"the {fmt.upper()} file is truncated: {what}")


# --- PNG ---------------------------------------------------------------------------------------


def _check_png(data: bytes) -> None:
    view = memoryview(data)
    size = len(data)
    offset = len(_PNG_SIGNATURE)
    inflater = zlib_ng.decompressobj()
    inflated = 0
    expected = _png_raw_size(data)
    if expected:
        image_formats.check_png_size(*struct.unpack_from(">II", data, 16))
    chunks = image_formats.PngChunks()  # libpng's rules for the order of chunks
    in_image_data = False
    while True:
        if offset + 12 > size:
            raise _truncated("png", f"it ends inside a chunk header (at byte {offset:,})")
        length, kind = struct.unpack_from(">I4s", data, offset)
        end = offset + 12 + length
        if end > size:
            raise _truncated(
                "png", f"its {_chunk_name(kind)} chunk at byte {offset:,} runs past the file's end"
            )
        (stored,) = struct.unpack_from(">I", data, end - 4)
        if zlib.crc32(view[offset + 4 : end - 4]) != stored:
            raise _corrupt(
                "png",
                f"the CRC of its {_chunk_name(kind)} chunk at byte {offset:,} does not match "
                "its data",
            )
        chunks.add(kind, length, offset, data[offset + 8 : end - 4] if kind == b"IHDR" else b"")
        if kind == b"IDAT":
            inflated += _inflate(inflater, view[offset + 8 : end - 4])
            in_image_data = True
            offset = end
            continue
        if kind == b"IEND":
            break
        if in_image_data and not inflater.eof:
            # libpng reads the IDAT chunks of the stream in a row: "Not enough image data".
            raise _corrupt(
                "png",
                f"its image data is split: a {_chunk_name(kind)} chunk at byte {offset:,} comes "
                "before the end of its compressed stream",
            )
        in_image_data = False
        offset = end
    if not inflated and not inflater.eof:
        raise _corrupt("png", "it has no image data (IDAT)")
    if not inflater.eof:
        raise _truncated("png", "its compressed image data ends before the end of its stream")
    if inflated < expected:
        raise _truncated(
            "png", f"its image data holds {inflated:,} bytes where its size needs {expected:,}"
        )


def _inflate(inflater, data: memoryview) -> int:
    """Feed compressed data to the inflater, dropping its output a piece at a time; returns
    how many bytes it gave. Data after the stream's end is ignored, as libpng does."""
    pending, given = data, 0
    try:
        while pending and not inflater.eof:
            given += len(inflater.decompress(pending, _INFLATE_PIECE))
            pending = inflater.unconsumed_tail
        # Output still held back (the input is all used): drain it in pieces too. The damage
        # may show only here, in the output held back.
        while not inflater.eof and (piece := inflater.decompress(b"", _INFLATE_PIECE)):
            given += len(piece)
    except zlib_ng.error as error:
        raise _corrupt("png", f"its compressed image data is damaged ({error})") from None
    return given


# Adam7 passes: (first column, first row, column step, row step).
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_raw_size(data: bytes) -> int:
    """The bytes a PNG's image data inflates to (filter byte and pixels of every row), from its
    IHDR; 0 when the header is not one (the probe has read it: it is)."""
    if len(data) < 29 or data[12:16] != b"IHDR":
        return 0
    width, height, bits, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    samples = _PNG_SAMPLES.get(colour, 0)

    def rows(columns: int, count: int) -> int:
        return count * (1 + (columns * samples * bits + 7) // 8) if columns and count else 0

    if not interlace:
        return rows(width, height)
    return sum(
        rows((width - x + dx - 1) // dx, (height - y + dy - 1) // dy) for x, y, dx, dy in _ADAM7
    )


_chunk_name = image_formats.png_chunk_name


# --- JPEG --------------------------------------------------------------------------------------

_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7: no length
_SOS, _EOI, _SOI = 0xDA, 0xD9, 0xD8
# Markers libjpeg reads after SOI (jdmarker.c, read_markers); any other stops it with "Unsupported
# marker type": the reserved ones (0x02-0xBF), DHP and EXP (0xDE, 0xDF) and JPG0-13 (0xF0-0xFD).
_KNOWN_MARKERS = frozenset(
    {0x01, *range(0xC0, 0xD8), _EOI, _SOS, 0xDB, 0xDC, 0xDD, *range(0xE0, 0xF0), 0xFE}
)


def _check_jpeg(data: bytes) -> None:
    size = len(data)
    scan_ends = _ScanEnds(data)
    header = JpegHeader()
    offset, scans = 2, 0
    while True:
        if offset >= size:
            raise _truncated("jpeg", "it ends before its end-of-image marker")
        if data[offset] != 0xFF:
            raise _corrupt("jpeg", f"no marker where one belongs (at byte {offset:,})")
        while offset < size and data[offset] == 0xFF:  # fill bytes before a marker
            offset += 1
        if offset >= size:
            raise _truncated("jpeg", "it ends before its end-of-image marker")
        marker = data[offset]
        offset += 1
        if marker == _EOI:
            if not scans:
                raise _corrupt("jpeg", "it ends before any image data")
            return  # data after the end of the image (as camera "motion photos" add) is not it
        if marker in _STANDALONE:
            continue
        if marker not in _KNOWN_MARKERS:
            raise _corrupt("jpeg", f"an invalid marker 0xFF{marker:02X} at byte {offset - 2:,}")
        if offset + 2 > size:
            raise _truncated("jpeg", "it ends inside a segment header")
        length = (data[offset] << 8) | data[offset + 1]
        if length < 2:
            raise _corrupt("jpeg", f"a segment of impossible length at byte {offset - 2:,}")
        if offset + length > size:
            raise _truncated("jpeg", f"a segment at byte {offset - 2:,} runs past the file's end")
        header.segment(marker, data[offset + 2 : offset + length], offset - 2)
        offset += length
        if marker == _SOS:
            scans += 1
            end = scan_ends.after(offset)
            if end is None:
                raise _truncated("jpeg", "its image data ends without an end-of-image marker")
            offset = end


class _ScanEnds:
    """Where a scan's entropy-coded data ends: at the first 0xFF byte that starts a marker, one
    followed by neither a stuffed 0x00, a restart marker (0xD0-0xD7), nor another 0xFF (a fill
    byte; the marker starts at the run's last 0xFF).

    One mask over the file marks the 0xFF bytes not followed by 0x00; `argmax` finds the first
    after a scan's start (it stops there), and restart markers and fill bytes are stepped over.
    Finding every 0xFF's position instead (`flatnonzero`) costs more, as nearly all of them are
    stuffed bytes. After a few steps a scan's remaining candidates are filtered at once, so a
    file of many restart markers costs no more than that.
    """

    _ONE_BY_ONE = 16

    def __init__(self, data: bytes) -> None:
        self._bytes = np.frombuffer(data, dtype=np.uint8)
        self._candidates = self._bytes[:-1] == 0xFF
        # In place: a third whole-file array costs more than the comparison (fresh pages).
        self._candidates &= self._bytes[1:] != 0

    def after(self, offset: int) -> int | None:
        """The position of the marker ending the scan whose data starts at `offset`, or None
        when the file ends first."""
        for _ in range(self._ONE_BY_ONE):
            rest = self._candidates[offset:]
            found = int(rest.argmax()) if len(rest) else 0
            if not len(rest) or not rest[found]:
                return None
            position = offset + found
            if not _STEPPED_OVER[self._bytes[position + 1]]:
                return position
            offset = position + 1
        positions = np.flatnonzero(self._candidates[offset:]) + offset
        ends = positions[~_STEPPED_OVER[self._bytes[positions + 1]]]
        return int(ends[0]) if len(ends) else None


# The bytes after a 0xFF that leave it inside a scan's data: restart markers and fill bytes.
_STEPPED_OVER = np.zeros(256, dtype=bool)
_STEPPED_OVER[0xD0:0xD8] = _STEPPED_OVER[0xFF] = True


# --- GIF, WebP, BMP ----------------------------------------------------------------------------


def _check_gif(data: bytes) -> None:
    if len(data) < 13:
        raise _truncated("gif", "it ends inside its header")
    try:
        frames = sum(1 for _ in image_formats.gif_image_extents(data))
    except EOFError as error:
        raise _truncated("gif", str(error)) from None
    except SyntaxError as error:
        raise _corrupt("gif", str(error)) from None
    if not frames:
        raise _corrupt("gif", "it holds no image")
    image_formats.check_gif_colour_tables(data)
    # Damage inside the LZW data shows only when decoding it, and GIFs are small and rare:
    # decoded, every frame, as TensorFlow does.
    decode_image_bytes(data)
    _check_gif_colour_indices(data)


def _check_gif_colour_indices(data: bytes) -> None:
    """TensorFlow (giflib) refuses a pixel whose colour index lies beyond the colour table; a
    decoder that pads the table does not. Checked for the first frame, which Pillow keeps as
    indices (it turns later ones into colours)."""
    with Image.open(io.BytesIO(data), formats=["GIF"]) as image:
        image.load()
        if image.mode != "P" or image.palette is None:
            return
        colours = len(image.palette.palette) // 3
        highest = image.getextrema()[1]
    if colours and highest >= colours:
        raise _corrupt("gif", f"a pixel has colour index {highest}, beyond its {colours} colours")


def _check_webp(data: bytes) -> None:
    declared = struct.unpack_from("<I", data, 4)[0] + 8
    if declared > len(data):
        raise _truncated(
            "webp", f"its header declares {declared:,} bytes, the file has {len(data):,}"
        )
    if declared < len(data):
        # Not truncated: longer. libwebp (TensorFlow's) ignores what follows the RIFF chunk, but
        # the file is not one whole WebP, and the chunk walks here and in the probe would read
        # those bytes as chunks: refused, by what it is.
        extra = len(data) - declared
        raise _corrupt(
            "webp",
            f"it has {extra:,} byte{'s' if extra != 1 else ''} after its RIFF chunk (its header "
            f"declares {declared:,} bytes, the file has {len(data):,})",
        )
    offset, bitstreams = 12, 0
    while offset < len(data):
        if offset + 8 > len(data):
            raise _truncated("webp", f"it ends inside a chunk header (at byte {offset:,})")
        kind, length = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        end = offset + 8 + length + (length & 1)
        if end > len(data) and not (end == len(data) + 1 and length & 1):
            raise _truncated("webp", f"a chunk at byte {offset:,} runs past the file's end")
        if kind in (b"VP8 ", b"VP8L"):
            bitstreams += 1
            if kind == b"VP8 " and length >= 10:
                # The first partition must fit in the frame.
                first = int.from_bytes(data[offset + 8 : offset + 11], "little") >> 5
                if 10 + first > length:
                    raise _corrupt("webp", "its VP8 frame's first partition runs past the frame")
        offset = end
    if bitstreams != 1:
        raise _corrupt("webp", f"it holds {bitstreams} image bitstreams, not one")
    # The bitstream shows damage only to a decoder: libwebp's (TensorFlow's too) decodes it.
    decode_image_bytes(data)


def _check_bmp(data: bytes) -> None:
    image_formats.check_bmp_layout(data[:32], len(data))


_CHECKS = {
    "png": _check_png,
    "jpeg": _check_jpeg,
    "gif": _check_gif,
    "webp": _check_webp,
    "bmp": _check_bmp,
}
