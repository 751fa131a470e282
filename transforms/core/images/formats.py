"""Format-specific header reading for the image probe: sizes, channels and end-of-file checks."""

from __future__ import annotations

import io
import struct
import typing

from PIL import ImageFile

from recordforge.transforms.core.errors import InputError

# The last 12 bytes of every complete PNG: the empty IEND chunk with its CRC.
_PNG_END = b"\x00\x00\x00\x00IEND\xae\x42\x60\x82"

# PNG IHDR colour type -> channels TensorFlow decodes (palette: 3, or 4 with a tRNS chunk libpng
# keeps: PngChunks.channels). Grey or RGB with a tRNS chunk keep 1 or 3: TensorFlow asks libpng
# for alpha only when the channel count it autodetects (png_get_channels) is even.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}
# Bit depths libpng accepts for each colour type (png_check_IHDR).
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# libpng's default user limits (PNG_USER_WIDTH_MAX, PNG_USER_HEIGHT_MAX; TensorFlow sets none).
PNG_SIDE_LIMIT = 1_000_000
# TensorFlow's own limit (decode_image_op.cc, "PNG size too large for int").
PNG_PIXEL_LIMIT = 1 << 29
# The critical chunks libpng knows; any other stops it ("unhandled critical chunk").
_PNG_CRITICAL = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND"})
# Pillow reads a grey or RGB image's tRNS chunk (before its image data) as 2 or 6 bytes.
_PILLOW_TRNS = {0: 2, 2: 6}

_WEBP_ALPHA_FLAG = 0x10
_WEBP_ANIMATION_FLAG = 0x02
_VP8X_SIZE = 10  # bytes of a VP8X chunk's data, as the WebP container defines it
# WebP metadata chunks → the keys of Pillow's Image.info they go to (its WebP plugin's).
_WEBP_METADATA = {b"EXIF": "exif", b"XMP ": "xmp"}


class _Stream(typing.Protocol):
    """The reads Source makes on the caller's stream."""

    def read(self, n: int = -1) -> bytes: ...

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int: ...

    def tell(self) -> int: ...


class Source:
    """One input file: its size, its first bytes, and reads at any offset.

    Attributes:
        size: the file's size in bytes, as the caller reported it.
        head: the first bytes of the file, as many as the probe read up front (fewer if the
            stream ends early).
    """

    def __init__(self, stream: _Stream, size: int, head: bytes) -> None:
        self._stream = stream
        self.size = size
        self.head = head

    @property
    def complete(self) -> bool:
        """Whether head holds the whole file, so no further reads are needed."""
        return len(self.head) >= self.size

    def extend_head(self, n: int) -> bool:
        """Reads on until head holds the first n bytes (fewer if the file ends first).

        Returns:
            Whether head grew.
        """
        wanted = min(n, self.size) - len(self.head)
        if wanted <= 0 or self.complete:
            return False
        if self._stream.tell() == len(self.head):  # still where the head ends: no seek
            more = read_up_to(self._stream, wanted)
        else:
            more = self.read_at(len(self.head), wanted)
        self.head += more
        return bool(more)

    def read_at(self, offset: int, n: int) -> bytes:
        """Returns up to n bytes at offset, from head when it has them (no seek)."""
        if offset + n <= len(self.head) or self.complete:
            return self.head[offset : offset + n]
        self._stream.seek(offset)
        return read_up_to(self._stream, n)

    def tail(self, n: int) -> bytes:
        """Returns the last n bytes of the file (one seek at most)."""
        start = max(0, self.size - n)
        return self.read_at(start, self.size - start)

    def whole(self) -> bytes:
        """Returns the whole file; only the fallback decode needs it."""
        return self.read_at(0, self.size)

    def stream_from_start(self) -> typing.BinaryIO:
        """Returns a file object over the whole file, positioned at 0."""
        if self.complete:
            return io.BytesIO(self.head)
        self._stream.seek(0)
        return typing.cast(typing.BinaryIO, self._stream)


