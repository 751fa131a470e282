"""Cheap image probing: format, size and channel count from the header, with typed rejections."""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import typing
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from PIL import (
    BmpImagePlugin,
    GifImagePlugin,
    Image,
    ImageFile,
    JpegImagePlugin,
    PngImagePlugin,
    WebPImagePlugin,
)

from recordforge.transforms.core.errors import InputError, without_file_bytes
from recordforge.transforms.core.images import formats as image_formats
from recordforge.transforms.core.images.formats import Source
from recordforge.transforms.core.images.orientation import UPRIGHT, orientation_in

DEFAULT_MAX_PIXELS: int = Image.MAX_IMAGE_PIXELS
SUPPORTED_FORMATS: frozenset[str] = frozenset({"jpeg", "png", "gif", "bmp", "webp"})

# We bypass Image.open (see _PILLOW_FACTORIES) and check GIF frame sizes before Pillow sees them,
# so with the default limit Pillow's own size check never fires. When a caller raises max_pixels
# above Pillow's limit, GIF frames between the two still make Pillow warn while opening or
# decoding, and that warning would escape to our callers. warnings.catch_warnings() cannot be used
# per call: it swaps process-global state and is not thread-safe. We enforce our own limit, so the
# warning carries nothing for us: ignore it when raised from Pillow's modules. This is process-wide
# (other Pillow users lose that one warning), and is undone if this module is first imported inside
# a catch_warnings() block (as during pytest collection).
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning, module=r"PIL\.")

# The first read: this many bytes hold the whole header of most images (those of photos with
# small EXIF blocks fit in a few KiB). A header that runs past it is parsed again from the first
# _HEAD_BYTES, then from the stream. Reading 64 KiB up front cost a third of a probe's CPU on
# 100 KB photos, though nearly all of it went unused.
_FIRST_BYTES = 16 * 1024
# Enough for nearly every header, thumbnails in EXIF included.
_HEAD_BYTES = 64 * 1024

_SUPPORTED_LIST = ", ".join(sorted(SUPPORTED_FORMATS))

# Exceptions Pillow's parsers and decoders raise on bad data (ImageFile wraps some in SyntaxError).
_PILLOW_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    struct.error,
    IndexError,
    TypeError,
    KeyError,
    zlib.error,
)

# Pillow format ids, keyed by our names. Pillow's registry gives the content sniffers.
_PILLOW_IDS = {"jpeg": "JPEG", "png": "PNG", "gif": "GIF", "bmp": "BMP", "webp": "WEBP"}

# Header parsers, called directly rather than through Image.open: Image.open applies Pillow's
# global MAX_IMAGE_PIXELS (warning above it, raising above twice it) before we can apply our own
# max_pixels, which may be higher, and changing the global is not thread-safe. JPEG uses the plain
# JPEG parser, not Pillow's registered factory: that one also parses the MPO index of camera files
# (and warns on a malformed one) although only the first picture matters here. WebP headers are
# read by image_formats.webp_facts: Pillow's plugin reads the whole file and allocates the canvas.
_PILLOW_FACTORIES: dict[str, Callable[[typing.BinaryIO], ImageFile.ImageFile]] = {
    "jpeg": JpegImagePlugin.JpegImageFile,
    "png": PngImagePlugin.PngImageFile,
    "gif": GifImagePlugin.GifImageFile,
    "bmp": BmpImagePlugin.BmpImageFile,
}


@dataclass(frozen=True)
class ImageFacts:
    """What a probe learns about one image without decoding its pixels.

    Attributes:
        format: lowercase format name, one of SUPPORTED_FORMATS.
        width: width in pixels.
        height: height in pixels.
        channels: the last dimension of tf.io.decode_image(data, expand_animations=False) for
            this file (probed for preprocessing: that of the picture it decodes, see
            `probe_image`).
        orientation: the EXIF orientation (1-8) preprocessing turns the pixels by
            (transforms.core.images.orientation); read only when asked, else 1. The width and
            height above are the file's, as decoders that ignore EXIF (TensorFlow's) see them.
    """

    format: str
    width: int
    height: int
    channels: int
    orientation: int = UPRIGHT


