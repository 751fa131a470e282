"""Writing: each shard streamed to a staged file in order-key order; the commit puts it in place.

Each shard is written under a name of its own attempt in the run's parts folder, with a part
record beside it once it is complete (transforms/core/files/parts.py): a resumed run keeps a staged
shard whose fingerprint matches and whose size and CRC32C check out, instead of writing it
again.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import gzip
import io
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, NamedTuple

import apache_beam as beam
import google_crc32c
import numpy as np
import pyarrow.compute as pc
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.errors import (
    FileNameTooLong,
    InputError,
    OutOfSpace,
    ResumeRefused,
    out_of_space_message,
)
from recordforge.transforms.core.files.confine import check_allowed, is_within, real_path
from recordforge.transforms.core.files.filenames import display, to_os
from recordforge.transforms.core.files.local_files import open_hinted, open_regular
from recordforge.transforms.core.files.naming import (
    errors_file_name,
    index_file_name,
    shard_file_name,
)
from recordforge.transforms.core.files.parts import (
    PART_RECORD_SUFFIX,
    PartRecord,
    shard_fingerprint,
    source_files,
)
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.core.images.integrity import check_pixels, check_structure
from recordforge.transforms.core.images.preprocess import Preprocessing, preprocess, stored_record
from recordforge.transforms.core.images.probe import DEFAULT_MAX_PIXELS
from recordforge.transforms.core.planning.sharding import SplitLayout
from recordforge.transforms.core.records import (
    STAGE_WRITE,
    ErrorFileResult,
    ErrorRecord,
    RecordRef,
    ShardResult,
    in_order,
    ref_table,
    refs_of,
    sort_order,
)
from recordforge.transforms.core.tfrecord.frame_columns import (
    frame_in_order,
    index_lines,
    record_lengths,
)
from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES, framing_of
from recordforge.transforms.progress import BYTES_WRITTEN, LOGGER, RECORDS_WRITTEN, counter
from recordforge.transforms.remote_reads import object_version, open_file
from recordforge.transforms.spill import unspilled
from recordforge.transforms.storage_errors import (
    STORAGE_ERRORS,
    raise_process_limit,
    storage_reason,
)

ERRORS = "errors"
# Image reads in flight per shard writer: hides object-store latency, bounded by bytes in memory.
_READ_THREADS = 8
_READ_AHEAD_BYTES = 64 << 20
_FRAMES_PER_WRITE = 4096
# Images decoded at once in a worker process (--resize/--encode), whatever its threads and DoFns.
_DECODE_SLOTS = threading.BoundedSemaphore(max(1, min(_READ_THREADS, os.cpu_count() or 1)))
_CHECK_CHUNK = 8 << 20


class WriteShards(beam.PTransform):
    """((split, shard), RefPiece or SpilledPiece) pieces → shard files, one per (split, shard).

    Outputs (tagged):
        main: PCollection[ShardResult], one per shard file staged in `parts` (with its index
            file when `write_index`: uncompressed shards only); the commit puts them in place.
        errors: PCollection[ErrorRecord] for images that vanished or changed since probing, or
            whose bytes are damaged (`image_checks`).
    Nothing is written when the `proceed` side input is False (too many inputs already failed).
    With `resume`, a shard staged by an earlier run of the same inputs and options is kept.
    """

    def __init__(
        self,
        parts: str,
        name: str,
        compression: str,
        layouts,
        proceed,
        write_index: bool = False,
        image_checks: ImageChecks | None = None,
        *,
        run_key: str = "",
        resume: bool = False,
    ):
        super().__init__()
        self._fn = _WriteShardFn(
            parts,
            name,
            compression,
            write_index,
            image_checks,
            run_key=run_key,
            resume=resume,
        )
        self._layouts = layouts
        self._proceed = proceed

    def expand(self, assigned):
        return (
            assigned
            # (split, shard) → Iterable[RecordBatch]: references only (image bytes are read
            # below), in pieces as the batches were cut.
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard"
            >> beam.ParDo(
                self._fn,
                beam.pvalue.AsSingleton(self._layouts),
                beam.pvalue.AsSingleton(self._proceed),
            ).with_outputs(ERRORS, main="shards")
        )


class _WriteShardFn(beam.DoFn):
    def __init__(
        self,
        parts: str,
        name: str,
        compression: str,
        write_index: bool,
        image_checks: ImageChecks | None = None,
        *,
        run_key: str = "",
        resume: bool = False,
    ) -> None:
        if write_index and compression != "none":
            raise ValueError("index files locate records in uncompressed shards only")
        self._parts = parts
        self._name = name
        self._compression = compression
        self._write_index = write_index
        self._checks = image_checks or _STRUCTURE_ONLY
        self._run_key = run_key
        self._resume = resume

    def setup(self):
        self._pool = ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="recordforge-read")
        self._staged = StagedParts(self._parts) if self._resume else None
        self._records_written = counter(RECORDS_WRITTEN)
        self._bytes_written = counter(BYTES_WRITTEN)

    def teardown(self):
        self._pool.shutdown(wait=True)

    def process(self, element, layouts: Mapping[str, SplitLayout], proceed: bool):
        if not proceed:
            return
        (split, index), pieces = element
        num_shards = layouts[split].plan.num_shards
        final_name = shard_file_name(self._name, split, index, num_shards, self._compression)
        records = ref_table(unspilled(pieces))
        order = sort_order(records)
        fingerprint = shard_fingerprint(
            records,
            order,
            run_key=self._run_key,
            split=split,
            index=index,
            num_shards=num_shards,
            sources={path: source_identity(path) for path in source_files(records)},
        )
        if self._staged is not None:
            kept = self._staged.find(final_name, split, index, num_shards, fingerprint)
            if kept is not None:
                LOGGER.info("kept %s: staged by an earlier run", final_name)
                self._records_written.inc(len(records))
                self._bytes_written.inc(pc.sum(records.column("size")).as_py() or 0)
                yield _result_of(kept, self._parts)
                return
        try:
            yield from self._write(
                split, index, num_shards, final_name, records, order, fingerprint
            )
        except OSError as error:
            raise_if_out_of_space(error, f"shard {final_name}", self._parts)
            if error.errno == errno.ENAMETOOLONG:
                # A split name from the data (--split-column) or reshard's input: the name
                # options are checked before the run (preflight.check_file_name_lengths).
                written = os.path.basename(os.fsdecode(error.filename or final_name))
                raise FileNameTooLong(
                    f"cannot write shard {final_name[:60]}...: its file name, "
                    f"{len(os.fsencode(written)):,} bytes as it is written, is too long for the "
                    f"file system ({error.strerror}); shorten --name or the split name "
                    f"{split[:40]!r}"
                ) from error
            raise

    def _write(self, split, index, num_shards, final_name, records, order, fingerprint):
        index_name = index_file_name(final_name) if self._write_index else None
        # Unique names per attempt: a retried bundle never appends to a stale file.
        attempt = uuid.uuid4().hex
        staged_name = f"{final_name}.{attempt}"
        temp = FileSystems.join(self._parts, staged_name)
        temp_index = (
            # Flat in the parts folder; the commit moves it into the index folder.
            FileSystems.join(self._parts, f"{index_name.rsplit('/', 1)[-1]}.{attempt}")
            if index_name
            else None
        )
        count = 0
        labels = collections.Counter()  # class id → records written, for the manifest
        with contextlib.ExitStack() as files:
            sink = _CountingSink(files.enter_context(_create(temp)))
            index_out = (
                _CountingSink(files.enter_context(_create(temp_index))) if temp_index else None
            )
            stream = (
                gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0)
                if (self._compression == "gzip")
                else sink
            )
            if records.column("payload_path").null_count == len(records):
                # Every record is complete already (tables): framed in bulk.
                count = _write_complete(records, order, stream, labels, index_out)
                self._records_written.inc(count)
                self._bytes_written.inc(pc.sum(records.column("size")).as_py() or 0)
                refs = []
            else:
                refs = refs_of(in_order(records, order))
            progress = _WriteProgress(self._records_written, self._bytes_written)
            for ref, fetch in _read_ahead(refs, self._pool, self._checks):
                progress.add(ref.size)
                try:
                    pieces = _materialize(ref, fetch, self._checks)
                except InputError as error:
                    record_error = ErrorRecord(
                        ref.path, ref.row, STAGE_WRITE, error.kind, error.message
                    )
                    yield beam.pvalue.TaggedOutput(ERRORS, record_error)
                    continue
                header, footer = framing_of(pieces)
                framed_size = len(header) + sum(len(piece) for piece in pieces) + len(footer)
                # A preprocessed image's size is known only now: the plan had an estimate.
                if framed_size != ref.size and not self._checks.preprocessing.active:
                    raise RuntimeError(
                        f"record of {ref.path} is {framed_size} bytes, planned {ref.size}"
                    )
                if index_out is not None:
                    # DALI's and the `tfrecord` package's index: offset and framed length.
                    index_out.write(f"{sink.size} {framed_size}\n".encode())
                _write_framed(stream, header, pieces, footer, whole=stream is not sink)
                count += 1
                if ref.label is not None:
                    labels[ref.label] += 1
            progress.flush()
            if stream is not sink:
                stream.close()  # writes the gzip trailer; the files are closed by the stack
        part = PartRecord(
            file=final_name,
            split=split,
            index=index,
            num_shards=num_shards,
            num_records=count,
            num_bytes=sink.size,
            crc32c=sink.crc32c,
            fingerprint=fingerprint,
            staged=staged_name,
            index_file=index_name,
            index_staged=FileSystems.split(temp_index)[1] if temp_index else None,
            index_bytes=index_out.size if index_out else 0,
            index_crc32c=index_out.crc32c if index_out else 0,
            label_counts=tuple(sorted(labels.items())),
        )
        # The record goes last: its presence says the shard's files are complete.
        write_atomically(
            FileSystems.join(self._parts, staged_name + PART_RECORD_SUFFIX),
            self._parts,
            lambda f: f.write(part.to_json().encode()),
        )
        LOGGER.info("wrote %s: %s records, %s bytes", final_name, f"{count:,}", f"{sink.size:,}")
        yield _result_of(part, self._parts)


class _WriteProgress:
    """Records written (or quarantined) and their planned bytes, into the progress counters
    every few hundred records: often enough for a bar, rarely enough to cost nothing."""

    _EVERY = 256

    def __init__(self, records, num_bytes) -> None:
        self._records, self._bytes = records, num_bytes
        self._pending_records = self._pending_bytes = 0

    def add(self, size: int) -> None:
        self._pending_records += 1
        self._pending_bytes += size
        if self._pending_records >= self._EVERY:
            self.flush()

    def flush(self) -> None:
        if self._pending_records:
            self._records.inc(self._pending_records)
            self._bytes.inc(self._pending_bytes)
            self._pending_records = self._pending_bytes = 0


def _result_of(part: PartRecord, parts: str) -> ShardResult:
    """The ShardResult of a staged shard: the commit puts its files in place."""
    staged = [(FileSystems.join(parts, part.staged), part.file)]
    if part.index_file:
        staged.append((FileSystems.join(parts, part.index_staged), part.index_file))
    return ShardResult(
        part.split,
        part.index,
        part.num_shards,
        part.file,
        part.num_records,
        part.num_bytes,
        index_file=part.index_file,
        label_counts=part.label_counts,
        staged=tuple(staged),
    )


def source_identity(path: str) -> tuple:
    """What tells a file apart from a changed copy of it without reading it: size and, for a
    local file, its modification time (an object's size only: asking a store for every
    image's metadata would cost a request each)."""
    if has_scheme(path):
        return ("remote",)
    try:
        info = os.stat(to_os(path))  # pipeline text: a name that is not UTF-8 is escaped
    except (OSError, ValueError):  # ValueError: a NUL byte, which no file name holds
        return ("missing",)
    return (info.st_size, info.st_mtime_ns)


class StagedParts:
    """The part records an earlier run left in a parts folder, by shard file name."""

    def __init__(self, parts: str) -> None:
        self._parts = parts
        self._by_file: dict[str, list[str]] | None = None

    def _records(self) -> dict[str, list[str]]:
        if self._by_file is None:
            self._by_file = collections.defaultdict(list)
            try:
                (matched,) = FileSystems.match(
                    [FileSystems.join(self._parts, "*" + PART_RECORD_SUFFIX)]
                )
                paths = [m.path for m in matched.metadata_list]
            except BeamIOError:
                paths = []
            for path in sorted(paths):
                name = FileSystems.split(path)[1]
                self._by_file[name.rsplit(".", 3)[0]].append(path)
        return self._by_file

    def find(
        self, file: str, split: str, index: int, num_shards: int, fingerprint: str
    ) -> PartRecord | None:
        """The staged shard `file` made from the same inputs, checked; None when there is none.

        Raises:
            ResumeRefused: a shard of the same split and position was staged from other
                inputs or with another plan.
        """
        records = self._records()
        for path in records.get(file, ()):
            part = _read_part(path)
            if part is None:
                continue
            if part.fingerprint != fingerprint:
                raise ResumeRefused(
                    f"the inputs changed since the interrupted run: shard {file} is now made "
                    "of other records or files (added, removed or modified); rerun without "
                    "--resume to start over"
                )
            if _intact(self._parts, part):
                return part
        for other, paths in records.items():
            if other != file and paths and _same_position(other, file):
                raise ResumeRefused(
                    f"the inputs changed since the interrupted run: it planned {other}, this "
                    f"run plans {file}; rerun without --resume to start over"
                )
        return None


def _same_position(staged_file: str, planned_file: str) -> bool:
    # Same dataset, split and shard index, another shard count: the plan changed.
    return staged_file.rsplit("-of-", 1)[0] == planned_file.rsplit("-of-", 1)[0]


def _read_part(path: str) -> PartRecord | None:
    try:
        with open_file(path) as f:
            return PartRecord.from_json(f.read().decode("utf-8"))
    except (*STORAGE_ERRORS, ValueError, TypeError, KeyError):
        return None  # not a record of ours, or of another version: the shard is written again


def _intact(parts: str, part: PartRecord) -> bool:
    """Whether the staged files have the recorded sizes and CRC32Cs."""
    checks = [(part.staged, part.num_bytes, part.crc32c)]
    if part.index_file:
        checks.append((part.index_staged, part.index_bytes, part.index_crc32c))
    for name, size, crc in checks:
        try:
            found_size, found_crc = _size_and_crc(FileSystems.join(parts, name))
        except STORAGE_ERRORS:
            return False
        if (found_size, found_crc) != (size, crc):
            return False
    return True


def _size_and_crc(path: str) -> tuple[int, int]:
    size, crc = 0, 0
    with open_file(path) as f:
        while chunk := f.read(_CHECK_CHUNK):
            size += len(chunk)
            crc = google_crc32c.extend(crc, chunk)
    return size, crc


def _write_complete(records, order, stream, labels: collections.Counter, index_out=None) -> int:
    """Write records that need no payload (a RecordRef table), in `order`, and their index when
    `index_out` is a file; count their labels."""
    # Framed straight from the unsorted column: sorting it first would copy every record once
    # more.
    examples = records.column("example")
    for framed in frame_in_order(examples, order, _FRAMES_PER_WRITE):
        stream.write(memoryview(framed))
    if index_out is not None:
        index_out.write(memoryview(index_lines(record_lengths(examples)[order])))
    label_counts = pc.value_counts(records.column("label").drop_null())
    for entry in label_counts.to_pylist():
        labels[entry["values"]] += entry["counts"]
    return len(order)


def _create(path: str):
    return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)


