"""core.tables.background.ahead: same items and errors, in order; cleanup exactly once."""

from __future__ import annotations

import threading

import pytest

from recordforge.transforms.core.tables.background import ahead


def test_yields_every_item_in_order_from_another_thread():
    threads = []

    def numbers():
        for i in range(100):
            threads.append(threading.get_ident())
            yield i

    assert list(ahead(numbers(), depth=3)) == list(range(100))
    assert set(threads) != {threading.get_ident()}


def test_an_error_arrives_after_the_items_before_it():
    def failing():
        yield 1
        yield 2
        raise ValueError("bad block")

    got = []
    with pytest.raises(ValueError, match="bad block"):
        for item in ahead(failing()):
            got.append(item)
    assert got == [1, 2]


def test_stopping_early_stops_the_thread_and_closes_the_generator_once():
    events = []

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            events.append(("closed", threading.get_ident()))

    before = threading.active_count()
    items = ahead(endless(), depth=2)
    assert [next(items) for _ in range(5)] == [0, 1, 2, 3, 4]
    items.close()
    assert events == [("closed", threading.get_ident())]
    assert threading.active_count() == before