def probe_image(
    stream: typing.BinaryIO,
    size: int,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    orientation: bool = False,
) -> ImageFacts:
    """Identifies an image from its header and checks that it is complete.

    The normal path reads the first 16 KiB (64 KiB, or more, when the header runs past them)
    and the last few bytes; a GIF is read whole (its size is that of its largest frames). Files
    whose end does not look like a complete image (truncated, or with data appended) are
    decoded in full to decide.

    Args:
        stream: a seekable binary file object positioned at 0 (a local file or a cloud-storage
            reader). Errors raised by the stream itself propagate unchanged.
        size: the file's size in bytes.
        max_pixels: largest width * height accepted; larger images are rejected undecoded.
        orientation: the facts preprocessing needs: also read the EXIF orientation (a WebP's
            metadata chunks follow its pixels: then the chunks are walked to the end), and give
            an 8-bit BMP with a colour palette the channels of its picture (3), not those of
            TensorFlow's decode of the file (1: the raw palette indices).

    Returns:
        The image's format, size and channel count (and orientation).

    Raises:
        InputError: the file is empty, not an image, an unsupported format (animated WebP
            included), too large, truncated or corrupt.
    """
    if size == 0:
        raise _empty_file()
    guarded = _GuardedStream(stream)
    try:
        head = image_formats.read_up_to(guarded, min(size, _FIRST_BYTES))
        if not head:
            raise _empty_file()
        return _probe(Source(guarded, size, head), max_pixels, orientation=orientation)
    except _StreamError as failure:
        raise failure.error from None


def probe_image_bytes(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, orientation: bool = False
) -> ImageFacts:
    """Identifies an image held in memory; see probe_image.

    Args:
        data: the whole file.
        max_pixels: largest width * height accepted; larger images are rejected undecoded.
        orientation: also read the EXIF orientation.

    Returns:
        The image's format, size and channel count.

    Raises:
        InputError: as for probe_image.
    """
    if not data:
        raise _empty_file()
    source = Source(_GuardedStream(io.BytesIO(data)), len(data), data)
    return _probe(source, max_pixels, orientation=orientation)