class _CountingSink:
    """A write-only file wrapper that counts bytes and sums their CRC32C, so the staged file's
    size and checksum need no second read."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self.size = 0
        self.crc32c = 0

    def write(self, data) -> int:
        self._raw.write(data)
        self.size += len(data)
        # The checksum takes bytes or a buffer without a release hook (not a memoryview).
        chunk = data if isinstance(data, bytes) else np.frombuffer(data, np.uint8)
        self.crc32c = google_crc32c.extend(self.crc32c, chunk)
        return len(data)

    def flush(self) -> None:
        self._raw.flush()


def _write_framed(stream, header: bytes, pieces, footer: bytes, whole: bool) -> None:
    """Write one framed record: its header, pieces and footer.

    The image bytes (the middle piece) go to the file as they are, not copied into a framed
    record first: a copy of ~100 KB per image is a good part of the cost of writing it. The
    small pieces around them are joined. `whole`: join everything (a gzip stream gets the
    record in one call, as it always has, so that its output stays the same).
    """
    if whole or len(pieces) != 3:
        stream.write(b"".join((header, *pieces, footer)))
        return
    before, payload, after = pieces
    stream.write(header + before)
    stream.write(payload)
    stream.write(after + footer)


class ImageChecks(NamedTuple):
    """What the writer checks of each image's bytes before writing them.

    Attributes:
        pixels: decode every pixel (`--check-pixels`); else the structure only
            (transforms.core.images.integrity).
        max_pixels: the decompression-bomb limit of that decode.
        allowed_roots: where files may be opened (transforms.core.files.confine); empty: anywhere.
        preprocessing: what is done to each image before it is stored (resize, re-encode).
    """

    pixels: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    allowed_roots: tuple[str, ...] = ()
    preprocessing: Preprocessing = Preprocessing()


_STRUCTURE_ONLY = ImageChecks()


def _read_ahead(
    refs: Iterable[RecordRef], pool: ThreadPoolExecutor, checks: ImageChecks = _STRUCTURE_ONLY
) -> Iterator[tuple[RecordRef, Callable[[], bytes] | None]]:
    """Yield (ref, a call that returns its image bytes, checked) in order.

    Object-store reads start ahead, in threads, to hide each read's latency. Local files are
    opened ahead and read when their turn comes, in this thread: handing each file to a thread
    and back costs more CPU than reading it from the page cache (~50 µs an image). Images to
    preprocess go to the threads too, and so do local PNG files, whose check inflates their
    image data: Pillow and zlib release the GIL while they work, so a writer uses more than
    one core.
    """
    preprocess_in_pool = checks.preprocessing.active
    pending: collections.deque = collections.deque()
    in_flight = 0
    for ref in refs:
        if not ref.payload_path:
            fetch = None
        elif (
            not has_scheme(ref.payload_path)
            and not preprocess_in_pool
            and not _costly_to_check(ref.payload_path)
        ):
            opened = None
            if not checks.allowed_roots or is_within(
                real_path(ref.payload_path), checks.allowed_roots
            ):
                opened = open_hinted(ref.payload_path)
            fetch = functools.partial(read_payload, ref, opened, checks)
        elif preprocess_in_pool:
            fetch = pool.submit(read_stored, ref, checks).result
        else:
            fetch = pool.submit(read_payload, ref, None, checks).result
        pending.append((ref, fetch))
        in_flight += ref.payload_size
        while len(pending) > 1 and (
            in_flight > _READ_AHEAD_BYTES or len(pending) > 2 * _READ_THREADS
        ):
            done = pending.popleft()
            in_flight -= done[0].payload_size
            yield done
    yield from pending


def _costly_to_check(path: str) -> bool:
    """Whether checking the image at `path` costs more than handing it to a read thread: a
    PNG's check inflates all of its image data. Told by the name, for scheduling only: the
    check itself goes by the bytes."""
    return path[-4:].lower() == ".png"


def read_payload(
    ref: RecordRef, opened: BinaryIO | None = None, checks: ImageChecks = _STRUCTURE_ONLY
) -> bytes:
    """The image bytes of a record, checked: the same file as probed (size and version), and
    not damaged (`checks`).

    `opened`: the file, when it was opened ahead; closed here.
    """
    path = ref.payload_path
    try:
        if opened is None:
            check_allowed(path, checks.allowed_roots)
            opened = open_file(path) if has_scheme(path) else open_regular(path)
        with opened as f:
            version = _version(f, path)
            data = f.read()
            # A local file rewritten in place while it was read (after the check above) gives
            # bytes of both versions; its modification time tells (a gs:// reader reads one
            # generation).
            changed_while_read = not has_scheme(path) and _version(f, path) != version
    except STORAGE_ERRORS as error:
        raise_process_limit(error)
        raise InputError(
            "UnreadableFile", f"cannot read {display(path)} any more: {storage_reason(error)}"
        ) from error
    if len(data) != ref.payload_size:
        raise InputError(
            "FileChanged",
            f"{display(path)} changed during the run: {ref.payload_size} bytes when probed, "
            f"{len(data)} when written",
        )
    if changed_while_read:
        raise InputError(
            "FileChanged",
            f"{display(path)} changed during the run: it was rewritten while it was read",
        )
    if ref.payload_version >= 0 and version >= 0 and version != ref.payload_version:
        raise InputError(
            "FileChanged",
            f"{display(path)} changed during the run: it was rewritten (same size, "
            f"{'another generation' if has_scheme(path) else 'another modification time'}) "
            "after it was probed",
        )
    check_structure(data)
    if checks.pixels:
        check_pixels(data, checks.max_pixels)
    return data


def read_stored(ref: RecordRef, checks: ImageChecks) -> tuple[bytes, bytes, bytes]:
    """The record of `ref` in pieces, its image file read, checked and preprocessed
    (`checks.preprocessing`), the Example's image facts those of the stored image."""
    data = read_payload(ref, None, checks)
    with _DECODE_SLOTS:  # decoded images are large: as many at once as there are cores
        stored = preprocess(data, checks.preprocessing, max_pixels=checks.max_pixels)
    planned_size = ref.size - FRAMING_BYTES - len(ref.example)
    return stored_record(ref.example, ref.payload_offset, planned_size, stored)


