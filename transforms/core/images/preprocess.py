"""Opt-in image preprocessing: resize, re-encode, channel conversion; pure, deterministic.

Only the options change a stored image. Without them the writer stores a file's bytes as they
are; with any of them every image is decoded, EXIF-oriented, converted, resized and encoded
again with fixed parameters (no timestamps, no metadata, no encoder search), so the same
input, options and Pillow version give the same bytes on every runner and worker.

`Preprocessing.stored_facts` predicts, from the probe's header facts and EXIF orientation, what
the stored image will be (for the plan, the records' features and the manifest's image facts);
`preprocess` does the work where the bytes are read (the writer), its target size from the same
prediction, and the writer records the facts of the bytes it produced.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import PIL
from PIL import Image, ImageOps

from recordforge.schemas import codec
from recordforge.schemas import features as keys
from recordforge.schemas.spliced import serialize_around
from recordforge.transforms.core.errors import InputError, without_file_bytes
from recordforge.transforms.core.images import formats as image_formats
from recordforge.transforms.core.images.orientation import UPRIGHT, oriented_size, turned
from recordforge.transforms.core.images.probe import (
    DEFAULT_MAX_PIXELS,
    open_image,
    probe_image_bytes,
)

RESIZE_MODES = ("crop", "pad")
ENCODINGS = ("jpeg", "png", "webp")
DEFAULT_QUALITY = {"jpeg": 95, "webp": 90}
# Formats Pillow writes that we keep when only resizing; others (GIF, BMP) become PNG: lossless,
# and TensorFlow decodes it to the same channels.
_KEPT_FORMATS = frozenset(ENCODINGS)
_FALLBACK_FORMAT = "png"
_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
# Fixed: the filter shapes the bytes. Lanczos is Pillow's best for shrinking photos.
_FILTER = Image.Resampling.LANCZOS
# Bytes per pixel and channel of an encoded image, only to estimate a record's size for the
# plan (see docs/design.md, "Preprocessing"): the writer's real sizes go into the manifest.
_BYTES_PER_SAMPLE = {"jpeg": 0.25, "webp": 0.15, "png": 1.0}
# The longest side the stored format holds: libjpeg's JPEG_MAX_DIMENSION, libwebp's
# WEBP_MAX_DIMENSION (Pillow's encoders fail beyond them, and TensorFlow's decoders refuse
# such files). PNG's limit is the writer's check of the stored bytes (formats.check_png_ihdr).
_MAX_SIDE = {"jpeg": 65500, "webp": 16383}


@dataclass(frozen=True)
class Preprocessing:
    """What to do to every image before it is stored; the default does nothing.

    Attributes:
        size: (width, height) to resize to exactly (`--resize WxH`), or None.
        shorter_side: resize so the shorter side is this long, aspect kept (`--resize N`).
        mode: how `size` meets another aspect: "crop" (center crop first) or "pad" (black).
        encode: the stored format (jpeg, png or webp); None: the source's where Pillow writes
            it (jpeg, png, webp), else png.
        quality: JPEG/WebP quality, 1-100 (None: DEFAULT_QUALITY).
        channels: 1 (grey) or 3 (RGB); None: as the source's (alpha kept where the format can).
    """

    size: tuple[int, int] | None = None
    shorter_side: int | None = None
    mode: str = "crop"
    encode: str | None = None
    quality: int | None = None
    channels: int | None = None

    @property
    def active(self) -> bool:
        """Whether any pixels are re-encoded."""
        return any(
            value is not None
            for value in (self.size, self.shorter_side, self.encode, self.quality, self.channels)
        )

    def to_dict(self) -> dict:
        """What the manifest records: the options, and Pillow's version (the encoder's bytes
        depend on it)."""
        return {
            "resize": (f"{self.size[0]}x{self.size[1]}" if self.size else self.shorter_side),
            "resize_mode": self.mode if self.size else None,
            "encode": self.encode,
            "quality": self.quality,
            "channels": self.channels,
            "exif_orientation": "applied",
            "filter": "lanczos",
            "jpeg_decode": "DCT-scaled to at least twice the stored size",
            "pillow": PIL.__version__,
        }

    def output_format(self, source_format: str) -> str:
        """The format an image of `source_format` is stored in."""
        if self.encode is not None:
            return self.encode
        if source_format == "webp" and self.channels == 1:
            return _FALLBACK_FORMAT  # WebP holds colour only
        return source_format if source_format in _KEPT_FORMATS else _FALLBACK_FORMAT

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """The stored size of an image of this (EXIF-oriented) size."""
        if self.size is not None:
            return self.size
        if self.shorter_side is not None:
            side = self.shorter_side
            if width <= height:  # rounded half up, in integers
                return side, max(1, (2 * height * side + width) // (2 * width))
            return max(1, (2 * width * side + height) // (2 * height)), side
        return width, height

    def output_channels(self, source_channels: int, fmt: str) -> int:
        """The channels tf.io.decode_image gives for the stored image."""
        channels = self.channels or source_channels
        if fmt == "jpeg":
            return 1 if channels in (1, 2) else 3  # JPEG holds no alpha
        if fmt == "webp":
            return 4 if channels in (2, 4) else 3  # WebP holds RGB or RGBA
        return channels

    def stored_facts(
        self,
        fmt: str,
        width: int,
        height: int,
        channels: int,
        max_pixels: int,
        orientation: int = UPRIGHT,
    ) -> tuple[str, int, int, int]:
        """(format, width, height, channels) of the stored image, predicted from the source's
        header facts: its size in the file and its EXIF orientation, which turns the pixels
        before they are resized. `preprocess` stores an image of this size.

        Raises:
            InputError: the stored image would exceed `max_pixels` (`ResizeTooLarge`), or
                have a side longer than its format holds (`TooLargeForFormat`).
        """
        stored_format = self.output_format(fmt)
        stored_width, stored_height = self.output_size(*oriented_size(width, height, orientation))
        _check_output_pixels(stored_width, stored_height, max_pixels)
        _check_output_side(stored_format, stored_width, stored_height)
        return (
            stored_format,
            stored_width,
            stored_height,
            self.output_channels(channels, stored_format),
        )

    def estimated_size(
        self, source_size: int, source_format: str, source_pixels: int, stored: tuple
    ) -> int:
        """A stored image's size in bytes, estimated for the plan (the real one is known only
        once it is encoded): the source's size scaled by pixels when the format is kept, else
        a typical bytes-per-sample figure."""
        fmt, width, height, channels = stored
        pixels = width * height
        if fmt == source_format:
            return max(1, source_size * pixels // max(1, source_pixels))
        return max(1, int(pixels * channels * _BYTES_PER_SAMPLE[fmt]))


NO_PREPROCESSING = Preprocessing()


def preprocess(
    data: bytes,
    preprocessing: Preprocessing,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> bytes:
    """The image file `data` decoded, processed and encoded as `preprocessing` says.

    The pixel limit is checked from the header before anything is decoded; a GIF's first frame
    is the one kept.

    Raises:
        InputError: the image cannot be decoded (the probe's kinds: CorruptImage,
            TruncatedImage, DecompressionBomb, ...), or would be too large (`ResizeTooLarge`;
            `TooLargeForFormat`: a side longer than JPEG or WebP holds).
    """
    facts, image = open_image(data, max_pixels=max_pixels)
    stored_format, width, height, channels = preprocessing.stored_facts(
        facts.format, facts.width, facts.height, facts.channels, max_pixels, facts.orientation
    )
    target = (width, height)
    try:
        if facts.format == "jpeg":
            oriented = oriented_size(facts.width, facts.height, facts.orientation)
            _draft(image, oriented, target)
        # Decoded here, not by whichever later step first needs the pixels (none may, when
        # the size and mode stay): Pillow's decoders read the file's `info` (a PNG's Adam7
        # interlace flag), so it is dropped only once the pixels are in memory.
        image.load()
        if facts.format == "gif":
            image = _gif_first_frame(image, data, facts.width, facts.height)
        image = turned(image, facts.orientation)
        image = _converted(image, _MODES[channels])
        image = _resized(image, preprocessing, target)
        image.info = {}  # no metadata carried over: only pixels are stored
        out = io.BytesIO()
        image.save(out, **_save_options(stored_format, preprocessing.quality))
    except InputError:
        raise
    except Exception as error:  # Pillow's decoders raise many kinds on bad data
        raise InputError(
            "CorruptImage",
            f"the {facts.format.upper()} file cannot be decoded for --resize/--encode: "
            f"{_describe(error)}",
        ) from error
    return out.getvalue()


def stored_record(
    skeleton: bytes, offset: int, planned_size: int, payload: bytes
) -> tuple[bytes, bytes, bytes]:
    """A planned image record with the preprocessed image in it, in pieces (before, payload,
    after): the Example's image facts become those of `payload` (the plan predicted them, but
    only the encoder knows the size in bytes, and whether a WebP keeps an alpha channel that
    is opaque everywhere).

    Args:
        skeleton, offset: the planned Example and where its image bytes go (schemas.spliced).
        planned_size: the size of the image the plan estimated (the hole's size).
        payload: the stored image's bytes.
    """
    example = codec.parse(skeleton[:offset] + bytes(planned_size) + skeleton[offset:])
    facts = probe_image_bytes(payload)
    feature_map = example.features.feature
    for key in (
        keys.IMAGE_ENCODED,
        keys.IMAGE_FORMAT,
        keys.IMAGE_HEIGHT,
        keys.IMAGE_WIDTH,
        keys.IMAGE_CHANNELS,
    ):
        del feature_map[key]
    codec.add_features(
        example,
        {
            keys.IMAGE_FORMAT: ("bytes", (facts.format.encode("ascii"),)),
            keys.IMAGE_HEIGHT: ("int64", (facts.height,)),
            keys.IMAGE_WIDTH: ("int64", (facts.width,)),
            keys.IMAGE_CHANNELS: ("int64", (facts.channels,)),
        },
    )
    data, cut = serialize_around(example, keys.IMAGE_ENCODED, len(payload))
    return data[:cut], payload, data[cut:]


def _gif_first_frame(image: Image.Image, data: bytes, width: int, height: int) -> Image.Image:
    """A GIF's first frame as TensorFlow decodes it (gif_io.cc), in RGB: on a canvas of
    `width` x `height` (the widest and tallest frames, the probe's size, not Pillow's logical
    screen), the frame at its offset, clipped; what the frame does not cover, and its transparent
    pixels, black. Pillow's image is the logical screen, its uncovered part the background or
    transparent colour, and transparent pixels keep their palette colour: resized to the
    probe's size it was squeezed, and it did not decode as TensorFlow decodes the GIF."""
    left, top, frame_width, frame_height = next(image_formats.gif_frames(data))
    pixels = np.asarray(image.convert("RGB"))
    shown = np.zeros(pixels.shape[:2], dtype=bool)
    shown[top : top + frame_height, left : left + frame_width] = True
    transparency = image.info.get("transparency")
    if image.mode in ("P", "L") and isinstance(transparency, int):
        shown &= np.asarray(image) != transparency
    elif image.mode in ("LA", "RGBA", "PA"):
        shown &= np.asarray(image.getchannel("A")) != 0
    canvas = np.zeros((height, width, 3), dtype=np.uint8)
    rows, columns = min(height, pixels.shape[0]), min(width, pixels.shape[1])
    canvas[:rows, :columns] = np.where(shown[..., None], pixels, 0)[:rows, :columns]
    return Image.fromarray(canvas, "RGB")


def _converted(image: Image.Image, mode: str) -> Image.Image:
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        # Deep grey: scaled to 8 bits (a plain conversion clips everything above 255 to white).
        image = image.convert("I").point(lambda value: value * (1 / 257)).convert("L")
    if image.mode == mode:
        return image
    if image.mode == "P" and "transparency" in image.info and mode in ("L", "RGB"):
        image = image.convert("RGBA")  # the palette's transparent entry, then flattened
    return image.convert(mode)


def _draft(image: Image.Image, size: tuple[int, int], target: tuple[int, int]) -> None:
    """Lets libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale (DCT scaling, several times faster
    than a full decode) when the result is still at least twice the final size, so that Lanczos
    makes the last step, as Image.thumbnail's `reducing_gap` does. Deterministic: the scale
    depends on the sizes only."""
    scale = 2 * max(target[0] / size[0], target[1] / size[1])
    if scale < 1:
        image.draft(None, (math.ceil(image.width * scale), math.ceil(image.height * scale)))


def _resized(
    image: Image.Image, preprocessing: Preprocessing, target: tuple[int, int]
) -> Image.Image:
    width, height = target
    if (width, height) == image.size:
        return image
    if preprocessing.size is None:
        return image.resize((width, height), _FILTER)
    if preprocessing.mode == "pad":
        return _padded(image, (width, height))
    return ImageOps.fit(image, (width, height), method=_FILTER)


def _padded(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` fitted inside `size` and centred on black, as ImageOps.pad does; a side that
    ImageOps.contain would round to 0 pixels (a 1000×15 line into 32×32), which Pillow then
    cannot resize to, is kept at 1 pixel."""
    width, height = size
    ratio, target_ratio = image.width / image.height, width / height
    if ratio > target_ratio and round(image.height / image.width * width) == 0:
        inner = (width, 1)
    elif ratio < target_ratio and round(image.width / image.height * height) == 0:
        inner = (1, height)
    else:
        # An explicit colour: without one Pillow leaves the padding uninitialised.
        return ImageOps.pad(image, size, method=_FILTER, color=0)
    resized = image.resize(inner, _FILTER)
    padded = Image.new(image.mode, size, 0)
    palette = resized.getpalette() if resized.palette else None
    if palette is not None:
        padded.putpalette(palette)
    padded.paste(resized, (round((width - inner[0]) / 2), round((height - inner[1]) / 2)))
    return padded


def _save_options(fmt: str, quality: int | None) -> dict:
    """Fixed encoder parameters: the bytes depend on the pixels and these only."""
    if fmt == "jpeg":
        return {
            "format": "JPEG",
            "quality": quality or DEFAULT_QUALITY["jpeg"],
            "optimize": False,
            "progressive": False,
            "subsampling": "4:2:0",
        }
    if fmt == "webp":
        return {
            "format": "WEBP",
            "quality": quality or DEFAULT_QUALITY["webp"],
            "method": 4,
            "lossless": False,
            "exact": False,
        }
    return {"format": "PNG", "optimize": False, "compress_level": 6}


def _check_output_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise InputError(
            "ResizeTooLarge",
            f"resized to {width:,}x{height:,} the image would have more than "
            f"--max-image-pixels ({max_pixels:,}) pixels",
        )


def _check_output_side(fmt: str, width: int, height: int) -> None:
    limit = _MAX_SIDE.get(fmt)
    if limit is not None and max(width, height) > limit:
        raise InputError(
            "TooLargeForFormat",
            f"stored as {fmt.upper()} the image would be {width:,}x{height:,}, and {fmt.upper()} "
            f"holds at most {limit:,} pixels a side (--encode png holds it)",
        )


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = without_file_bytes(text)  # Pillow may quote the file's bytes
    return text if len(text) <= 160 else text[:157] + "..."
