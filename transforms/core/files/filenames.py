"""File names that are not UTF-8, carried through the pipeline as UTF-8 text.

POSIX file names are bytes. Python hands undecodable ones out as `str` with lone surrogates
(U+DC80..U+DCFF, "surrogateescape"), which nothing downstream can encode: Beam's coders, Arrow
string columns and the JSON of the manifest and errors files all need valid UTF-8. So a name
from the operating system is converted once, where it is listed: each undecodable byte becomes
NUL followed by its two hex digits. NUL never occurs in a real file name, so the form cannot
collide with another name, is valid UTF-8, and converts back exactly (`to_os`) wherever a file
is opened. UTF-8 names (all but a few) are left as they are, so their records do not change.

Where a name is shown (error messages, class names) the bytes appear escaped (`\\xff`); where
it is data (`image/filename`) it is the original bytes (`name_bytes`).
"""

from __future__ import annotations

import os
import re

MARK = "\x00"
_MARKED = re.compile("\x00([0-9a-f]{2})")
_ESCAPED = re.compile("[\udc80-\udcff]")


def from_os(name: str) -> str:
    """A name as the operating system gave it (maybe with surrogate escapes) → pipeline text."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return _ESCAPED.sub(lambda m: f"{MARK}{ord(m.group()) - 0xDC00:02x}", name)
    return name


def to_os(name: str) -> str:
    """Pipeline text → the name to hand to the operating system (`from_os` undone)."""
    if MARK not in name:
        return name
    return _MARKED.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), name)


def absolute_local_path(path: str) -> str:
    """A local path (pipeline text) made absolute with `~` expanded, as sources and outputs are
    named (workers may run in another folder)."""
    return from_os(os.path.abspath(os.path.expanduser(to_os(path))))


def display(text: str) -> str:
    """Pipeline text for people: undecodable bytes shown as `\\xff`."""
    if MARK not in text:
        return text
    return _MARKED.sub(lambda m: f"\\x{m.group(1)}", text)


def name_bytes(name: str) -> bytes:
    """The original bytes of a name (UTF-8 text as UTF-8)."""
    if MARK not in name:
        return name.encode("utf-8")
    return to_os(name).encode("utf-8", "surrogateescape")