def decode_image_bytes(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageFacts:
    """Identifies an image held in memory and decodes all of it, whatever its end looks like.

    Every pixel is decoded (every frame of a GIF, as TensorFlow does), with the same guards as a
    probe: the pixel count is checked from the header before anything is decoded.

    Args:
        data: the whole file.
        max_pixels: largest width * height accepted; larger images are rejected undecoded.

    Returns:
        The image's format, size and channel count.

    Raises:
        InputError: as for probe_image, including for damage only a full decode finds.
    """
    if not data:
        raise _empty_file()
    source = Source(_GuardedStream(io.BytesIO(data)), len(data), data)
    return _probe(source, max_pixels, decode=True)


def open_image(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[ImageFacts, Image.Image]:
    """Probes an image held in memory (see probe_image), its EXIF orientation read too, then
    opens it for decoding.

    The pixel count is checked from the header before anything is decoded, and Pillow's own
    global limit is bypassed as for a probe. The image is opened lazily: decoding errors come
    from the caller's first use of its pixels.

    Returns:
        (its facts, the Pillow image).

    Raises:
        InputError: as for probe_image.
    """
    facts = probe_image_bytes(data, max_pixels=max_pixels, orientation=True)
    try:
        if facts.format == "webp":
            readable = image_formats.webp_with_pad_byte(data)  # as libwebp (TensorFlow's) reads it
            return facts, WebPImagePlugin.WebPImageFile(io.BytesIO(readable))
        return facts, _PILLOW_FACTORIES[facts.format](io.BytesIO(data))
    except _PILLOW_ERRORS as error:
        source = Source(_GuardedStream(io.BytesIO(data)), len(data), data)
        raise _damaged(source, facts.format, error) from error


class _StreamError(Exception):
    """Carries an exception raised by the caller's stream past our handlers for bad image data.

    A failing read (say, a network error from a cloud-storage reader) says nothing about the image
    and must reach the caller as it is, not be mistaken for a corrupt file.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _GuardedStream:
    """The caller's stream as handed to Pillow: its own failures become _StreamError."""

    def __init__(self, stream: typing.BinaryIO) -> None:
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        try:
            return self._stream.read(n)
        except Exception as error:
            raise _StreamError(error) from error

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        try:
            return self._stream.seek(offset, whence)
        except Exception as error:
            raise _StreamError(error) from error

    def tell(self) -> int:
        try:
            return self._stream.tell()
        except Exception as error:
            raise _StreamError(error) from error


def _probe(
    source: Source, max_pixels: int, *, decode: bool = False, orientation: bool = False
) -> ImageFacts:
    fmt = _sniff(source.head)
    if fmt is None:
        raise _unrecognised(source)
    try:
        if fmt == "bmp":  # before Pillow reads a negative width as a huge one
            image_formats.check_bmp_width(source.head)
        facts = _header_facts(source, fmt, max_pixels, orientation)
        image_formats.check_pixel_count(facts.width, facts.height, max_pixels)
        if fmt == "png":  # TensorFlow's limits, below most --max-image-pixels
            image_formats.check_png_size(facts.width, facts.height)
        if fmt == "bmp":  # TensorFlow's own rules, from the header and the size
            image_formats.check_bmp_layout(source.head, source.size)
        if decode or not image_formats.ends_cleanly(source, fmt):
            # Inconclusive (data appended after the end marker, as camera "motion photos" do) or
            # truncated: only a full decode can tell. The image is within max_pixels by now.
            _decode_fully(source, fmt, max_pixels)
    except Image.DecompressionBombError as error:
        # Only when max_pixels exceeds Pillow's limit: a GIF frame between the two.
        raise InputError(
            "DecompressionBomb", f"the {fmt.upper()} file has a frame too large to decode: {error}"
        ) from error
    except _PILLOW_ERRORS as error:
        raise _damaged(source, fmt, error) from error
    return facts


def _sniff(head: bytes) -> str | None:
    """Names the supported format the content is in, using Pillow's own sniffers."""
    prefix = head[:16]
    for fmt, accept in _sniffers():
        try:
            if _accepted(accept(prefix)):
                return fmt
        except (struct.error, IndexError):  # prefix too short for this sniffer
            continue
    return None


@functools.cache
def _sniffers() -> tuple[tuple[str, Callable[[bytes], object]], ...]:
    """(our format name, Pillow's sniffer) of the supported formats, looked up once: the
    plugins imported above have registered theirs."""
    sniffers = ((fmt, Image.OPEN[pillow_id][1]) for fmt, pillow_id in _PILLOW_IDS.items())
    return tuple((fmt, accept) for fmt, accept in sniffers if accept is not None)


def _accepted(result: object) -> bool:
    # A string is Pillow's "recognised, but support for it is not installed" message.
    return bool(result) and not isinstance(result, str)


def _header_facts(source: Source, fmt: str, max_pixels: int, orientation: bool) -> ImageFacts:
    if fmt == "webp":
        facts = ImageFacts(fmt, *image_formats.webp_facts(source))
        if orientation:
            turn = orientation_in(image_formats.webp_metadata(source))
            facts = dataclasses.replace(facts, orientation=turn)
        return facts
    if fmt == "gif":
        # TensorFlow's size for a GIF is that of its widest and tallest frames (not the logical
        # screen, nor the first frame: see image_formats.gif_decoded_size), which only a walk of
        # every block finds: a GIF is read whole.
        source.extend_head(source.size)
        image_formats.check_gif_first_frame(source.head, max_pixels)
    # A PNG's chunks before its image data, checked as libpng reads them; they give its channels.
    png = image_formats.png_header(source) if fmt == "png" else None
    image = _open_header(source, fmt)
    width, height = image.size
    if fmt == "gif":
        width, height = image_formats.gif_decoded_size(source.head)
        image_formats.check_pixel_count(width, height, max_pixels)
        image_formats.check_gif_colour_tables(source.head)
    if png is not None:
        channels = png.channels
    else:
        channels = image_formats.channels(fmt, image, source.head)
    if orientation and fmt == "bmp" and image.mode == "P":
        # Preprocessing decodes the picture, not TensorFlow's raw indices: an 8-bit BMP whose
        # palette has colours (Pillow reads a grey palette as "L") is an RGB picture.
        channels = 3
    # The metadata Pillow's header parse found (a JPEG's APP segments, a PNG's chunks before
    # its pixels), as preprocessing reads it: nothing is decoded.
    turn = orientation_in(image.info) if orientation else UPRIGHT
    return ImageFacts(fmt, width, height, channels, turn)


def _open_header(source: Source, fmt: str) -> ImageFile.ImageFile:
    """Parses the header with Pillow (lazily: no pixel data is read)."""
    factory = _PILLOW_FACTORIES[fmt]
    while not source.complete:
        try:
            # A parse that succeeds within the head read nothing past it: as from the stream.
            return factory(io.BytesIO(source.head))
        except _PILLOW_ERRORS:
            # The header runs past the head (say, a large ICC profile): read on, then the stream.
            if not source.extend_head(_HEAD_BYTES):
                break
    return factory(source.stream_from_start())


def _decode_fully(source: Source, fmt: str, max_pixels: int) -> None:
    """Decodes every pixel (and frame TensorFlow would decode); raises Pillow's errors."""
    if fmt == "bmp":
        # TensorFlow's BMP decoder copies the pixel array as it is (bits_per_pixel / 8 channels,
        # no palette, no compression): once check_bmp_layout has passed, it decodes any bytes.
        # Pillow's decoder would apply the palette or the compression field, and refuse 8-bit
        # palette or RLE-flagged files TensorFlow decodes.
        return
    data = source.whole()
    if fmt == "gif":
        # Before decoding: a later frame may be a bomb.
        image_formats.check_gif_blocks(data, max_pixels)
    if fmt == "webp":
        readable = image_formats.webp_with_pad_byte(data)  # as libwebp (TensorFlow's) reads it
        image: ImageFile.ImageFile = WebPImagePlugin.WebPImageFile(io.BytesIO(readable))
    else:
        image = _PILLOW_FACTORIES[fmt](io.BytesIO(data))
    # ImageFile.LOAD_TRUNCATED_IMAGES is read, never set: it is global, and must stay False.
    image.load()
    if fmt == "gif":
        # TensorFlow decodes every frame of a GIF even with expand_animations=False. (Animated
        # WebPs never get here: image_formats.webp_facts rejects them from the header.)
        frame = 1
        while True:
            try:
                image.seek(frame)
            except EOFError:
                break
            image.load()
            frame += 1
    if fmt == "png":
        image_formats.check_png_chunks(data)


def _damaged(source: Source, fmt: str, error: BaseException) -> InputError:
    """Classifies a parse or decode failure of a file in a supported format."""
    label = fmt.upper()
    declared = image_formats.declared_size(source, fmt)
    if declared is not None and declared > source.size:
        return InputError(
            "TruncatedImage",
            f"the {label} file is truncated: its header declares {declared:,} bytes but the file "
            f"has {source.size:,}",
        )
    if _ran_out_of_data(error) and not image_formats.ends_cleanly(source, fmt):
        detail = _describe(error)
        pillow_words = "image file is truncated"
        if detail.startswith(pillow_words):
            detail = "the image data ends early" + detail[len(pillow_words) :]
        return InputError("TruncatedImage", f"the {label} file is truncated: {detail}")
    return InputError("CorruptImage", f"the {label} file is corrupt: {_describe(error)}")


def _ran_out_of_data(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, (EOFError, struct.error, IndexError)):
            return True
        if "truncated" in str(error).lower():
            return True
        error = error.__cause__
    return False


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = without_file_bytes(text)  # Pillow quotes chunk names and headers it does not know
    return text if len(text) <= 160 else text[:157] + "..."


def _unrecognised(source: Source) -> InputError:
    other = _other_pillow_format(source)
    if other is not None:
        return InputError(
            "UnsupportedImageFormat",
            f"{other} images are not supported (supported: {_SUPPORTED_LIST})",
        )
    # Not what the file holds: it may be anything (a CSV row can name any file), and no
    # message quotes a file's bytes.
    return InputError(
        "NotAnImage",
        f"not a recognised image (none of {_SUPPORTED_LIST} by its first bytes)",
    )


def _other_pillow_format(source: Source) -> str | None:
    """Names the Pillow format of a file we do not support, if Pillow can open its header."""
    Image.init()  # registers every Pillow plugin, once per process
    prefix = source.head[:16]
    for pillow_id in Image.ID:
        factory, accept = Image.OPEN[pillow_id]
        # Formats without a sniffer (TGA, ...) would claim arbitrary bytes: a name is not worth it.
        if pillow_id in _PILLOW_IDS.values() or accept is None:
            continue
        try:
            if not _accepted(accept(prefix)):
                continue
            factory(source.stream_from_start(), "")
        except Image.DecompressionBombError:
            return pillow_id  # recognised, and large: still an unsupported format
        except _StreamError:
            raise
        except Exception:  # any failure of a foreign plugin just means "not this format"
            continue
        return pillow_id
    return None


def _empty_file() -> InputError:
    return InputError("EmptyFile", "the file is empty (0 bytes)")
