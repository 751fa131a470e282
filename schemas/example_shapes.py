"""The feature facts of many serialized Examples at once, read column-wise from the wire format.

Resharding and WriteDataset tally what every record's features hold: (key, dtype, number of
values). Asked of protobuf one record at a time, that costs about 2 µs per feature in Python
attribute lookups (80 µs for a 15-feature record, most of a reshard's time). Here a whole
block of records is read at once with numpy, one step of the wire format at a time for every
record together (the layout is schemas/example_columns.py's):

    Example  = 0x0A len Features                 (nothing at all when it has no feature)
    Features = (0x0A len (0x0A len key 0x12 len Feature))*
    Feature  = 0x0A len BytesList | 0x12 len FloatList | 0x1A len Int64List | nothing
    BytesList = (0x0A len value)*;  FloatList, Int64List = 0x0A len packed | nothing

Only records written that way are read here, and each is checked as protobuf (upb) checks it;
anything else (unknown fields, unpacked lists, a map key that is not UTF-8, a key twice, a
varint too long, a list of very many strings) is left to the caller (`facts_by_shape` returns
-1 for it), which asks protobuf. tests/test_example_shapes.py holds the two to the same answer
on records and on mutations of them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recordforge.schemas.codec import FeatureFacts

_FIELD_ONE = 0x0A  # field 1, length-delimited: Example.features, Features.feature, key, list
_MAP_VALUE = 0x12  # field 2 of a map entry: the Feature
_KINDS = {0x0A: "bytes", 0x12: "float", 0x1A: "int64"}
_DTYPE_CODES = {None: 0, "bytes": 1, "float": 2, "int64": 3}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_MAX_VARINT = 10
# A string list is walked one value at a time for all lists together; past this many steps,
# the few records with longer lists are left to protobuf.
_MAX_LIST_STEPS = 256


def facts_by_shape(examples: pa.Array) -> tuple[np.ndarray, list[FeatureFacts]]:
    """(for each record, the index of its facts in the list, or -1; the distinct facts).

    `examples` is a binary array of serialized Examples. A record's facts are those
    `codec.feature_facts` gives; -1 marks a record read here could not vouch for (it may still
    be a valid Example, or no Example at all: protobuf decides).
    """
    n = len(examples)
    if n == 0:
        return np.zeros(0, np.int64), []
    scan = _Scan(examples)
    return scan.shapes()


class _Scan:
    def __init__(self, examples: pa.Array) -> None:
        offsets = np.frombuffer(examples.buffers()[1], np.int32)
        offsets = offsets[examples.offset : examples.offset + len(examples) + 1].astype(np.int64)
        data = examples.buffers()[2]
        raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        # Padded, so that reads a few bytes past a record's end stay inside the array; the
        # bounds are checked against each record's end instead.
        self.buf = np.concatenate([raw[: offsets[-1]], np.zeros(_MAX_VARINT + 2, np.uint8)])
        self.starts, self.ends = offsets[:-1], offsets[1:]
        self.n = len(self.starts)
        self.ok = np.ones(self.n, dtype=bool)

    def varint(self, pos: np.ndarray, limit: np.ndarray):
        """(value, position after it, whether it is a sound varint that ends by `limit`)."""
        value = self.buf[pos].astype(np.int64)
        end = pos + 1
        sound = np.ones(len(pos), dtype=bool)
        longer = np.flatnonzero(value >= 0x80)  # most lengths take one byte
        if len(longer):
            window = self.buf[pos[longer, None] + np.arange(_MAX_VARINT)]
            more = window >= 0x80
            length = np.argmin(more, axis=1) + 1  # the first byte without the continuation bit
            low = (window & 0x7F).astype(np.uint64)
            shifts = (7 * np.arange(_MAX_VARINT)).astype(np.uint64)
            used = np.arange(_MAX_VARINT) < length[:, None]
            long_value = np.bitwise_or.reduce(np.where(used, low << shifts, np.uint64(0)), axis=1)
            # Lengths past 2^31 are no length a record of a block can have.
            long_sound = ~more.all(axis=1) & (long_value < np.uint64(1 << 31))
            # An unsound value reads as 0, so that no position computed from it leaves the block.
            value[longer] = np.where(long_sound, long_value, np.uint64(0)).astype(np.int64)
            end[longer] = pos[longer] + length
            sound[longer] = long_sound
        sound &= end <= limit
        value[~sound] = 0
        return value, end, sound

    def shapes(self) -> tuple[np.ndarray, list[FeatureFacts]]:
        starts, ends, buf = self.starts, self.ends, self.buf
        nonempty = ends > starts
        rows = np.flatnonzero(nonempty)
        # Example = 0x0A len Features, filling the record.
        length, body, sound = self.varint(starts[rows] + 1, ends[rows])
        sound &= (buf[starts[rows]] == _FIELD_ONE) & (body + length == ends[rows])
        self.ok[rows[~sound]] = False
        rows, body = rows[sound], body[sound]
        entry_rows, entry_starts, entry_ends = self._entries(rows, body, ends[rows])
        keys, dtypes, counts, entry_ok = self._features(entry_rows, entry_starts, entry_ends)
        bad = np.unique(entry_rows[~entry_ok])
        self.ok[bad] = False
        keep = self.ok[entry_rows]
        return self._group(entry_rows[keep], keys[keep], dtypes[keep], counts[keep])

    def _entries(self, rows, pos, ends):
        """Every map entry of the Features of `rows`: (row, body start, body end) arrays."""
        found_rows, found_starts, found_ends = [], [], []
        active = pos < ends
        rows, pos, ends = rows[active], pos[active], ends[active]
        while len(rows):
            length, start, sound = self.varint(pos + 1, ends)
            end = start + length
            sound &= (self.buf[pos] == _FIELD_ONE) & (end <= ends)
            self.ok[rows[~sound]] = False
            rows, start, end, ends = rows[sound], start[sound], end[sound], ends[sound]
            found_rows.append(rows)
            found_starts.append(start)
            found_ends.append(end)
            more = end < ends
            rows, pos, ends = rows[more], end[more], ends[more]
        if not found_rows:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        return (
            np.concatenate(found_rows),
            np.concatenate(found_starts),
            np.concatenate(found_ends),
        )

    def _features(self, rows, starts, ends):
        """(key ids into self.keys, dtype codes, value counts, soundness) of map entries."""
        buf = self.buf
        m = len(rows)
        # entry = 0x0A len key 0x12 len Feature, filling the entry.
        key_length, key_start, ok = self.varint(starts + 1, ends)
        key_end = key_start + key_length
        ok &= buf[starts] == _FIELD_ONE
        ok &= key_end < ends
        value_pos = np.minimum(key_end, ends - 1)
        feature_length, feature_start, sound = self.varint(value_pos + 1, ends)
        ok &= sound & (buf[value_pos] == _MAP_VALUE) & (feature_start + feature_length == ends)
        keys = self._key_ids(np.where(ok, key_start, 0), np.where(ok, key_length, 0), ok)
        ok &= keys >= 0
        dtypes = np.zeros(m, np.int64)
        counts = np.zeros(m, np.int64)
        # Feature = tag len List (or nothing: an empty list of any type).
        has_list = ok & (feature_length > 0)
        tag = buf[np.where(has_list, feature_start, 0)]
        list_length, list_start, sound = self.varint(feature_start + 1, ends)
        list_end = list_start + list_length
        sound &= np.isin(tag, list(_KINDS)) & (list_end == ends)
        ok &= ~has_list | sound
        for tag_value, dtype in _KINDS.items():
            of_kind = has_list & sound & (tag == tag_value)
            dtypes[of_kind] = _DTYPE_CODES[dtype]
            listed = np.flatnonzero(of_kind & (list_length > 0))
            if not len(listed):
                continue
            if dtype == "bytes":
                found, good = self._string_counts(list_start[listed], list_end[listed])
            else:
                found, good = self._packed_counts(dtype, list_start[listed], list_end[listed])
            counts[listed] = found
            ok[listed] &= good
        return keys, dtypes, counts, ok

    def _key_ids(self, starts, lengths, ok) -> np.ndarray:
        """Each key's index in self.keys (its distinct keys, decoded), -1 where it is not
        UTF-8 (protobuf refuses such a map key)."""
        total = int(lengths.sum())
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(total)
        key_bytes = pa.py_buffer(self.buf[gather].tobytes())
        array = pa.Array.from_buffers(
            pa.binary(), len(starts), [None, pa.py_buffer(offsets.astype(np.int32)), key_bytes]
        )
        encoded = array.dictionary_encode()
        ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        self.keys = []
        valid = []
        for raw in encoded.dictionary.to_pylist():
            try:
                self.keys.append(raw.decode("utf-8"))
                valid.append(True)
            except UnicodeDecodeError:
                self.keys.append("")
                valid.append(False)
        ids[~np.asarray(valid, bool)[ids] | ~ok] = -1
        return ids

    def _packed_counts(self, dtype: str, starts, ends):
        """Value counts of packed float or int64 lists: 0x0A len packed, filling the list."""
        length, data, sound = self.varint(starts + 1, ends)
        # Clipped: a damaged length may point past the block (it is unsound then anyway).
        data_end = np.minimum(data + length, len(self.buf) - 1)
        sound &= (self.buf[starts] == _FIELD_ONE) & (data_end == ends)
        if dtype == "float":
            return length // 4, sound & (length % 4 == 0)
        # A varint ends at each byte below 0x80; one of more than 10 bytes is refused. The
        # lists' bytes are gathered, end to end, and their varints counted there.
        length = np.where(sound, length, 0)
        total = int(length.sum())
        offsets = np.concatenate([[0], np.cumsum(length)])
        data_bytes = self.buf[np.repeat(data - offsets[:-1], length) + np.arange(total)]
        ends_here = np.concatenate([[0], np.cumsum(data_bytes < 0x80)])
        counts = ends_here[offsets[1:]] - ends_here[offsets[:-1]]
        if total:
            last = data_bytes[np.maximum(offsets[1:] - 1, 0)]
        else:
            last = np.zeros(len(starts), np.uint8)
        sound &= (length == 0) | (last < 0x80)
        # Ten continuation bytes in a row make a varint too long. (A run that starts in a list
        # whose last byte continues, and so is unsound already, may mark the next one too.)
        continuing = data_bytes >= 0x80
        run = continuing[: max(total - _MAX_VARINT + 1, 0)].copy()
        for k in range(1, _MAX_VARINT):
            run &= continuing[k : k + len(run)]
        too_long = np.concatenate([[0], np.cumsum(run)])
        first = np.minimum(offsets[:-1], len(run))
        last_start = np.minimum(np.maximum(offsets[1:] - _MAX_VARINT + 1, offsets[:-1]), len(run))
        sound &= too_long[last_start] == too_long[first]
        return counts, sound

    def _string_counts(self, starts, ends):
        """Value counts of string lists: (0x0A len value)*, filling the list."""
        counts = np.zeros(len(starts), np.int64)
        sound = np.ones(len(starts), bool)
        index = np.arange(len(starts))
        pos = starts.copy()
        for _ in range(_MAX_LIST_STEPS):
            if not len(index):
                return counts, sound
            length, value, good = self.varint(pos + 1, ends[index])
            end = value + length
            good &= (self.buf[pos] == _FIELD_ONE) & (end <= ends[index])
            sound[index[~good]] = False
            counts[index] += 1
            more = good & (end < ends[index])
            index, pos = index[more], end[more]
        sound[index] = False  # longer lists than this are protobuf's to count
        return counts, sound

    def _group(self, rows, keys, dtypes, counts) -> tuple[np.ndarray, list[FeatureFacts]]:
        """Records with the same facts share one index; -1 for records not read here."""
        shape_of = np.full(self.n, -1, dtype=np.int64)
        # Each record's entries in key order: a key twice in one record is protobuf's to merge.
        order = np.lexsort((keys, rows))
        rows, keys, dtypes, counts = rows[order], keys[order], dtypes[order], counts[order]
        twice = np.flatnonzero((rows[1:] == rows[:-1]) & (keys[1:] == keys[:-1]))
        self.ok[rows[twice]] = False
        sound = self.ok[rows]
        rows, keys, dtypes, counts = rows[sound], keys[sound], dtypes[sound], counts[sound]
        per_record = np.bincount(rows, minlength=self.n)
        shapes: list[FeatureFacts] = []
        for k in np.unique(per_record[self.ok]):
            member = self.ok & (per_record == k)
            members = np.flatnonzero(member)
            if k == 0:
                shape_of[members] = len(shapes)
                shapes.append(())
                continue
            chosen = member[rows]
            table = np.stack(
                [keys[chosen].reshape(-1, k), dtypes[chosen].reshape(-1, k)]
                + [counts[chosen].reshape(-1, k)],
                axis=2,
            ).reshape(len(members), 3 * k)
            first, inverse = _distinct_rows(table)
            shape_of[members] = np.where(inverse >= 0, len(shapes) + inverse, -1)
            for row in table[first].reshape(-1, k, 3):
                facts = [
                    (self.keys[key], _CODE_DTYPES[dtype], int(count)) for key, dtype, count in row
                ]
                shapes.append(tuple(sorted(facts)))
        return shape_of, shapes


def _distinct_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first row of each distinct row, each row's index among them; -1 for a row whose
    fingerprint it shares with another row but not its values)."""
    # A 64-bit fingerprint of each row (fixed odd multipliers, wrapping), grouped as numbers;
    # each row is then compared with its group's first, so the grouping is exact.
    weights = _WEIGHTS[: table.shape[1]] if table.shape[1] <= len(_WEIGHTS) else _weights(table)
    with np.errstate(over="ignore"):
        prints = (table.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(prints, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    same = (table == table[first[inverse]]).all(axis=1)
    return first, np.where(same, inverse, -1)


def _weights(table: np.ndarray) -> np.ndarray:
    return np.random.default_rng(table.shape[1]).integers(1, 2**63, table.shape[1], np.uint64) | 1


_WEIGHTS = np.random.default_rng(0).integers(1, 2**63, 3 * 64, dtype=np.uint64) | np.uint64(1)
