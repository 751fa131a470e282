"""Encoded table records parked in temporary files, so only references cross the shuffle.

A table's records are its payload: grouping them by shard would move every encoded byte
through the runner's shuffle, and a local runner (FnApiRunner) holds a whole shuffle in memory.
Instead the step that encodes them appends each piece (a RecordBatch of RecordRefs, one shard's
records of one block of rows) to a spill file in the run's temporary folder as an Arrow IPC
stream, and the shuffle carries a SpilledPiece: file, byte range and row count. The shard
writer reads back its own pieces only (one ranged read each), so each input byte is written
and read once more, and the writer holds one shard at a time. The commit removes the folder.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator

import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.records import RefPiece, SpilledPiece

SPILL_PREFIX = "spill-"


class SpillWriter:
    """Appends pieces to one new spill file in `folder` (created at the first piece).

    Use as a context manager, or call `close`: a piece can be read back once the file is
    closed. Each writer names its file afresh, so a retried bundle never appends to the file
    of a failed attempt (whose pieces nothing refers to). A failed bundle's writer is
    discarded (`discard`, or leaving the context with an exception).
    """

    def __init__(self, folder: str) -> None:
        self._path = FileSystems.join(folder, f"{SPILL_PREFIX}{uuid.uuid4().hex}.arrows")
        self._file: _CountingFile | None = None
        self._sink: pa.PythonFile | None = None

    def add(self, batch: pa.RecordBatch) -> SpilledPiece:
        """Append `batch`; return where it is."""
        if self._file is None:
            self._file = _CountingFile(
                FileSystems.create(self._path, compression_type=CompressionTypes.UNCOMPRESSED),
                self._path,
            )
            self._sink = pa.PythonFile(self._file, mode="w")
        start = self._file.written
        # Written straight to the file (pyarrow hands over its buffers as they are): no copy
        # of the batch into one serialized buffer first.
        with pa.ipc.new_stream(self._sink, batch.schema) as stream:
            stream.write_batch(batch)
        return SpilledPiece(self._path, start, self._file.written - start, batch.num_rows)

    def close(self) -> None:
        if self._file is not None:
            self._sink.close()  # closes the file too
            self._file = self._sink = None

    def discard(self) -> None:
        """Close and delete the file of a failed bundle, now. Left open, it would be closed
        whenever the garbage collector frees the writer, and on an object store that close
        completes the upload: a spill file would appear in the run's working folder after a
        failed run had removed it."""
        if self._file is None:
            return
        with contextlib.suppress(Exception):  # the failure may be the store's own
            self._sink.close()
        self._file = self._sink = None
        with contextlib.suppress(Exception):
            FileSystems.delete([self._path])

    def __enter__(self) -> SpillWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


class _CountingFile:
    """A writable file object that counts the bytes written (remote files may not `tell`).

    An OSError of a write names the file (a write to an open file names none), so that a full
    disk is reported with its path.
    """

    def __init__(self, file, path: str) -> None:
        self._file = file
        self._path = path
        self.written = 0
        self.closed = False

    def write(self, data) -> int:
        with self._named_errors():
            self._file.write(data)
        size = memoryview(data).nbytes
        self.written += size
        return size

    def flush(self) -> None:
        with self._named_errors():
            self._file.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with self._named_errors():
                self._file.close()

    @contextlib.contextmanager
    def _named_errors(self):
        try:
            yield
        except OSError as error:
            if error.filename is not None or not error.errno:
                raise
            raise OSError(error.errno, error.strerror, self._path) from error


def unspilled(pieces: Iterable[RefPiece | SpilledPiece]) -> Iterator[RefPiece]:
    """The pieces with every SpilledPiece read back as its RecordBatch (others as they are).

    Spilled pieces are read file by file, in offset order, one ranged read each.
    """
    by_file: dict[str, list[SpilledPiece]] = {}
    for piece in pieces:
        if isinstance(piece, SpilledPiece):
            by_file.setdefault(piece.path, []).append(piece)
        else:
            yield piece
    for path in sorted(by_file):
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for piece in sorted(by_file[path], key=lambda p: p.offset):
                f.seek(piece.offset)
                data = f.read(piece.length)
                if len(data) != piece.length:
                    raise RuntimeError(
                        f"spill file {path} ends before {piece.offset + piece.length} bytes"
                    )
                batch = pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()
                if batch.num_rows != piece.rows:
                    raise RuntimeError(f"spill file {path}: a piece lost records")
                yield batch
