"""The rollout listing's order: what `GET /api/rollouts` reads one bounded page at a time.

A listing of 100,000 rollouts in one answer held the gateway's one event loop for seconds (issue 24 item 6):
no model call, pause or claim was served meanwhile. So the listing is paged, and a page must cost the same
wherever it starts: items keep the order they were added in, each under a position number that only grows,
and a page starts after a position by bisection (O(log n + page), not a walk from the first item). Removal
is lazy (the number stays in the order until half of them are gone), so deleting is O(1) too.

A page resumes after the last position it read, so an item is seen at most once by one walk through the
pages, items added meanwhile are seen at the end, and removed ones are skipped. Pure logic, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    last_position: int | None  # resume after it; None: nothing is left after this page


class ListingOrder(Generic[T]):
    def __init__(self) -> None:
        self._positions: list[int] = []  # ascending; may hold positions of removed items
        self._items: dict[int, T] = {}
        self._next_position = 1

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T) -> int:
        """Add `item` at the end; returns its position (what `remove` takes)."""
        position = self._next_position
        self._next_position += 1
        self._positions.append(position)
        self._items[position] = item
        return position

    def remove(self, position: int) -> None:
        self._items.pop(position, None)
        if len(self._positions) > 2 * len(self._items) + 1024:  # mostly removed: compact
            self._positions = [p for p in self._positions if p in self._items]

    def page(self, *, after: int, limit: int, max_scanned: int, keep: Callable[[T], bool]) -> Page[T]:
        """Up to `limit` items after position `after` that `keep` accepts, looking at no more than
        `max_scanned` positions (a filter that accepts few, or many removed items, make a short page, even
        an empty one, never a long one)."""
        start = bisect.bisect_right(self._positions, after)
        items: list[T] = []
        for index in range(start, len(self._positions)):
            position = self._positions[index]
            item = self._items.get(position)
            if item is not None and keep(item):
                items.append(item)
            if len(items) >= limit or index + 1 - start >= max_scanned:
                more = index + 1 < len(self._positions)
                return Page(items=items, last_position=position if more else None)
        return Page(items=items, last_position=None)
