"""Which of the operator's children exist, as its label-selected watches last saw them (an informer's cache,
names only).

One index per operator, fed by one watch per watched kind and scope (a namespace, or every namespace): a
listing replaces what the index knew of that kind in that scope (so a child deleted while a watch was down is
seen gone at the relist), and each watch event adds or removes one name. A run's reconcile asks it whether a
child exists instead of reading the child from the API server at every requeue (issue 25 item 9: those reads
were three quarters of an idle run's API requests). Pure bookkeeping: the watches (`kube.LabelWatch`) are the
I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Scope = str | None  # a namespace, or None: every namespace


class ChildIndex:
    def __init__(self) -> None:
        self._names: dict[tuple[str, str], set[str]] = {}  # (kind, namespace): names present
        self._listed: set[tuple[str, Scope]] = set()

    def listed(self, kind: str, scope: Scope, objects: Iterable[Mapping[str, Any]]) -> None:
        """A watch's (re)listing of `kind` in `scope`: exactly these exist there now."""
        for key in [key for key in self._names if key[0] == kind and scope in (None, key[1])]:
            del self._names[key]
        for item in objects:
            self.apply(kind, "ADDED", item)
        self._listed.add((kind, scope))

    def apply(self, kind: str, event_type: str, item: Mapping[str, Any]) -> None:
        """One watch event (or a child the operator just created)."""
        metadata = item["metadata"]
        key = (kind, str(metadata["namespace"]))
        if event_type == "DELETED":
            self._names.get(key, set()).discard(str(metadata["name"]))
        else:
            self._names.setdefault(key, set()).add(str(metadata["name"]))

    def exists(self, kind: str, namespace: str, name: str) -> bool | None:
        """Whether the child exists; None when no watch of that kind has listed its namespace yet."""
        if (kind, namespace) not in self._listed and (kind, None) not in self._listed:
            return None
        return name in self._names.get((kind, namespace), ())
