"""Damaged images (issue 15): caught where the writer reads their bytes, before a training run
meets them; `--check-pixels`; a file rewritten between probe and write."""

from __future__ import annotations

import io
import json
import os
import random
import struct
import zlib
from pathlib import Path

import pytest
from conftest import make_image, read_errors
from PIL import Image

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.integrity import check_pixels, check_structure
from recordforge.transforms.core.images.probe import probe_image_bytes
from recordforge.transforms.core.records import RecordRef
from recordforge.transforms.probe import probe_file
from recordforge.transforms.write import read_payload


def _photo(size=(900, 700), seed=0, fmt="JPEG", **save) -> bytes:
    """A photo-like picture (noise and shapes), large enough that the probe reads only its
    header and its end."""
    rng = random.Random(seed)
    image = Image.effect_noise(size, 40).convert("RGB")
    pixels = image.load()
    for _ in range(40):
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        pixels[x, y] = (255, 0, 0)
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def _kind(data: bytes) -> str | None:
    try:
        check_structure(data)
    except InputError as error:
        return error.kind
    return None


# --- what the structure checks accept and refuse ---------------------------------------------

VALID = {
    "jpeg": lambda p: make_image(p, "JPEG", size=(120, 80)),
    "jpeg_grey": lambda p: make_image(p, "JPEG", size=(50, 70), mode="L"),
    "jpeg_progressive": lambda p: make_image(p, "JPEG", size=(300, 200), progressive=True),
    "jpeg_cmyk": lambda p: make_image(p, "JPEG", size=(64, 48), mode="CMYK"),
    "jpeg_restart_markers": lambda p: _save(p, "JPEG", restart_marker_blocks=1),
    "png": lambda p: make_image(p, "PNG", size=(120, 80), mode="RGBA"),
    "png_interlaced": lambda p: make_image(p, "PNG", size=(33, 17), interlace=1),
    "png_16bit": lambda p: make_image(p, "PNG", size=(40, 30), mode="I;16"),
    "png_palette": lambda p: make_image(p, "PNG", size=(40, 30), mode="P"),
    "gif": lambda p: make_image(p, "GIF", size=(40, 40), mode="P"),
    "bmp": lambda p: make_image(p, "BMP", size=(31, 17)),
    "bmp_palette": lambda p: make_image(p, "BMP", size=(31, 17), mode="P"),
    "webp": lambda p: make_image(p, "WEBP", size=(50, 60)),
    "webp_lossless_alpha": lambda p: make_image(
        p, "WEBP", size=(50, 60), mode="RGBA", lossless=True
    ),
}


def _save(path: Path, fmt: str, **save) -> bytes:
    Image.effect_noise((160, 120), 30).convert("RGB").save(path, fmt, **save)
    return path.read_bytes()


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_images_pass_and_decode_with_tensorflow(name, tmp_path, tf):
    data = VALID[name](tmp_path / name)
    facts = probe_image_bytes(data)
    check_structure(data)
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert tuple(decoded.shape) == (facts.height, facts.width, facts.channels)


def test_a_jpeg_with_random_bytes_in_its_middle_is_refused_and_tensorflow_agrees(tf):
    # The file: 5 KB of random bytes in the middle, header and end intact. The probe
    # accepts it (it reads the header and the end); TensorFlow raises on it in training.
    data = bytearray(_photo(quality=95))
    middle = len(data) // 2
    data[middle : middle + 5000] = random.Random(1).randbytes(5000)
    data = bytes(data)
    probe_image_bytes(data)  # the header and the end look fine
    assert _kind(data) == "CorruptImage"
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(data, expand_animations=False)


def test_a_png_with_ff_bytes_in_its_middle_is_refused_and_tensorflow_agrees(tf):
    data = _photo(size=(600, 400), fmt="PNG")
    middle = len(data) // 2
    data = data[:middle] + b"\xff" * 2000 + data[middle + 2000 :]
    probe_image_bytes(data)
    with pytest.raises(InputError, match="the CRC of its IDAT chunk"):
        check_structure(data)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(data, expand_animations=False)


