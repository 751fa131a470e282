"""EXIF orientation: how a photo's pixels are to be turned for display; pure.

TensorFlow's decoders ignore it, so an image stored as it is is described as its pixels lie in
the file. Preprocessing turns the pixels as it says (as viewers do): a photo taken sideways is
stored with its width and height swapped. The probe reads the orientation from the header when
the run preprocesses (`probe_image(..., orientation=True)`), `Preprocessing.stored_facts`
predicts the stored size from it, and `preprocess` turns the pixels by that same value, so the
plan, the records' features and the manifest's image facts agree with the bytes stored.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from PIL import ExifTags, Image

UPRIGHT = 1
# The transposition each orientation asks for, as Pillow's ImageOps.exif_transpose applies it.
# exif_transpose itself is not used: it reads the tag again from the decoded image, where a
# PNG may have an eXIf chunk after its pixels that the header parse did not see, and the
# stored size must be the one predicted from the header.
_TRANSPOSES = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_TURNED = frozenset({5, 6, 7, 8})  # a quarter turn: width and height swap
# What Pillow's EXIF parser raises on a damaged block.
_EXIF_ERRORS = (SyntaxError, ValueError, OSError, EOFError, struct.error, IndexError, KeyError)


def orientation_in(info: Mapping) -> int:
    """The orientation (1-8) in an image's metadata as Pillow parses it into `Image.info`:
    the EXIF block's tag, else XMP's tiff:Orientation, read exactly as `Image.getexif` reads
    them. UPRIGHT when there is none, it is not one of the eight, or the block is damaged (a
    photo is not refused for its metadata)."""
    if not info.keys() & {"exif", "Raw profile type exif", "xmp", "XML:com.adobe.xmp"}:
        return UPRIGHT
    holder = Image.Image()  # Image.getexif reads an image's `info`, and decodes nothing
    holder.info = dict(info)
    try:
        value = holder.getexif().get(ExifTags.Base.Orientation, UPRIGHT)
    except _EXIF_ERRORS:
        return UPRIGHT
    return value if isinstance(value, int) and value in _TRANSPOSES else UPRIGHT


def oriented_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) of an image of this size in the file once turned as `orientation` says."""
    return (height, width) if orientation in _TURNED else (width, height)


def turned(image: Image.Image, orientation: int) -> Image.Image:
    """The image turned as `orientation` says, or the image itself if upright."""
    method = _TRANSPOSES.get(orientation)
    return image if method is None else image.transpose(method)
