"""The checks libjpeg makes of a JPEG's header segments before it decodes a pixel.

TensorFlow decodes JPEGs with libjpeg-turbo, which stops with an error (and TensorFlow with
it) on a header segment it cannot use: a Huffman table whose codes do not fit their lengths, a
scan naming a component or table that does not exist, sampling factors or scan parameters out
of range (or sampling factors its upsampler cannot scale by a whole number, or more than ten
blocks in a scan's unit), arithmetic-coding conditioning values out of range, a marker it does
not know, a segment whose length does not match its content. Damage inside the entropy-coded
data only makes it warn (the pixels are wrong, the decode succeeds). So these checks, from
libjpeg-turbo's jdmarker.c, jdhuff.c, jdphuff.c and jdinput.c, are what stands between a
structurally intact but damaged JPEG and a training run that crashes on it; they read a few
hundred bytes per file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from recordforge.transforms.core.errors import InputError

# SOF markers libjpeg-turbo decodes: baseline, extended and progressive Huffman, and
# sequential and progressive arithmetic coding. Lossless and hierarchical ones it refuses.
DECODABLE_FRAMES = {0xC0: False, 0xC1: False, 0xC2: True, 0xC9: False, 0xCA: True}
# 0xC8 (JPG) is reserved, and refused with the unsupported frame types.
UNDECODABLE_FRAMES = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC8, 0xCB, 0xCD, 0xCE, 0xCF})
_MAX_DIMENSION = 65500
_TABLES = 4
_ARITHMETIC_TABLES = 16
_MAX_BLOCKS_IN_MCU = 10  # libjpeg's D_MAX_BLOCKS_IN_MCU


@dataclass
class JpegHeader:
    """What the segments before a scan have declared so far."""

    frame: dict[int, int] = field(default_factory=dict)  # component id -> quantization table
    sampling: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (h, v)
    progressive: bool = False
    arithmetic: bool = False
    quantization: set[int] = field(default_factory=set)
    huffman: set[tuple[int, int]] = field(default_factory=set)  # (class: 0 DC 1 AC, index)
    # Tables defined with codes libjpeg cannot build, and why: an error only for a scan that
    # uses one (libjpeg-turbo builds a table when a scan starts with it, jdhuff.c).
    bogus_huffman: dict[tuple[int, int], str] = field(default_factory=dict)

    def segment(self, marker: int, body: bytes, offset: int) -> None:
        """Check one segment (marker and the bytes after its length field) and note it."""
        if marker in UNDECODABLE_FRAMES:
            raise _bad(f"its frame type (0xFF{marker:02X}) is one TensorFlow does not decode")
        if marker in DECODABLE_FRAMES:
            self._frame(marker, body, offset)
        elif marker == 0xC4:
            self._huffman_tables(body, offset)
        elif marker == 0xDB:
            self._quantization_tables(body, offset)
        elif marker == 0xCC:
            _arithmetic_conditioning(body, offset)
        elif marker == 0xDA:
            self._scan(body, offset)
        elif marker == 0xDD and len(body) != 2:
            raise _bad(f"its restart interval segment at byte {offset:,} has the wrong length")

    def _frame(self, marker: int, body: bytes, offset: int) -> None:
        if self.frame:
            raise _bad(f"a second frame header at byte {offset:,}")
        if len(body) < 6:
            raise _bad(f"its frame header at byte {offset:,} is too short")
        precision = body[0]
        height, width, count = (body[1] << 8) | body[2], (body[3] << 8) | body[4], body[5]
        if precision != 8:
            raise _bad(f"its samples have {precision} bits; TensorFlow decodes 8")
        if not height or not width:
            raise _bad("its frame header declares an empty image")
        if max(height, width) > _MAX_DIMENSION:
            raise _bad(f"it is {width}x{height}, beyond libjpeg's {_MAX_DIMENSION} pixels")
        if count not in (1, 3, 4):
            raise _bad(f"it has {count} colour components; TensorFlow decodes 1, 3 or 4")
        if len(body) != 6 + 3 * count:
            raise _bad(f"its frame header at byte {offset:,} has the wrong length")
        for position in range(6, 6 + 3 * count, 3):
            identifier, sampling, table = body[position : position + 3]
            if not (1 <= sampling >> 4 <= 4 and 1 <= sampling & 15 <= 4):
                raise _bad("a component's sampling factors are out of range")
            if table >= _TABLES:
                raise _bad(f"a component uses quantization table {table}, beyond 0-3")
            self.frame[identifier] = table
            self.sampling[identifier] = (sampling >> 4, sampling & 15)
        # libjpeg's upsampler scales each component by a whole factor or not at all
        # (jdsample.c, "Fractional sampling not implemented yet").
        widest = max(h for h, _ in self.sampling.values())
        tallest = max(v for _, v in self.sampling.values())
        if any(widest % h or tallest % v for h, v in self.sampling.values()):
            raise _bad("its components' sampling factors are not whole multiples of each other")
        self.progressive = DECODABLE_FRAMES[marker]
        self.arithmetic = marker >= 0xC9

    def _quantization_tables(self, body: bytes, offset: int) -> None:
        position = 0
        while position < len(body):
            precision, index = body[position] >> 4, body[position] & 15
            if index >= _TABLES:
                raise _bad(f"a quantization table at byte {offset:,} has index {index}")
            position += 1 + 64 * (2 if precision else 1)
            if position > len(body):
                raise _bad(f"its quantization segment at byte {offset:,} has the wrong length")
            self.quantization.add(index)

    def _huffman_tables(self, body: bytes, offset: int) -> None:
        tables = huffman_segment(body)
        if isinstance(tables, str):
            raise _bad(tables.format(offset=offset))
        for table, problem in tables:  # a later definition replaces an earlier one
            if problem is None:
                self.huffman.add(table)
                self.bogus_huffman.pop(table, None)
            else:
                self.huffman.discard(table)
                self.bogus_huffman[table] = problem.format(offset=offset)

    def _check_huffman_tables_used(self, dc: int, ac: int, start: int, high: int) -> None:
        if not self.progressive:
            # Every sequential scan uses both; libjpeg-turbo supplies the standard tables 0 and 1
            # when none are defined (as Motion-JPEG frames leave them out).
            used = [(0, dc), (1, ac)]
            defaults = {(0, 0), (0, 1), (1, 0), (1, 1)}
        else:
            # A DC scan uses its DC table in its first pass only; an AC scan, its AC table.
            used = ([(0, dc)] if high == 0 else []) if start == 0 else [(1, ac)]
            defaults = set()
        for table in used:
            if table in self.bogus_huffman:
                raise _bad(self.bogus_huffman[table])
            if table not in self.huffman and table not in defaults:
                kind = "DC" if table[0] == 0 else "AC"
                raise _bad(f"{kind} Huffman table {table[1]} is used, not defined")

    def _scan(self, body: bytes, offset: int) -> None:
        if not self.frame:
            raise _bad("its image data comes before its frame header")
        count = body[0] if body else 0
        if not 1 <= count <= 4 or len(body) != 4 + 2 * count:
            raise _bad(f"its scan header at byte {offset:,} has the wrong length")
        start, end, approximation = body[1 + 2 * count : 4 + 2 * count]
        high, low = approximation >> 4, approximation & 15
        seen = set()
        for position in range(1, 1 + 2 * count, 2):
            identifier, tables = body[position], body[position + 1]
            if identifier not in self.frame or identifier in seen:
                raise _bad(f"its scan at byte {offset:,} names component {identifier}")
            seen.add(identifier)
            if self.frame[identifier] not in self.quantization:
                raise _bad(f"quantization table {self.frame[identifier]} is used, not defined")
            dc, ac = tables >> 4, tables & 15
            if not self.arithmetic:  # arithmetic coding has 16 tables, each with defaults
                if dc >= _TABLES or ac >= _TABLES:
                    raise _bad(f"its scan at byte {offset:,} uses Huffman table {max(dc, ac)}")
                self._check_huffman_tables_used(dc, ac, start, high)
        if count > 1 and sum(h * v for h, v in map(self.sampling.get, seen)) > _MAX_BLOCKS_IN_MCU:
            raise _bad(f"its scan at byte {offset:,} has more than 10 blocks in a unit")
        if not self.progressive:
            if (start, end, high, low) != (0, 63, 0, 0):
                raise _bad("a sequential scan has progressive parameters")
            return
        bad = (end != 0) if start == 0 else (start > end or end > 63 or count != 1)
        if high and low != high - 1:
            bad = True
        if bad or low > 13:
            raise _bad(f"its progressive scan at byte {offset:,} has invalid parameters")


@functools.lru_cache(maxsize=256)
def huffman_segment(body: bytes) -> tuple[tuple[tuple[int, int], str | None], ...] | str:
    """((class, index), what is wrong with its codes or None) of each Huffman table a DHT
    segment defines, or what is wrong with the segment itself (messages with an `{offset}`
    field). libjpeg refuses a segment it cannot read at once, and a table whose codes it
    cannot build only when a scan uses it.

    Cached: the files of one camera or encoder share their tables, so most segments are
    checked once per worker.
    """
    position, tables = 0, []
    while position < len(body):
        if len(body) - position < 17:
            return "its Huffman segment at byte {offset:,} has the wrong length"
        kind, index = body[position] >> 4, body[position] & 15
        counts = body[position + 1 : position + 17]
        total = sum(counts)
        symbols = body[position + 17 : position + 17 + total]
        if kind > 1 or index >= _TABLES:
            return f"a Huffman table at byte {{offset:,}} has class {kind}, index {index}"
        if total > 256 or len(symbols) < total:
            return "a Huffman table at byte {offset:,} is bogus"
        problem = None
        if not _codes_fit(counts):
            problem = "a Huffman table at byte {offset:,} is bogus (its codes do not fit)"
        elif kind == 0 and symbols and max(symbols) > 15:
            problem = "a DC Huffman table at byte {offset:,} has a symbol above 15"
        position += 17 + total
        tables.append(((kind, index), problem))
    return tuple(tables)


def _arithmetic_conditioning(body: bytes, offset: int) -> None:
    """A DAC segment: pairs of (table, value); libjpeg reads it even in a Huffman-coded file and
    stops on a table beyond 0-31 or a DC table's lower bound above its upper one."""
    where = f"its arithmetic conditioning segment at byte {offset:,}"
    if len(body) % 2:
        raise _bad(f"{where} has the wrong length")
    for position in range(0, len(body), 2):
        table, value = body[position], body[position + 1]
        if table >= 2 * _ARITHMETIC_TABLES:
            raise _bad(f"{where} names table {table}")
        if table < _ARITHMETIC_TABLES and value & 15 > value >> 4:
            raise _bad(f"{where} has a bad value")


def _codes_fit(counts: bytes) -> bool:
    """Whether canonical Huffman codes of these lengths fit, the all-ones code left unused
    (libjpeg's jpeg_make_d_derived_tbl)."""
    code = 0
    for length, count in enumerate(counts, start=1):
        code += count
        if code >= (1 << length):
            return False
        code <<= 1
    return True


def _bad(what: str) -> InputError:
    return InputError("CorruptImage", f"the JPEG file is corrupt: {what}")