def _version(stream, path: str) -> int:
    """The file's ImageInfo.version: a local file's modification time, a gs:// object's
    generation, -1 when unknown."""
    if has_scheme(path):
        return object_version(stream)
    try:
        return os.fstat(stream.fileno()).st_mtime_ns
    except (AttributeError, OSError, io.UnsupportedOperation):
        return -1


def _materialize(
    ref: RecordRef, fetch: Callable[[], bytes] | None, checks: ImageChecks = _STRUCTURE_ONLY
) -> tuple[bytes, ...]:
    """The final record in pieces: the planned Example, with the image file's bytes put in."""
    if fetch is None:
        return (ref.example,)
    if checks.preprocessing.active:
        return fetch()  # read_stored's pieces
    cut = ref.payload_offset
    return (ref.example[:cut], fetch(), ref.example[cut:])


class WriteErrors(beam.PTransform):
    """ErrorRecords → one `errors/{stage}.jsonl` file per stage that had errors, staged in
    `parts`.

    Input: PCollection[ErrorRecord]. Output: PCollection[ErrorFileResult].
    """

    def __init__(self, parts: str) -> None:
        super().__init__()
        self._parts = parts

    def expand(self, errors):
        return (
            errors
            | "KeyByStage" >> beam.Map(lambda error: (error.stage, error))
            | "GroupByStage" >> beam.GroupByKey()
            | "WriteErrorFile" >> beam.Map(_write_error_file, self._parts)
        )


