"""Receipts of CSV files read to their end, and the check that every listed file has one.

A CSV file's rows are counted only as they are read: a file that was never read, or not to
its end, would lose rows without a trace. Each reader hands in a receipt per file (every byte
of the stored file consumed, as many rows as the bytes hold, or the whole file quarantined as
one error record), and the run commits only when every CSV file it listed has one. A file
split into ranges (core.tables.ranges) has a receipt per range instead, and the ranges read
must cover the file: from its first byte to its last, with no gap and no overlap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class CsvReceipt(NamedTuple):
    """One CSV file, read.

    Attributes:
        path: the file.
        rows: data rows read (good or not); -1 for a quarantined file.
        num_bytes: bytes of CSV text read (decompressed).
        stored_bytes: bytes of the stored file consumed (compressed, for .csv.gz).
        stored_size: the stored file's size when it was opened.
        quarantined: the whole file is one error record (a header that does not match, a file
            that cannot be opened): none of its rows are inputs.
        compressed: a gzip file, whose decompressor checks the text's length and CRC at its
            end; an uncompressed file's text is the stored bytes, so their counts must agree.
        start: for a range of a file, the offset of its first byte (else 0).
        end: for a range of a file, the offset just past its last byte; -1 for a whole file.
    """

    path: str
    rows: int = -1
    num_bytes: int = -1
    stored_bytes: int = -1
    stored_size: int = -1
    quarantined: bool = False
    compressed: bool = False
    start: int = 0
    end: int = -1

    @property
    def read_bytes(self) -> int:
        """The stored bytes the reading got through (their text, when not compressed)."""
        return self.stored_bytes if self.compressed else min(self.stored_bytes, self.num_bytes)

    @property
    def is_range(self) -> bool:
        return self.end >= 0

    @property
    def complete(self) -> bool:
        """Whether the file (or the range) was read to its end, or quarantined whole."""
        size = self.end - self.start if self.is_range else self.stored_size
        return self.quarantined or (
            self.rows >= 0 and self.stored_size >= 0 and self.read_bytes == size
        )


class CsvLedger:
    """The CSV files listed and the receipts handed in (a mergeable combiner accumulator)."""

    def __init__(self) -> None:
        self.listed: dict[str, int] = {}
        self.receipts: dict[str, list[CsvReceipt]] = {}

    def add(self, item: tuple[str, object]) -> None:
        """Add ("listed", path) or ("read", CsvReceipt)."""
        what, value = item
        if what == "listed":
            self.listed[value] = self.listed.get(value, 0) + 1
        else:
            self.receipts.setdefault(value.path, []).append(value)

    def merge(self, other: CsvLedger) -> CsvLedger:
        for path, times in other.listed.items():
            self.listed[path] = self.listed.get(path, 0) + times
        for path, receipts in other.receipts.items():
            self.receipts.setdefault(path, []).extend(receipts)
        return self

    def problems(self) -> list[str]:
        """What does not add up, one sentence per file (empty when every file is accounted for)."""
        found = []
        for path in sorted(set(self.listed) | set(self.receipts)):
            found += _problems(path, self.listed.get(path, 0), self.receipts.get(path, []))
        return found


def _problems(path: str, listed: int, receipts: Iterable[CsvReceipt]) -> list[str]:
    receipts = list(receipts)
    if not listed:
        return [f"{path} was read but never listed"]
    if listed > 1:
        return [f"{path} was listed {listed} times"]
    if not receipts:
        return [f"{path} was listed but no reader reported reading it"]
    if any(receipt.is_range for receipt in receipts):
        return _range_problems(path, receipts)
    if len(receipts) > 1:
        return [f"{path} was read {len(receipts)} times"]
    (receipt,) = receipts
    if not receipt.complete:
        return [
            f"{path} was not read to its end ({receipt.read_bytes:,} of its "
            f"{receipt.stored_size:,} bytes)"
        ]
    return []


def _range_problems(path: str, receipts: list[CsvReceipt]) -> list[str]:
    """What does not add up in the receipts of a file read in ranges."""
    if not all(receipt.is_range for receipt in receipts):
        return [f"{path} was read both whole and in ranges"]
    sizes = {receipt.stored_size for receipt in receipts}
    if len(sizes) > 1:
        return [
            f"{path} changed size while its ranges were read ({min(sizes):,} and {max(sizes):,})"
        ]
    (size,) = sizes
    found, reached = [], 0
    for receipt in sorted(receipts, key=lambda r: (r.start, r.end)):
        if receipt.start > reached:
            found.append(f"bytes {reached:,} to {receipt.start:,} were never read")
        elif receipt.start < reached:
            found.append(
                f"bytes {receipt.start:,} to {min(reached, receipt.end):,} were read twice"
            )
        if not receipt.complete:
            found.append(
                f"the range of bytes {receipt.start:,} to {receipt.end:,} was not read to its end "
                f"({receipt.read_bytes:,} of its {receipt.end - receipt.start:,} bytes)"
            )
        reached = max(reached, receipt.end)
    if reached < size:
        found.append(f"bytes {reached:,} to {size:,} were never read")
    elif reached > size:
        found.append(f"ranges reach byte {reached:,}, past its end ({size:,} bytes)")
    return [f"{path}: " + "; ".join(found)] if found else []
