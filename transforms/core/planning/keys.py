"""Stable keys and salted hashes: the only source of order and split membership (never `random`)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

# Order keys start with this many hash bytes; the rest is the record's key, which breaks ties.
HASH_BYTES = 8


def _hash64(domain: bytes, salt: str, key: str) -> bytes:
    digest = _keyed_hash(domain, salt).copy()
    digest.update(key.encode("utf-8"))
    return digest.digest()


@functools.lru_cache(maxsize=64)
def _keyed_hash(domain: bytes, salt: str):
    """A BLAKE2b keyed with (domain, salt), nothing hashed yet: copied per key, which is
    cheaper than keying a new one (that hashes a whole block for the key)."""
    # Domain-separated so the split hash and the order hash of a key are independent.
    return hashlib.blake2b(digest_size=HASH_BYTES, key=domain + b"\0" + salt.encode("utf-8"))


def order_key(salt: str, key: str) -> bytes:
    """Bytes that sort records into a deterministic pseudo-random order (hash first, key second)."""
    return _hash64(b"order", salt, key) + key.encode("utf-8")


# A content key is this many bytes of BLAKE2b, as hex: two different records share one with a
# probability of about n² / 2^129 (n records), which is never for any dataset that exists.
CONTENT_KEY_BYTES = 16


def content_key(data: bytes) -> str:
    """The stable key of a record that has no name of its own: a hash of its serialized bytes.

    Records that arrive serialized (TFRecord files to reshard, WriteDataset's input) carry no
    path or row. Their bytes are what stays the same when the same data is written again in
    other files, another order, or by other workers, so the output depends on the records
    alone, not on how they were laid out (TFX's ExampleGen splits by a hash of the bytes too).
    Equal records get equal keys: they land in the same split (a duplicate never leaks from
    train into test) and next to each other; being equal, their order is no choice at all.
    """
    return hashlib.blake2b(data, digest_size=CONTENT_KEY_BYTES).hexdigest()


def hash_of(order: bytes) -> int:
    """The 64-bit hash an order key starts with."""
    return int.from_bytes(order[:HASH_BYTES], "big")


class SplitChooser:
    """Assigns keys to splits by a salted hash, in the given proportions.

    Args:
        fractions: (split name, fraction) pairs; fractions are positive and sum to 1 (within 1e-9).
        salt: changes every assignment at once, e.g. to draw a different validation set.
    """

    def __init__(self, fractions: Sequence[tuple[str, float]], salt: str) -> None:
        if not fractions:
            raise ValueError("at least one split is needed")
        total = sum(f for _, f in fractions)
        if any(f <= 0 for _, f in fractions) or abs(total - 1.0) > 1e-9:
            raise ValueError(f"split fractions must be positive and sum to 1, got {total:g}")
        self._names = [name for name, _ in fractions]
        self._salt = salt
        # Integer upper bounds over the 64-bit hash space: exact, so the same on every machine.
        bounds, cumulative = [], 0.0
        for _, fraction in fractions[:-1]:
            cumulative += fraction
            bounds.append(int(cumulative * 2**64))
        self._bounds = bounds

    def choose(self, key: str) -> str:
        """The split `key` belongs to."""
        if not self._bounds:  # one split: no hash needed
            return self._names[0]
        point = int.from_bytes(_hash64(b"split", self._salt, key), "big")
        for name, bound in zip(self._names[:-1], self._bounds, strict=True):
            if point < bound:
                return name
        return self._names[-1]