def read_up_to(stream: _Stream, n: int) -> bytes:
    """Returns the next n bytes of stream, or fewer if it ends first."""
    chunks = []
    while n > 0:
        # Raw and network streams may return fewer bytes than asked before the end.
        chunk = stream.read(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def check_pixel_count(width: int, height: int, max_pixels: int) -> None:
    """Rejects an image (or GIF frame) larger than max_pixels as a decompression bomb."""
    pixels = width * height
    if pixels > max_pixels:
        raise InputError(
            "DecompressionBomb",
            f"the image is {width}x{height} = {pixels:,} pixels, which exceeds the limit of "
            f"{max_pixels:,} (--max-image-pixels)",
        )


def channels(fmt: str, image: ImageFile.ImageFile, head: bytes) -> int:
    """Channels tf.io.decode_image(expand_animations=False) returns (see tests/test_images.py).

    Args:
        fmt: jpeg, gif or bmp (webp_facts gives a WebP's channels, png_header a PNG's).
        image: the file as opened by Pillow's header parser.
        head: the first bytes of the file.
    """
    if fmt == "jpeg":
        # TensorFlow converts CMYK (and YCCK) JPEGs to RGB itself, so they decode to 3 channels.
        return 1 if image.mode == "L" else 3
    if fmt == "png":
        raise ValueError("a PNG's channels are png_header(source).channels")
    if fmt == "gif":
        return 3  # TensorFlow decodes every GIF to RGB, transparency or not.
    return _bmp_channels(head)


def _bmp_channels(head: bytes) -> int:
    # TensorFlow ignores the BMP palette and returns bits_per_pixel / 8 channels: 8-bit (palette or
    # grey) files give 1 channel of raw indices, 24-bit 3, 32-bit 4 even when Pillow reads RGB.
    # It cannot decode 1-, 2-, 4- or 16-bit BMPs, nor OS/2 (12-byte header) ones; check_bmp_layout
    # refuses them, but a caller that asks gets their closest decodable cousin's count.
    header_size = struct.unpack_from("<I", head, 14)[0]
    bits = struct.unpack_from("<H", head, 24 if header_size == 12 else 28)[0]
    known = {8: 1, 24: 3, 32: 4}
    if bits in known:
        return known[bits]
    return 1 if bits < 8 else 3


def check_bmp_width(head: bytes) -> None:
    """Refuses a BMP whose width is not positive, as TensorFlow does ("Width must be
    positive"), before its pixel count is: Pillow reads the signed width field as unsigned, so
    a negative width would otherwise look like a decompression bomb of 4 billion columns.

    Raises:
        InputError: `CorruptImage`.
    """
    if len(head) < 22 or struct.unpack_from("<I", head, 14)[0] == 12:
        return  # too short to say, or an OS/2 header (16-bit sizes): check_bmp_layout's
    (width,) = struct.unpack_from("<i", head, 18)
    if width <= 0:
        what = f"negative ({width:,})" if width < 0 else "0"
        raise InputError(
            "CorruptImage",
            f"the BMP file is corrupt: its width is {what}; TensorFlow decodes a positive "
            "width only",
        )


def check_bmp_layout(head: bytes, size: int) -> None:
    """Refuses a BMP TensorFlow's decoder refuses (it reads no palette and no compression):
    it takes bits_per_pixel / 8 as the channel count, which must be 1, 3 or 4, and the file
    must be exactly the pixel data's offset plus its rows (each padded to 4 bytes) long.

    Raises:
        InputError: `UnsupportedImageFormat` for another depth (1-, 4- and 16-bit files, OS/2
            headers), `CorruptImage` for a size that does not match.
    """
    if len(head) >= 18 and struct.unpack_from("<I", head, 14)[0] == 12:
        raise InputError(
            "UnsupportedImageFormat",
            "OS/2 BMP files (a 12-byte header) are not supported (TensorFlow decodes Windows "
            "BMPs only); convert them to PNG",
        )
    if len(head) < 32:
        raise InputError("TruncatedImage", "the BMP file is truncated: it ends in its header")
    offset, width, height = (
        struct.unpack_from("<iii", head, 10)[0],
        *struct.unpack_from("<ii", head, 18),
    )
    bits = struct.unpack_from("<h", head, 28)[0]
    channels = int(bits / 8)  # C's division: toward zero
    if channels not in (1, 3, 4):
        raise InputError(
            "UnsupportedImageFormat",
            f"BMP files of {bits} bits per pixel are not supported (TensorFlow decodes 8, 24 "
            "and 32, and --encode/--resize read a BMP as it does); convert them to PNG files "
            "first",
        )
    if width <= 0 or height == 0 or offset < 0:
        raise InputError("CorruptImage", "the BMP file is corrupt: its header is impossible")
    if width * abs(height) >= (2**31 - 1) // 8:
        raise InputError("CorruptImage", "the BMP file is corrupt: it is too large to decode")
    expected = offset + (channels * width + 3) // 4 * 4 * abs(height)
    if expected != size:
        what = "truncated" if expected > size else "longer than its pixels"
        raise InputError(
            "TruncatedImage" if expected > size else "CorruptImage",
            f"the BMP file is {what}: its header makes it {expected:,} bytes, the file has "
            f"{size:,} (TensorFlow decodes it only when they are equal)",
        )


def webp_facts(source: Source) -> tuple[int, int, int]:
    """Reads a WebP's size and alpha from its RIFF chunks, as libwebp's WebPGetFeatures does.

    Pillow's WebP plugin is not used here: it reads the whole file and libwebp's animation decoder
    allocates the full canvas when opening, which would defeat both the cheap probe and the
    decompression-bomb check.

    Returns:
        (width, height, channels).

    Raises:
        InputError: the WebP is animated (UnsupportedImageFormat).
        EOFError, SyntaxError: the header is cut short or malformed.
    """
    fourcc, length = _riff_chunk(source, 12)
    if fourcc == b"VP8X":
        if length != _VP8X_SIZE:  # libwebp refuses the file (TensorFlow cannot decode it)
            raise SyntaxError(f"its VP8X chunk is {length:,} bytes long, not {_VP8X_SIZE}")
        data = _read_exactly(source, 20, _VP8X_SIZE)
        flags = data[0]
        if flags & _WEBP_ANIMATION_FLAG:
            # tf.io.decode_image in TensorFlow 2.21 corrupts memory and aborts the process on
            # animated WebPs without alpha: a record that kills its reader must not be written.
            raise InputError(
                "UnsupportedImageFormat",
                "animated WebP images are not supported (TensorFlow cannot decode them "
                "reliably); convert them to GIF or still images",
            )
        width = 1 + int.from_bytes(data[4:7], "little")
        height = 1 + int.from_bytes(data[7:10], "little")
        # libwebp looks at the bitstream, not only the flag, to report a still image's alpha.
        has_alpha = _still_webp_alpha(
            source, 20 + length + (length & 1), (width, height), bool(flags & _WEBP_ALPHA_FLAG)
        )
        return width, height, 4 if has_alpha else 3
    width, height, has_alpha = _webp_bitstream(source, fourcc, 20)
    return width, height, 4 if has_alpha else 3


def webp_metadata(source: Source) -> dict[str, bytes]:
    """A WebP's EXIF and XMP chunks, keyed as Pillow's WebP plugin puts them in `Image.info`
    (for transforms.core.images.orientation).

    Only the extended format (VP8X) holds them, usually after the image data: its chunks are
    walked to the file's end, reading their 8-byte headers. A chunk cut short ends the walk:
    metadata never makes an image unusable.
    """
    if _riff_chunk(source, 12)[0] != b"VP8X":
        return {}
    found: dict[str, bytes] = {}
    offset = 12
    while offset + 8 <= source.size:
        fourcc, length = _riff_chunk(source, offset)
        key = _WEBP_METADATA.get(fourcc)
        if key is not None and key not in found:
            if offset + 8 + length > source.size:
                break
            found[key] = source.read_at(offset + 8, length)
        offset += 8 + length + (length & 1)
    return found


def _still_webp_alpha(
    source: Source, offset: int, canvas: tuple[int, int], flagged_alpha: bool
) -> bool:
    """Walks the chunks after VP8X to the bitstream; returns whether libwebp reports alpha."""
    alpha_chunk = False
    while True:
        fourcc, length = _riff_chunk(source, offset)
        if fourcc in (b"VP8 ", b"VP8L"):
            width, height, bitstream_alpha = _webp_bitstream(source, fourcc, offset + 8)
            if (width, height) != canvas:
                raise SyntaxError(f"VP8X canvas {canvas} differs from the bitstream's size")
            # A lossless bitstream's own alpha bit replaces the VP8X flag; an ALPH chunk adds one.
            alpha = bitstream_alpha if fourcc == b"VP8L" else flagged_alpha
            return alpha or alpha_chunk
        alpha_chunk = alpha_chunk or fourcc == b"ALPH"
        offset += 8 + length + (length & 1)


def _webp_bitstream(source: Source, fourcc: bytes, offset: int) -> tuple[int, int, bool]:
    """Returns (width, height, has_alpha) from a VP8 or VP8L bitstream header."""
    if fourcc == b"VP8L":
        data = _read_exactly(source, offset, 5)
        bits = int.from_bytes(data[1:5], "little")
        if data[0] != 0x2F or bits >> 29:
            raise SyntaxError("bad VP8L signature or version")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, bool((bits >> 28) & 1)
    if fourcc != b"VP8 ":
        raise SyntaxError(f"unexpected WebP chunk {fourcc!r}")
    data = _read_exactly(source, offset, 10)
    width, height = (value & 0x3FFF for value in struct.unpack_from("<HH", data, 6))
    if data[0] & 1 or data[3:6] != b"\x9d\x01\x2a" or not width or not height:
        raise SyntaxError("bad VP8 key frame header")
    return width, height, False


def _riff_chunk(source: Source, offset: int) -> tuple[bytes, int]:
    data = _read_exactly(source, offset, 8)
    return data[:4], struct.unpack_from("<I", data, 4)[0]


def _read_exactly(source: Source, offset: int, n: int) -> bytes:
    data = source.read_at(offset, n)
    if len(data) < n or offset + n > source.size:
        raise EOFError(f"the file ends inside its header (at byte {source.size:,})")
    return data


def webp_with_pad_byte(data: bytes) -> bytes:
    """A WebP file as Pillow reads it: with the pad byte its last chunk may lack.

    Every chunk of odd length is followed by a pad byte, so a whole WebP file's length is even;
    libwebp (TensorFlow's decoder) reads a file whose last chunk lacks it, Pillow's demuxer does
    not. An odd-length file gets the pad byte and a RIFF size that counts it; others are returned
    as they are.
    """
    if len(data) % 2 == 0 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return data
    return data[:4] + struct.pack("<I", len(data) + 1 - 8) + data[8:] + b"\0"


def ends_cleanly(source: Source, fmt: str) -> bool:
    """Quick completeness check from the file's end, or from a size field in the header."""
    declared = declared_size(source, fmt)
    if declared is not None:
        return declared == source.size
    tail = source.tail(len(_PNG_END))
    if fmt == "jpeg":
        return tail.endswith(b"\xff\xd9")
    if fmt == "png":
        return tail == _PNG_END
    return tail.endswith(b"\x3b")  # GIF trailer


def declared_size(source: Source, fmt: str) -> int | None:
    """The file size the header claims, for formats that record it (BMP bfSize, WebP RIFF)."""
    if fmt == "bmp" and len(source.head) >= 6:
        return struct.unpack_from("<I", source.head, 2)[0]
    if fmt == "webp" and len(source.head) >= 8:
        return struct.unpack_from("<I", source.head, 4)[0] + 8
    return None


def png_corrupt(what: str) -> InputError:
    return InputError("CorruptImage", f"the PNG file is corrupt: {what}")


def png_chunk_name(kind: bytes) -> str:
    # A chunk type is four ASCII letters; damaged ones are not shown (no file bytes in messages).
    return kind.decode("ascii") if kind.isalpha() and kind.isascii() else "damaged"


class PngChunks:
    """A PNG's chunks, fed in file order, checked against the rules of libpng 1.6 (1.6.43 is
    TensorFlow 2.21's PNG decoder; pngread.c png_read_info/png_read_end, pngrutil.c
    png_handle_IHDR/PLTE/tRNS, png_check_chunk_name, png_handle_unknown) where breaking them is an
    error that stops libpng (TensorFlow then fails), not a "benign" error libpng only warns about
    (TensorFlow's decoder leaves libpng's default: benign errors are warnings).

    The probe feeds the chunks up to the first IDAT (what png_read_info reads before TensorFlow
    sizes its output: png_header); the writer's check every chunk (integrity._check_png). Which
    tRNS chunk libpng keeps gives a palette image's channel count.

    Attributes:
        colour_type: the IHDR's colour type (None before it, or for an IHDR of a wrong length).
        channels: the last dimension TensorFlow decodes the image to (needs colour_type).
    """

    def __init__(self) -> None:
        self.colour_type: int | None = None
        self._bit_depth = 8
        self._ihdr = False
        self._plte = False  # libpng's PNG_HAVE_PLTE
        self._palette = 0  # entries libpng keeps (num_palette)
        self._transparency = False  # a tRNS libpng keeps (PNG_INFO_tRNS)
        self._idat = False  # libpng's PNG_HAVE_IDAT

    @property
    def channels(self) -> int:
        if self.colour_type == 3:
            return 4 if self._transparency else 3
        return _PNG_CHANNELS[typing.cast(int, self.colour_type)]

    def add(self, kind: bytes, length: int, offset: int, body: bytes = b"") -> None:
        """Takes the next chunk: its type, data length, offset in the file, and its data when it
        is an IHDR (other chunks are judged by their length).

        Raises:
            InputError: `CorruptImage` (`UnsupportedImageFormat` for Apple's CgBI), saying what.
        """
        where = f"at byte {offset:,}"
        if not (kind.isalpha() and kind.isascii()):
            raise png_corrupt(f"the type of its chunk {where} is not four letters")
        name = kind.decode("ascii")
        if kind == b"IHDR":
            if self._ihdr:
                raise png_corrupt(f"it has a second IHDR chunk ({where})")
            self._ihdr = True
            if len(body) == 13:
                self._bit_depth, self.colour_type = body[8], body[9]
        elif kind == b"IDAT":
            if self.colour_type == 3 and not self._plte:
                raise png_corrupt("it is a palette image with no PLTE chunk before its image data")
            self._idat = True
        elif kind == b"PLTE":
            self._add_palette(length, where)
        elif kind == b"tRNS":
            self._add_transparency(length)
        elif kind == b"CgBI":
            raise InputError(
                "UnsupportedImageFormat",
                "Apple's iPhone-optimised PNG files (a CgBI chunk) are not supported (TensorFlow "
                "cannot decode them); restore them to standard PNG (pngcrush "
                "-revert-iphone-optimizations)",
            )
        elif name[0].isupper() and kind not in _PNG_CRITICAL:
            # png_handle_unknown: "unhandled critical chunk".
            raise png_corrupt(f"it has a critical chunk of an unknown type, {name} ({where})")

    def _add_palette(self, length: int, where: str) -> None:
        if self._plte:
            raise png_corrupt(f"it has a second PLTE chunk ({where})")
        if self._idat or self.colour_type is None:
            return  # after the image data: ignored ("out of place", benign)
        self._plte = True
        if not self.colour_type & 2:
            return  # grey: ignored
        entries, bad = length // 3, length % 3 or length > 3 * 256
        if self.colour_type == 3 and (bad or not length):
            raise png_corrupt(
                f"its PLTE chunk is {length:,} bytes long, not 3 bytes for each of 1 to 256 colours"
            )
        if not length:  # png_set_PLTE: "Invalid palette", for RGB images too
            raise png_corrupt("its PLTE chunk is empty")
        if not bad:  # (an RGB image's bad palette is ignored)
            # Colours beyond 2**bit_depth are dropped, silently.
            limit = 1 << self._bit_depth if self.colour_type == 3 else 256
            self._palette = min(entries, limit)

    def _add_transparency(self, length: int) -> None:
        # png_handle_tRNS: after the image data, a second one, one before PLTE, or one longer
        # than the palette (or empty) is ignored (benign errors). Only a palette's counts here.
        if self._idat or self._transparency or self.colour_type != 3 or not self._plte:
            return
        self._transparency = 0 < length <= self._palette


def png_header(source: Source) -> PngChunks:
    """Walks a PNG's chunks up to its first IDAT (the header, as libpng's png_read_info reads it),
    applying PngChunks' rules and the IHDR's (check_png_ihdr).

    Raises:
        InputError: a rule broken (see PngChunks).
        EOFError: the file ends before its image data.
    """
    chunks = PngChunks()
    offset = 8
    while True:
        header = source.read_at(offset, 8)
        if len(header) < 8:
            raise EOFError(
                f"it ends inside a chunk header (at byte {offset:,}) before its image data"
            )
        length, kind = struct.unpack(">I4s", header)
        name = png_chunk_name(kind)
        if offset + 12 + length > source.size:
            raise EOFError(f"its {name} chunk at byte {offset:,} runs past the file's end")
        body = b""
        if offset == 8:
            if kind != b"IHDR":
                # libpng stops at any chunk it knows before IHDR ("missing IHDR") and skips
                # the others, but the PNG specification puts IHDR first.
                raise png_corrupt(f"its first chunk is {name}, not IHDR")
            body = source.read_at(offset + 8, length) if length == 13 else b""
            check_png_ihdr(length, body)
        elif kind == b"tRNS" and length < _PILLOW_TRNS.get(chunks.colour_type, 0):
            # libpng ignores it (benign); Pillow, which recordforge reads images with, cannot.
            image = "a grey" if chunks.colour_type == 0 else "an RGB"
            raise png_corrupt(
                f"its tRNS chunk is {length} byte{'' if length == 1 else 's'} long where {image} "
                f"image's is {_PILLOW_TRNS[chunks.colour_type]} (Pillow cannot read it)"
            )
        chunks.add(kind, length, offset, body)
        if kind == b"IDAT":
            return chunks
        if kind == b"IEND":
            raise png_corrupt("it has no image data (IDAT) before its IEND chunk")
        offset += 12 + length


def check_png_ihdr(length: int, body: bytes) -> None:
    """Refuses an IHDR libpng refuses (png_handle_IHDR, png_check_IHDR); its user limits on the
    size are check_png_size's."""
    if length != 13:
        raise png_corrupt(f"its IHDR chunk is {length:,} bytes long, not 13")
    width, height, depth, colour, compression, filter_method, interlace = struct.unpack(
        ">IIBBBBB", body
    )
    if not width or not height or width > 2**31 - 1 or height > 2**31 - 1:
        raise png_corrupt(f"its header gives an impossible size, {width:,}x{height:,} pixels")
    if colour not in _PNG_DEPTHS:
        raise png_corrupt(f"its colour type {colour} does not exist")
    if depth not in _PNG_DEPTHS[colour]:
        raise png_corrupt(f"a bit depth of {depth} is not one colour type {colour} allows")
    for what, value, most in (
        ("compression", compression, 0),
        ("filter", filter_method, 0),
        ("interlace", interlace, 1),
    ):
        if value > most:
            raise png_corrupt(f"its {what} method {value} does not exist")


def check_png_size(width: int, height: int) -> None:
    """Refuses a PNG too large for TensorFlow: wider or taller than libpng's default user limit,
    or of 2**29 pixels or more (TensorFlow's own check). The probe applies it after
    --max-image-pixels (a larger image is a DecompressionBomb first).

    Raises:
        InputError: `UnsupportedImageFormat`.
    """
    if width > PNG_SIDE_LIMIT or height > PNG_SIDE_LIMIT:
        raise InputError(
            "UnsupportedImageFormat",
            f"PNG images wider or taller than {PNG_SIDE_LIMIT:,} pixels are not supported "
            f"(TensorFlow's decoder, libpng, refuses them); this one is {width:,}x{height:,}",
        )
    if width * height >= PNG_PIXEL_LIMIT:
        raise InputError(
            "UnsupportedImageFormat",
            f"PNG images of {PNG_PIXEL_LIMIT:,} pixels or more are not supported (TensorFlow "
            f"refuses them); this one is {width:,}x{height:,}",
        )


def check_png_chunks(data: bytes) -> None:
    """Raises EOFError unless the PNG runs to a complete IEND chunk, as TensorFlow requires.

    Pillow decodes a PNG that lacks its IEND chunk (or the last CRC); TensorFlow rejects it.
    """
    offset = 8
    while offset + 8 <= len(data):
        length, chunk_type = struct.unpack_from(">I4s", data, offset)
        offset += 12 + length
        if chunk_type == b"IEND" and offset <= len(data):
            return
    raise EOFError("the file ends before the PNG IEND chunk")


def check_gif_first_frame(head: bytes, max_pixels: int) -> None:
    """Applies max_pixels to a GIF before Pillow opens it.

    Pillow grows a GIF to fit a first frame larger than the logical screen, runs its own global
    size check on it (which warns or raises) and may allocate a frame-sized buffer, all while
    opening the file.
    """
    if len(head) < 13:
        return  # too short to be a GIF; Pillow will say so
    width, height = struct.unpack_from("<HH", head, 6)
    try:
        right, bottom = next(gif_image_extents(head), (0, 0))
    except (EOFError, SyntaxError):
        right = bottom = 0  # the first image lies beyond the head (or nowhere): screen only
    check_pixel_count(max(width, right), max(height, bottom), max_pixels)


def check_gif_blocks(data: bytes, max_pixels: int) -> None:
    """Checks that every GIF block is complete and no frame is too large to decode."""
    width, height = struct.unpack_from("<HH", data, 6)
    for right, bottom in gif_image_extents(data):
        width, height = max(width, right), max(height, bottom)
        check_pixel_count(width, height, max_pixels)


def gif_image_extents(data: bytes) -> typing.Iterator[tuple[int, int]]:
    """Walks a GIF's blocks (see gif_frames), yielding each image's right and bottom edge."""
    for left, top, width, height in gif_frames(data):
        yield left + width, top + height


def gif_decoded_size(data: bytes) -> tuple[int, int]:
    """The (width, height) TensorFlow decodes a whole GIF to: the widest and the tallest of its
    frames, wherever they lie and whatever its logical screen says (gif_io.cc sizes its output
    so; a frame placed off that canvas is clipped).

    Raises:
        EOFError, SyntaxError: as gif_frames.
    """
    width = height = 0
    for _, _, frame_width, frame_height in gif_frames(data):
        width, height = max(width, frame_width), max(height, frame_height)
    if not width:
        raise SyntaxError("the GIF file holds no image")
    return width, height


def check_gif_colour_tables(data: bytes) -> None:
    """Refuses a GIF with a frame that has no colour table of its own and no global one to use
    (TensorFlow: "missing color map for frame N").

    Raises:
        InputError: `CorruptImage`.
        EOFError, SyntaxError: as gif_frames.
    """
    if data[10] & 0x80:
        return
    for index, (*_, has_table) in enumerate(_gif_images(data)):
        if not has_table:
            raise InputError(
                "CorruptImage",
                f"the GIF file is corrupt: its frame {index + 1} has no colour table, and the "
                "file no global one",
            )


def gif_frames(data: bytes) -> typing.Iterator[tuple[int, int, int, int]]:
    """Walks a GIF's blocks, yielding each image's left, top, width and height.

    Pillow decodes a GIF whose last data block is cut short; TensorFlow (giflib) rejects it, so
    this walk does too. Like TensorFlow, it accepts a file that ends (or turns into unknown
    bytes, or an image of no width or height, which giflib stops at) after a complete image but
    before the trailer: that is data appended to, not missing from, the image.

    Raises:
        EOFError: the data ends inside a block.
        SyntaxError: an unknown block, or an empty image, comes before the first image.
    """
    for left, top, width, height, _ in _gif_images(data):
        yield left, top, width, height


def _gif_images(data: bytes) -> typing.Iterator[tuple[int, int, int, int, bool]]:
    """gif_frames, and whether each image has a colour table of its own."""
    offset = 13 + _gif_colour_table_size(data[10])
    seen_image = False
    while offset < len(data):
        block = data[offset]
        if block == 0x3B:  # trailer
            return
        if block == 0x21:  # extension: introducer, label, data sub-blocks
            offset = _skip_gif_sub_blocks(data, offset + 2)
        elif block == 0x2C:  # image: descriptor, optional colour table, code size, sub-blocks
            if offset + 10 > len(data):
                raise EOFError("the file ends inside a GIF image descriptor")
            left, top, width, height, flags = struct.unpack_from("<4HB", data, offset + 1)
            if not width or not height:
                # giflib stops at an empty image: TensorFlow decodes the frames before it.
                if seen_image:
                    return
                raise SyntaxError(f"its first image is {width}x{height} pixels")
            yield left, top, width, height, bool(flags & 0x80)
            seen_image = True
            offset = _skip_gif_sub_blocks(data, offset + 11 + _gif_colour_table_size(flags))
        elif seen_image:
            return
        else:
            raise SyntaxError(f"unexpected GIF block 0x{block:02x} at byte {offset:,}")
    if offset > len(data):
        raise EOFError("the file ends inside a GIF block")


def _gif_colour_table_size(flags: int) -> int:
    return 3 << ((flags & 7) + 1) if flags & 0x80 else 0


def _skip_gif_sub_blocks(data: bytes, offset: int) -> int:
    while offset < len(data):
        length = data[offset]
        offset += 1 + length
        if length == 0:
            return offset
    raise EOFError("the file ends inside a GIF data block")
