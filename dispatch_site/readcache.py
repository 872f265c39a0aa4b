"""A per-process cache for reads that may be a moment old (plan answers many requests about the same few
runtimes). A caller that must see the latest passes max_age=0 and reads afresh; the fresh value is kept."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ReadCache(Generic[V]):
    def __init__(self, limit: int = 1024) -> None:
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._limit = limit

    def get(self, key: Hashable, max_age: float, read: Callable[[], V]) -> V:
        if max_age > 0:
            hit = self._entries.get(key)
            if hit is not None and time.monotonic() - hit[0] <= max_age:
                return hit[1]
        value = read()
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = (time.monotonic(), value)
        return value

    def clear(self) -> None:
        self._entries.clear()
