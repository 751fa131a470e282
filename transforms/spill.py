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

import uuid
from collections.abc import Iterable, Iterator

import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.core.records import RefPiece, SpilledPiece

SPILL_PREFIX = "spill-"


class SpillWriter:
    """Appends pieces to one new spill file in `folder` (created at the first piece).

    Use as a context manager, or call `close`: a piece can be read back once the file is
    closed. Each writer names its file afresh, so a retried bundle never appends to the file
    of a failed attempt (whose pieces nothing refers to).
    """

    def __init__(self, folder: str) -> None:
        self._path = FileSystems.join(folder, f"{SPILL_PREFIX}{uuid.uuid4().hex}.arrows")
        self._file = None
        self._offset = 0

    def add(self, batch: pa.RecordBatch) -> SpilledPiece:
        """Append `batch`; return where it is."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as stream:
            stream.write_batch(batch)
        data = sink.getvalue()
        if self._file is None:
            self._file = FileSystems.create(
                self._path, compression_type=CompressionTypes.UNCOMPRESSED
            )
        self._file.write(memoryview(data))
        piece = SpilledPiece(self._path, self._offset, data.size, batch.num_rows)
        self._offset += data.size
        return piece

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> SpillWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
