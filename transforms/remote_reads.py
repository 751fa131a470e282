"""Opening object-store files for reads of a few small pieces (the image probe's header reads)."""

from __future__ import annotations

import io
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

# What one read that misses the reader's buffer fetches at least. Beam's GCS reader buffers
# 16 MiB by default (gcsio's read_buffer_size), so the probe's first 16 KiB read of an image
# downloaded all of it, up to 16 MiB, and 16 probes at a time held 16 such buffers. The probe
# reads its first 16 KiB, 64 KiB only when a header needs more, and the last few bytes
# (transforms.core.images): with this buffer each of those reads fetches about what it asks.
# Pillow's small reads, when a header runs past 64 KiB, are served from it 16 KiB at a time.
SMALL_READ_BUFFER_BYTES = 16 * 1024

# Objects up to this size are fetched whole, in one request: no more bytes than a probe may read
# anyway, and one round trip (tens of milliseconds on GCS) fewer than a first read and a read
# of the end would take.
WHOLE_OBJECT_MAX_BYTES = 64 * 1024


def open_for_small_reads(path: str) -> BinaryIO:
    """Opens a file (any Beam FileSystems path) to read a few pieces of it, not all of it.

    gs:// objects get a reader whose reads fetch about what they ask (small ones are read
    whole at once); other filesystems open as FileSystems.open opens them. Errors are those of
    FileSystems.open and of reading (a missing gs:// object raises the storage client's
    NotFound here, as there).
    """
    filesystem = FileSystems.get_filesystem(path)
    if filesystem.scheme() != "gs":
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    # The GcsIO that GCSFileSystem.open itself uses, built from the pipeline's options
    # (credentials, project, retries): only its read buffer differs. Beam's filesystem API has
    # no buffer size; tests/test_gcs_reads.py fails if this private call goes away.
    reader = filesystem._gcsIO().open(path, "rb", read_buffer_size=SMALL_READ_BUFFER_BYTES)
    size = reader.seek(0, io.SEEK_END)  # known since the reader was opened: no request
    if size > WHOLE_OBJECT_MAX_BYTES:
        reader.seek(0)
        return reader
    with reader:
        reader.seek(0)
        return io.BytesIO(reader.read(size))
