"""The listing's order (`gateway/listing.py`): a walk through the pages, with items added and removed between
pages, sees every item that stayed exactly once, in the order they were added, and no page is long."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.gateway.listing import ListingOrder

# Between two pages: add n items, or remove the item at some index of those present.
Change = st.one_of(
    st.tuples(st.just("add"), st.integers(min_value=1, max_value=30)),
    st.tuples(st.just("remove"), st.integers(min_value=0, max_value=10_000)),
)


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(min_value=0, max_value=200),
    limit=st.integers(min_value=1, max_value=40),
    max_scanned=st.integers(min_value=1, max_value=60),
    even_only=st.booleans(),
    changes=st.lists(st.lists(Change, max_size=4), max_size=40),
)
def test_a_walk_through_the_pages_sees_each_item_that_stayed_exactly_once_in_order(
    start: int, limit: int, max_scanned: int, even_only: bool, changes: list[list[tuple[str, int]]]
) -> None:
    order: ListingOrder[int] = ListingOrder()
    positions: dict[int, int] = {}  # item -> position, for those present
    next_item = 0

    def add(n: int) -> None:
        nonlocal next_item
        for _ in range(n):
            positions[next_item] = order.add(next_item)
            next_item += 1

    def keep(item: int) -> bool:
        return item % 2 == 0 or not even_only

    add(start)
    removed: set[int] = set()
    seen: list[int] = []
    after, pages = 0, 0
    while True:
        page = order.page(after=after, limit=limit, max_scanned=max_scanned, keep=keep)
        assert len(page.items) <= limit
        seen += page.items
        pages += 1
        if page.last_position is None:
            break
        after = page.last_position
        for kind, value in changes[pages - 1] if pages - 1 < len(changes) else []:
            if kind == "add":
                add(value)
            elif positions:
                item = sorted(positions)[value % len(positions)]
                order.remove(positions.pop(item))
                removed.add(item)
        assert pages <= 10 * (next_item + 1)  # the walk ends
    stayed = [item for item in range(next_item) if item not in removed and keep(item)]
    assert len(seen) == len(set(seen))  # nobody twice
    assert set(stayed) <= set(seen)  # everybody who stayed
    assert seen == sorted(seen)  # in the order they were added
    assert all(keep(item) for item in seen)
    assert len(order) == len(positions)


def test_removing_most_items_compacts_the_order_and_pages_go_on_from_where_they_were() -> None:
    order: ListingOrder[int] = ListingOrder()
    positions = [order.add(item) for item in range(5000)]
    first = order.page(after=0, limit=10, max_scanned=10_000, keep=lambda _: True)
    assert first.items == list(range(10))
    for position in positions[:4990]:
        order.remove(position)
    assert first.last_position is not None
    rest = order.page(after=first.last_position, limit=100, max_scanned=10_000, keep=lambda _: True)
    assert rest.items == list(range(4990, 5000))
    assert rest.last_position is None