def _png_with_idat(data: bytes, idat: bytes) -> bytes:
    """The PNG with its image data replaced by `idat` (one chunk, a correct CRC)."""
    chunks, offset = [], 8
    while offset < len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        chunks.append((kind, data[offset + 8 : offset + 8 + length]))
        offset += 12 + length
    out = [data[:8]]
    replaced = False
    for kind, body in chunks:
        if kind == b"IDAT":
            if replaced:
                continue
            body, replaced = idat, True
        out.append(struct.pack(">I", len(body)) + kind + body)
        out.append(struct.pack(">I", zlib.crc32(kind + body)))
    return b"".join(out)


def _idat(data: bytes) -> bytes:
    offset, parts = 8, []
    while offset < len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        if kind == b"IDAT":
            parts.append(data[offset + 8 : offset + 8 + length])
        offset += 12 + length
    return b"".join(parts)


def test_a_png_whose_data_stream_ends_early_is_refused_though_every_crc_matches(tf):
    png = _photo(size=(200, 150), fmt="PNG")
    stream = _idat(png)
    cut = _png_with_idat(png, stream[: len(stream) * 2 // 3])
    with pytest.raises(InputError, match="ends before the end of its stream"):
        check_structure(cut)
    # A complete stream of too few rows: also refused.
    raw = zlib.decompress(stream)
    short = _png_with_idat(png, zlib.compress(raw[: len(raw) // 2]))
    with pytest.raises(InputError, match="where its size needs"):
        check_structure(short)
    for damaged in (cut, short):
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.io.decode_image(damaged, expand_animations=False)


def test_a_bmp_tensorflow_cannot_decode_is_refused_by_the_probe(tf):
    bmp = io.BytesIO()
    Image.new("RGB", (64, 48), "red").save(bmp, "BMP")
    for data, kind in (
        (bmp.getvalue() + b"appended", "CorruptImage"),  # TensorFlow wants the exact size
        (_one_bit_bmp(), "UnsupportedImageFormat"),
    ):
        with pytest.raises(InputError) as info:
            probe_image_bytes(data)
        assert info.value.kind == kind
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.io.decode_image(data, expand_animations=False)


def test_a_bmp_of_negative_width_is_corrupt_not_a_decompression_bomb(tf):
    # Pillow reads the signed width field as unsigned: -8 looked like 4,294,967,288 columns.
    bmp = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(bmp, "BMP")
    for width, words in ((-8, "negative (-8)"), (0, "0")):
        data = bytearray(bmp.getvalue())
        data[18:22] = struct.pack("<i", width)
        with pytest.raises(InputError) as info:
            probe_image_bytes(bytes(data))
        assert (info.value.kind, str(info.value)) == (
            "CorruptImage",
            f"the BMP file is corrupt: its width is {words}; TensorFlow decodes a positive "
            "width only",
        )
        with pytest.raises(tf.errors.InvalidArgumentError, match="Width must be positive"):
            tf.io.decode_image(bytes(data), expand_animations=False)


def test_a_webp_with_bytes_after_its_riff_chunk_is_not_called_truncated(tf):
    webp = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(webp, "WEBP")
    whole = webp.getvalue()
    longer = whole + b"junk" * 5
    probe_image_bytes(longer)  # decodes
    with pytest.raises(InputError) as info:
        check_structure(longer)
    assert (info.value.kind, str(info.value)) == (
        "CorruptImage",
        f"the WEBP file is corrupt: it has 20 bytes after its RIFF chunk (its header declares "
        f"{len(whole):,} bytes, the file has {len(whole) + 20:,})",
    )
    # TensorFlow (libwebp) reads the RIFF chunk and ignores the rest: longer, not truncated.
    assert tuple(tf.io.decode_image(longer, expand_animations=False).shape) == (8, 8, 3)
    with pytest.raises(InputError) as info:
        check_structure(whole[:-8])
    assert info.value.kind == "TruncatedImage"


def _one_bit_bmp() -> bytes:
    out = io.BytesIO()
    Image.new("1", (64, 48)).save(out, "BMP")
    return out.getvalue()


def test_a_png_with_a_bad_row_filter_passes_the_structure_check_but_not_check_pixels(tf):
    # CRCs and stream intact, a row's filter byte impossible: only a decoder finds it.
    png = _photo(size=(64, 48), fmt="PNG")
    raw = bytearray(zlib.decompress(_idat(png)))
    raw[0] = 9  # filter types are 0-4
    damaged = _png_with_idat(png, zlib.compress(bytes(raw)))
    check_structure(damaged)
    with pytest.raises(InputError) as info:
        check_pixels(damaged)
    assert info.value.kind == "CorruptImage"
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(damaged, expand_animations=False)


def test_no_message_quotes_the_files_bytes():
    secret = b"\x89PNG\r\n\x1a\nroot:x:0:0:secret-password"
    for data in (secret, b"GIF89a" + b"password" * 10, b"\xff\xd8\xffpassword" * 5):
        for check in (probe_image_bytes, check_structure):
            try:
                check(data)
            except InputError as error:
                assert "password" not in error.message and "root:x" not in error.message


# --- in a conversion -----------------------------------------------------------------------------


def test_damaged_images_become_write_errors_and_every_record_decodes(tmp_path, cli, tf):
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    good = [_photo(seed=i, quality=90) for i in range(4)]
    for i, data in enumerate(good):
        (root / ("a" if i % 2 else "b") / f"{i}.jpg").write_bytes(data)
    jpeg = bytearray(good[0])
    jpeg[len(jpeg) // 2 : len(jpeg) // 2 + 5000] = random.Random(2).randbytes(5000)
    (root / "a" / "random-middle.jpg").write_bytes(bytes(jpeg))
    png = _photo(size=(600, 400), fmt="PNG")
    middle = len(png) // 2
    (root / "b" / "ff-middle.png").write_bytes(png[:middle] + b"\xff" * 2000 + png[middle + 2000 :])
    out = tmp_path / "out"
    result = cli("convert", root, "-o", out)
    assert result.returncode == 0, result.stderr
    errors = {Path(e["source"]["path"]).name: (e["stage"], e["error"]) for e in read_errors(out)}
    assert errors == {
        "random-middle.jpg": ("write", "CorruptImage"),
        "ff-middle.png": ("write", "CorruptImage"),
    }
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["num_records"] == 4 and manifest["num_inputs"] == 6
    assert cli("verify", out).returncode == 0
    from recordforge import iterate

    for record in iterate(str(out), "train"):
        tf.io.decode_image(record["image/encoded"][0], expand_animations=False)


def test_check_pixels_decodes_every_image(tmp_path, cli):
    root = tmp_path / "photos"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.png").write_bytes(_photo(size=(64, 48), seed=i, fmt="PNG"))
    png = _photo(size=(64, 48), fmt="PNG")
    raw = bytearray(zlib.decompress(_idat(png)))
    raw[0] = 9
    (root / "bad-filter.png").write_bytes(_png_with_idat(png, zlib.compress(bytes(raw))))
    plain, checked = tmp_path / "plain", tmp_path / "checked"
    assert cli("convert", root, "-o", plain).returncode == 0
    assert json.loads((plain / "dataset_info.json").read_text())["num_records"] == 4
    result = cli("convert", root, "-o", checked, "--check-pixels")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((checked / "dataset_info.json").read_text())
    assert manifest["num_records"] == 3 and manifest["options"]["check_pixels"] is True
    ((stage, kind),) = {(e["stage"], e["error"]) for e in read_errors(checked)}
    assert (stage, kind) == ("write", "CorruptImage")


# --- a file that changes between probe and write -----------------------------------------------


def _ref_of(path, info) -> RecordRef:
    return RecordRef(
        split="train",
        order=b"",
        size=0,
        example=b"",
        payload_path=str(path),
        payload_size=info.size,
        path=str(path),
        row=None,
        payload_version=info.version,
    )


def test_a_file_rewritten_with_the_same_size_is_file_changed(tmp_path):
    # The issue: a file rewritten (same size) during the run got a record with the old
    # width and height.
    path = tmp_path / "x.png"
    path.write_bytes(make_image(tmp_path / "a.png", "PNG", size=(64, 48), seed=1))
    info = probe_file(str(path), 10**8)
    assert info.version == os.stat(path).st_mtime_ns
    assert read_payload(_ref_of(path, info)) == path.read_bytes()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))
    os.utime(path, ns=(info.version + 10**9, info.version + 10**9))
    with pytest.raises(InputError) as error:
        read_payload(_ref_of(path, info))
    assert error.value.kind == "FileChanged" and "rewritten" in error.value.message


def test_a_file_rewritten_in_place_while_it_is_read_is_file_changed(tmp_path):
    """A rewrite in place that begins after the writer's check of the file (the same size and
    modification time as probed) and lands while the bytes are read: the record would hold the
    start of one version and the end of another (a BMP of two same-sized pictures passes every
    structure check). Regression: found with a process that overwrote a 19 MB BMP in place when
    the writer opened it: the stored image was 174 rows of the old picture and 2,323 of the new,
    and no error."""
    path = tmp_path / "x.bmp"
    old = make_image(tmp_path / "old.bmp", "BMP", size=(64, 48), seed=1)
    new = make_image(tmp_path / "new.bmp", "BMP", size=(64, 48), seed=2)
    assert len(old) == len(new) and old != new
    path.write_bytes(old)
    info = probe_file(str(path), 10**8)

    class RewrittenWhileRead(io.RawIOBase):
        """The file as opened, rewritten in place by another process half-way through the
        read (its modification time moves on)."""

        def __init__(self):
            self._file = open(path, "rb")  # noqa: SIM115 - closed in close()

        def fileno(self):
            return self._file.fileno()

        def read(self, n=-1):
            first = self._file.read(len(old) // 2)
            with open(path, "r+b") as writer:
                writer.write(new)
            os.utime(path, ns=(info.version + 10**9, info.version + 10**9))
            return first + self._file.read()

        def close(self):
            self._file.close()
            super().close()

    with pytest.raises(InputError) as error:
        read_payload(_ref_of(path, info), RewrittenWhileRead())
    assert error.value.kind == "FileChanged" and "while it was read" in error.value.message


def test_a_file_that_changed_size_is_file_changed(tmp_path):
    path = tmp_path / "x.jpg"
    path.write_bytes(make_image(tmp_path / "a.jpg", "JPEG", size=(64, 48)))
    info = probe_file(str(path), 10**8)
    path.write_bytes(path.read_bytes() + b"more")
    with pytest.raises(InputError) as error:
        read_payload(_ref_of(path, info))
    assert error.value.kind == "FileChanged" and "bytes when probed" in error.value.message


def test_an_object_rewritten_on_gs_with_the_same_size_is_file_changed(gcs, bucket, tmp_path):
    # On gs:// the object's generation tells a rewrite (a new upload makes a new one).
    blob = gcs.client().bucket(bucket).blob("in/x.png")
    data = make_image(tmp_path / "x.png", "PNG", size=(64, 48), seed=1)
    blob.upload_from_string(data)
    path = f"gs://{bucket}/in/x.png"
    info = probe_file(path, 10**8)
    assert info.version > 0
    ref = _ref_of(path, info)
    assert read_payload(ref) == data
    changed = bytearray(data)
    changed[-20] ^= 0xFF
    blob.upload_from_string(bytes(changed))  # the same size
    with pytest.raises(InputError) as error:
        read_payload(ref)
    assert error.value.kind == "FileChanged" and "another generation" in error.value.message