def _write_error_file(
    stage_errors: tuple[str, Iterable[ErrorRecord]], parts: str
) -> ErrorFileResult:
    stage, errors = stage_errors
    ordered = sorted(errors, key=ErrorRecord.sort_key)
    relative = errors_file_name(stage)
    try:
        temp = write_temporary(
            parts,
            lambda f: f.writelines((e.to_json_line() + "\n").encode("utf-8") for e in ordered),
        )
    except OSError as error:
        raise_if_out_of_space(error, f"the errors file {relative}", parts)
        raise
    by_kind = collections.Counter(error.error for error in ordered)
    return ErrorFileResult(
        relative, stage, len(ordered), tuple(sorted(by_kind.items())), staged=((temp, relative),)
    )


def raise_if_out_of_space(error: OSError, what: str, where: str) -> None:
    """Raise OutOfSpace, naming what was being written and where, when `error` is a full disk
    or quota."""
    message = out_of_space_message(error, what, where)
    if message is not None:
        raise OutOfSpace(message) from error


def remove_tree(folder: str) -> None:
    """Delete a folder and everything in it, on any Beam filesystem; no error if it is absent."""
    if not has_scheme(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    (matched,) = FileSystems.match([FileSystems.join(folder, "**")])
    paths = [m.path for m in matched.metadata_list]
    if paths:
        FileSystems.delete(paths)
    if FileSystems.exists(folder):  # an object store's "folder/" placeholder
        FileSystems.delete([folder])


def write_temporary(temp_dir: str, fill: Callable) -> str:
    """Write a file under a fresh temporary name in `temp_dir`; return its path."""
    temp = FileSystems.join(temp_dir, f"{uuid.uuid4().hex}.tmp")
    with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        fill(f)
    return temp


def write_atomically(final: str, temp_dir: str, fill: Callable) -> None:
    """Write a file under a temporary name, then rename it to `final`."""
    publish([(write_temporary(temp_dir, fill), final)])


def publish(staged: Iterable[tuple[str, str]]) -> None:
    """Rename (staged, final) pairs into place, in batches; safe to repeat after a failure.

    On object stores a rename is a copy then a delete, so it is not atomic as a pair, but the
    final object appears whole or not at all. A retried commit finds some files moved by the
    attempt before it: a pair whose source is gone and whose target exists is done.
    """
    staged = list(staged)
    if not staged:
        return
    for folder in sorted({FileSystems.split(final)[0] for _, final in staged}):
        _ensure_folder(folder)
    try:
        FileSystems.rename([temp for temp, _ in staged], [final for _, final in staged])
    except BeamIOError as error:
        failed = error.exception_details or {}  # {(temporary, final): cause}
        if not failed or any(
            FileSystems.exists(temp) or not FileSystems.exists(final) for temp, final in failed
        ):
            raise


def _ensure_folder(folder: str) -> None:
    # A local rename needs the target folder; object stores have no folders (mkdirs is a no-op).
    if not FileSystems.exists(folder):
        try:
            FileSystems.mkdirs(folder)
        except (OSError, BeamIOError):
            if not FileSystems.exists(folder):  # lost a race with another worker: fine
                raise
