"""Opening object-store files: refusing content-encoded gs:// objects, and reads of a few pieces."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
from collections.abc import Iterator
from typing import BinaryIO

from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.files.filenames import to_os
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.internals import gcs_object, open_gcs_reader

# What one read that misses the reader's buffer fetches at least. Beam's GCS reader buffers
# 16 MiB by default (gcsio's read_buffer_size), so the probe's first 16 KiB read of an image
# downloaded all of it, up to 16 MiB, and 16 probes at a time held 16 such buffers. The probe
# reads its first 16 KiB, 64 KiB only when a header needs more, and the last few bytes
# (transforms.core.images.probe): with this buffer each of those reads fetches about what it asks.
# Pillow's small reads, when a header runs past 64 KiB, are served from it 16 KiB at a time.
SMALL_READ_BUFFER_BYTES = 16 * 1024

# Objects up to this size are fetched whole, in one request: no more bytes than a probe may read
# anyway, and one round trip (tens of milliseconds on GCS) fewer than a first read and a read
# of the end would take.
WHOLE_OBJECT_MAX_BYTES = 64 * 1024


class EncodedObjectError(OSError):
    """A gs:// object stored with a Content-Encoding (`gsutil cp -Z` stores files gzipped so).

    Beam's GCS reader hands out such an object's bytes as stored, compressed (it asks for the
    raw download, and its size is the compressed size), and refuses one whose content type is
    gzip as well. Read as the file they stand for, those bytes would be wrong, so the object is
    refused: an OSError, which every reader already reports against the file it was reading.
    """

    def __init__(self, path: str, encoding: str) -> None:
        super().__init__(
            f"{path} is stored with Content-Encoding: {encoding} (as `gsutil cp -Z` and "
            "`gcloud storage cp --gzip-local-all` store files), which recordforge does not "
            "read; upload the file again without that option"
        )


def open_file(path: str, compression_type: str = CompressionTypes.UNCOMPRESSED) -> BinaryIO:
    """FileSystems.open(path, compression_type=...), refusing content-encoded gs:// objects.

    Raises:
        EncodedObjectError: a gs:// object stored with a Content-Encoding.
        Otherwise what FileSystems.open raises.
    """
    if not has_scheme(path):
        path = to_os(path)  # a name that is not UTF-8 (transforms.core.files.filenames)
    if FileSystems.get_filesystem(path).scheme() != "gs":
        return FileSystems.open(path, compression_type=compression_type)
    try:
        raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except NotImplementedError as error:  # Beam's "Doubly compressed files not supported."
        raise EncodedObjectError(path, "gzip") from error
    _refuse_encoded(raw, path)
    # What GCSFileSystem.open does with the compression type, around the checked reader.
    if compression_type == CompressionTypes.AUTO:
        compression_type = CompressionTypes.detect_compression_type(path)
    if compression_type == CompressionTypes.UNCOMPRESSED:
        return raw
    return CompressedFile(raw, compression_type=compression_type)


def _refuse_encoded(reader, path: str) -> None:
    """Close and refuse a gs:// reader (Beam's BeamBlobReader) of a content-encoded object."""
    # The reader reloaded the object's metadata when it was opened: no request. Read without
    # a fallback, so that a google-cloud-storage without the attribute fails loudly (and
    # tests/test_gcs_encoded.py with it) instead of letting encoded objects through.
    encoding = gcs_object(reader).content_encoding
    if encoding and encoding != "identity":
        reader.close()
        raise EncodedObjectError(path, encoding)


def object_version(reader) -> int:
    """The generation of the gs:// object a reader from open_file reads (a rewrite makes a new
    one), or -1 for other filesystems."""
    try:
        blob = gcs_object(reader)
    except AttributeError:  # not a gs:// reader
        return -1
    generation = getattr(blob, "generation", None)
    return int(generation) if generation is not None else -1


