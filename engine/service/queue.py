"""The waiting requests, first in first out: submit, cancel one, clear, move one to another position.

Thread-safe: a face adds and reorders from its UI thread while the service takes the next one from the
engine's worker. Holds only tickets; what they carry is the service's business.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class RequestQueue(Generic[T]):
    """Items keyed by ticket number, in the order they will run."""

    def __init__(self, ticket_of: Callable[[T], int]) -> None:
        self._ticket_of = ticket_of
        self._items: list[T] = []
        self._lock = threading.Lock()

    def push(self, item: T) -> int:
        """Append; the item's position (0: next)."""
        with self._lock:
            self._items.append(item)
            return len(self._items) - 1

    def pop(self) -> T | None:
        """The next item, removed; None when the queue is empty."""
        with self._lock:
            return self._items.pop(0) if self._items else None

    def remove(self, ticket: int) -> T | None:
        """Take one waiting item out; None when it is not waiting (running, done or unknown)."""
        with self._lock:
            for i, item in enumerate(self._items):
                if self._ticket_of(item) == ticket:
                    return self._items.pop(i)
        return None

    def clear(self) -> list[T]:
        """Every waiting item, removed, in queue order."""
        with self._lock:
            items, self._items = self._items, []
            return items

    def move(self, ticket: int, position: int) -> bool:
        """Put a waiting item at `position` (clamped to the queue); False when it is not waiting."""
        with self._lock:
            for i, item in enumerate(self._items):
                if self._ticket_of(item) == ticket:
                    self._items.pop(i)
                    self._items.insert(max(0, min(position, len(self._items))), item)
                    return True
        return False

    def tickets(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._ticket_of(item) for item in self._items)

    def items(self) -> list[T]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
