"""Running a generator one item ahead on a thread, so its native work overlaps the caller's."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()
_POLL_SECONDS = 0.1


def ahead(generator: Generator[T, None, None], depth: int = 1) -> Iterator[T]:
    """Yield what `generator` yields, producing up to `depth` items ahead on a thread.

    Reading a CSV block is mostly pyarrow's native parsing, which releases the GIL: done on a
    thread, it overlaps the caller's work on the block before. Items and exceptions arrive in
    order. When the caller stops early (or fails), the thread is stopped and joined and the
    generator is closed on the caller's thread, so its cleanup runs exactly once, as without
    the thread.
    """
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in generator:
                if not _put(items, (item, None), stop):
                    return
            _put(items, (_END, None), stop)
        except BaseException as error:  # handed to the caller, raised there
            _put(items, (_END, error), stop)

    thread = threading.Thread(target=produce, name="recordforge-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = items.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
        generator.close()


def _put(items: queue.Queue, entry, stop: threading.Event) -> bool:
    """Put `entry` unless the consumer has stopped; False when it has."""
    while not stop.is_set():
        try:
            items.put(entry, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False