def open_for_small_reads(path: str) -> tuple[BinaryIO, int]:
    """Opens a file (any Beam FileSystems path) to read a few pieces of it, not all of it.

    gs:// objects get a reader whose reads fetch about what they ask (small ones are read
    whole at once); other filesystems open as FileSystems.open opens them. Errors are those of
    open_file and of reading (a missing gs:// object raises the storage client's NotFound
    here, as there).

    Returns:
        The stream, and the object's version (object_version).
    """
    filesystem = FileSystems.get_filesystem(path)
    if filesystem.scheme() != "gs":
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED), -1
    # tests/test_gcs_reads.py fails if this private call goes away.
    try:
        reader = open_gcs_reader(filesystem, path, SMALL_READ_BUFFER_BYTES)
    except NotImplementedError as error:  # as in open_file
        raise EncodedObjectError(path, "gzip") from error
    _refuse_encoded(reader, path)
    version = object_version(reader)
    size = reader.seek(0, io.SEEK_END)  # known since the reader was opened: no request
    if size > WHOLE_OBJECT_MAX_BYTES:
        reader.seek(0)
        return reader, version
    with reader:
        reader.seek(0)
        return io.BytesIO(reader.read(size)), version


class _CountingReader(io.RawIOBase):
    """A read-only stream over another that counts the bytes read through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:
            got = readinto(buffer) or 0
        else:
            data = self._stream.read(len(buffer))
            got = len(data)
            buffer[:got] = data
        self.count += got
        return got


class OpenedCsv:
    """A CSV file opened for reading: `stream` gives its text (decompressed: a `.gz` name is
    gzip), `stored_bytes` how much of the stored file was consumed, `stored_size` its size."""

    def __init__(
        self, stream: BinaryIO, counter: _CountingReader, stored_size: int, compressed: bool
    ) -> None:
        self.stream = stream
        self._counter = counter
        self.stored_size = stored_size
        self.compressed = compressed

    @property
    def stored_bytes(self) -> int:
        return self._counter.count


@contextlib.contextmanager
def open_csv(path: str) -> Iterator[OpenedCsv]:
    """Open a CSV file (any Beam filesystem) to read it to its end, and to tell that it was.

    A `.gz` file is decompressed with Python's gzip module, which checks the data's CRC and
    length and raises when the compressed data ends early or is damaged (Beam's decompressor
    takes a file cut in half for a complete one).

    Raises:
        What open_file raises.
    """
    with open_file(path) as raw:
        size = _stored_size(raw)
        counter = _CountingReader(raw)
        buffered = io.BufferedReader(counter, 1 << 20)
        if path.lower().endswith(".gz"):
            with gzip.GzipFile(fileobj=buffered, mode="rb") as text:
                yield OpenedCsv(text, counter, size, compressed=True)
        else:
            yield OpenedCsv(buffered, counter, size, compressed=False)


@contextlib.contextmanager
def open_csv_range(path: str, start: int, end: int) -> Iterator[OpenedCsv]:
    """Open bytes [start, end) of an uncompressed CSV file (any Beam filesystem), as open_csv
    opens the whole file: `stream` ends at `end`, `stored_bytes` counts the range's bytes
    consumed, `stored_size` is the file's size.

    Raises:
        What open_file raises.
    """
    with open_file(path) as raw:
        size = _stored_size(raw)
        raw.seek(start)
        # The bound is below the buffer, so that its read-ahead stops at the range's end.
        counter = _CountingReader(_Bounded(raw, end - start))
        yield OpenedCsv(io.BufferedReader(counter, 1 << 20), counter, size, compressed=False)


class _Bounded(io.RawIOBase):
    """The next `size` bytes of a stream, then end-of-file."""

    def __init__(self, stream: BinaryIO, size: int) -> None:
        self._stream = stream
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: self._left]
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:
            got = readinto(view) or 0
        else:
            data = self._stream.read(len(view))
            got = len(data)
            view[:got] = data
        self._left -= got
        return got


def _stored_size(stream) -> int:
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):
        pass
    position = stream.tell()
    size = stream.seek(0, io.SEEK_END)
    stream.seek(position)
    return size
