"""Training rows prepared while agents still work, so a paused gateway waits only for the update.

A complete group's rollouts are terminal: their events never change again, so there is no reason to read
them while the gateway is paused. As groups complete, their rollouts' events documents are fetched in
batches (`POST /api/rollouts/events`, bounded in ids and bytes) and adapted into rows off the event loop; at
the pause the loop takes the rows of the groups it consumes and fetches only what is not prepared (normally
nothing).

What is prepared never changes what is trained: rows count only while the group they came from is still in
the window with the same terminal states and the gateway that served them is still the one holding the
window. A group cancelled as stale, consumed, or lost with a restarted gateway takes its rows with it. The
two decisions (what to fetch next, which prepared rollouts are still valid) are plain functions below, tested
with properties; `RowPrefetcher` is their I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from asyncrl import metric_names as names
from asyncrl.gateway_api.client import GatewayError
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import DEFAULT_EVENTS_BATCH_BYTES
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import AdapterConfig, AdapterCounts, adapt_rollout
from asyncrl.trainer.gateway_port import TrainerGateway
from asyncrl.trainer.rows import TrainingRow
from asyncrl.trainer.window import Group

logger = logging.getLogger(__name__)

DEFAULT_BATCH_ROLLOUTS = 64


class RolloutsMissing(RuntimeError):
    """The gateway does not hold rollouts the window expects (lost with a restart, or deleted)."""

    def __init__(self, rollout_ids: Sequence[str]) -> None:
        shown = ", ".join(rollout_ids[:5]) + (" ..." if len(rollout_ids) > 5 else "")
        super().__init__(f"the gateway does not hold {len(rollout_ids)} rollouts of the window: {shown}")
        self.rollout_ids = tuple(rollout_ids)


@dataclass(frozen=True, kw_only=True)
class PreparedRollout:
    """One rollout's training rows, adapted from the events document one gateway instance served."""

    rollout_id: str
    group_id: str
    state: RolloutState  # the rollout's state in that document
    instance_id: str  # the gateway instance that served the document
    rows: tuple[TrainingRow, ...]
    counts: AdapterCounts


# -- the pure decisions -------------------------------------------------------------------------------------


def rollouts_to_prefetch(groups: Iterable[Group], *, skip: Collection[str], max_rollouts: int) -> list[str]:
    """The next batch to fetch: rollouts of complete groups, earliest completed group first (the order the
    window consumes them), leaving out `skip` (prepared, being fetched, or failed); at most `max_rollouts`."""
    if max_rollouts < 1:
        raise ValueError(f"max_rollouts must be at least 1, not {max_rollouts}")
    complete = sorted(
        (group for group in groups if group.is_complete and group.completion_sequence is not None),
        key=lambda group: group.completion_sequence or 0,
    )
    batch: list[str] = []
    for group in complete:
        for rollout_id in group.rollout_ids:
            if rollout_id not in skip:
                batch.append(rollout_id)
                if len(batch) == max_rollouts:
                    return batch
    return batch


def invalid_prepared(
    prepared: Mapping[str, PreparedRollout], groups: Iterable[Group], *, instance_id: str | None
) -> list[str]:
    """Prepared rollouts whose rows may no longer be trained on.

    Valid means: its group is still in the window (not consumed, not cancelled as stale, not dropped as lost
    with a gateway), it is a member of that group, the window recorded the same terminal state its document
    showed, and the gateway that served it is the one holding the window now.
    """
    by_id = {group.group_id: group for group in groups}
    invalid = []
    for rollout_id, entry in prepared.items():
        group = by_id.get(entry.group_id)
        valid = (
            group is not None
            and rollout_id in group.rollout_ids
            and group.terminal_states.get(rollout_id) is entry.state
            and entry.instance_id == instance_id
        )
        if not valid:
            invalid.append(rollout_id)
    return invalid


def adapt_documents(
    documents: Sequence[EventsDocument],
    *,
    group_of: Mapping[str, str],
    instance_id: str,
    config: AdapterConfig,
) -> tuple[list[PreparedRollout], dict[str, Exception]]:
    """Adapt a batch's documents; those of rollouts not asked for are ignored, errors are returned per id."""
    prepared: list[PreparedRollout] = []
    errors: dict[str, Exception] = {}
    for document in documents:
        rollout_id = document.rollout.rollout_id
        if rollout_id not in group_of:
            continue
        try:
            result = adapt_rollout(document, group_id=group_of[rollout_id], config=config)
        except Exception as error:  # a document the adapter refuses: the step that consumes it reports it
            errors[rollout_id] = error
            continue
        prepared.append(
            PreparedRollout(
                rollout_id=rollout_id,
                group_id=result.group_id,
                state=result.state,
                instance_id=instance_id,
                rows=result.rows,
                counts=result.counts,
            )
        )
    return prepared, errors


def malformed_errors(malformed: Mapping[str, str]) -> dict[str, Exception]:
    """A batch's documents that did not validate, as the errors the step that consumes them raises."""
    return {
        rollout_id: ValueError(f"the events document of rollout {rollout_id} is malformed: {reason}")
        for rollout_id, reason in malformed.items()
    }


# -- the I/O ------------------------------------------------------------------------------------------------


@dataclass
class PrefetchTotals:
    """What the prefetcher moved, for the step's metrics (reset by the loop each step)."""

    rollouts_prepared_ahead: int = 0  # adapted in the background, before any pause
    rollouts_fetched_at_pause: int = 0  # fetched because they were not prepared when the update needed them
    requests: int = 0
    bytes_fetched: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            names.PREFETCH + "rollouts_prepared_ahead": float(self.rollouts_prepared_ahead),
            names.PREFETCH + "rollouts_fetched_at_pause": float(self.rollouts_fetched_at_pause),
            names.PREFETCH + "requests": float(self.requests),
            names.PREFETCH + "bytes_fetched": float(self.bytes_fetched),
        }


@dataclass
class RowPrefetcher:
    """Fetches and adapts complete groups' rollouts in the background; hands their rows to the update.

    `groups` and `instance_id` read the loop's current window and gateway instance each time, so a window
    rebuilt after a restart, or a new gateway, is seen at once.
    """

    gateway: TrainerGateway
    config: AdapterConfig
    groups: Callable[[], Sequence[Group]]
    instance_id: Callable[[], str | None]
    batch_rollouts: int = DEFAULT_BATCH_ROLLOUTS
    batch_bytes: int = DEFAULT_EVENTS_BATCH_BYTES
    totals: PrefetchTotals = field(default_factory=PrefetchTotals)
    _prepared: dict[str, PreparedRollout] = field(default_factory=dict)
    _pending: set[str] = field(default_factory=set)
    _failed: set[str] = field(default_factory=set)  # not retried in the background; the pause fetches them
    _worker: asyncio.Task[None] | None = None
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    def notice(self) -> None:
        """The window changed (completions, removals): drop what is no longer valid, fetch what is new."""
        self._prune()
        idle = self._worker is None or self._worker.done()
        if idle and rollouts_to_prefetch(self.groups(), skip=self._skip(), max_rollouts=1):
            self._worker = asyncio.create_task(self._work(), name="asyncrl-row-prefetch")

    async def settle(self, groups: Sequence[Group]) -> None:
        """Wait while the background fetch still works on these groups (before pausing, so the pause finds
        their rows ready), then stop it until the next `notice`: nothing competes with the update. Returns
        early when the fetch stops, e.g. because the gateway failed; `rows_for` fetches what is left."""
        self.notice()
        wanted = {rollout_id for group in groups for rollout_id in group.rollout_ids}
        try:
            await self._wait_for(wanted)
        finally:
            await self._stop_worker()

    async def _wait_for(self, wanted: set[str]) -> None:
        while self._worker is not None and not self._worker.done():
            if not wanted - self._prepared.keys() - self._failed:
                return
            self._progress.clear()
            progress = asyncio.ensure_future(self._progress.wait())
            try:
                await asyncio.wait({self._worker, progress}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                progress.cancel()

    async def rows_for(self, groups: Sequence[Group]) -> tuple[list[TrainingRow], AdapterCounts]:
        """The rows of these groups (in group, then rollout order), fetching now whatever is not prepared.

        Raises `RolloutsMissing` when the gateway lacks one of their rollouts, gateway errors as they come.
        """
        await self._stop_worker()
        self._prune()
        missing = [
            rollout_id
            for group in groups
            for rollout_id in group.rollout_ids
            if rollout_id not in self._prepared
        ]
        fetched = await self._fetch_all(missing, groups) if missing else {}
        self.totals.rollouts_fetched_at_pause += len(missing)
        rows: list[TrainingRow] = []
        counts: list[AdapterCounts] = []
        for group in groups:
            for rollout_id in group.rollout_ids:
                entry = self._prepared.get(rollout_id) or fetched[rollout_id]
                rows += entry.rows
                counts.append(entry.counts)
        return rows, AdapterCounts.total(counts)

    async def close(self) -> None:
        await self._stop_worker()
        self._prepared.clear()

    # -- internals ------------------------------------------------------------------------------------------

    def _skip(self) -> set[str]:
        return self._prepared.keys() | self._pending | self._failed

    def _prune(self) -> None:
        groups = self.groups()
        for rollout_id in invalid_prepared(self._prepared, groups, instance_id=self.instance_id()):
            del self._prepared[rollout_id]
        members = {rollout_id for group in groups for rollout_id in group.rollout_ids}
        self._failed &= members

    async def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
        if worker is not None:
            await asyncio.gather(worker, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            self._prune()
            groups = self.groups()
            ids = rollouts_to_prefetch(groups, skip=self._skip(), max_rollouts=self.batch_rollouts)
            if not ids:
                return
            group_of = {rid: group.group_id for group in groups for rid in group.rollout_ids}
            self._pending.update(ids)
            try:
                batch = await self.gateway.rollout_events_batch(ids, max_bytes=self.batch_bytes)
                prepared, errors = await asyncio.to_thread(
                    adapt_documents,
                    batch.documents,
                    group_of={rid: group_of[rid] for rid in ids},
                    instance_id=batch.instance_id,
                    config=self.config,
                )
            except (httpx.TransportError, GatewayError, ValueError) as error:
                # The step's own calls notice a failed gateway and recover; the pause fetches what is left.
                logger.warning("fetching rows ahead of the pause failed (%s); will retry", error)
                return
            finally:
                self._pending.difference_update(ids)
            self.totals.requests += 1
            self.totals.bytes_fetched += batch.size_bytes
            self.totals.rollouts_prepared_ahead += len(prepared)
            self._failed.update(errors)
            self._failed.update(batch.malformed)
            self._failed.update(batch.missing)
            for entry in prepared:
                self._prepared[entry.rollout_id] = entry
            if invalid_prepared(
                {entry.rollout_id: entry for entry in prepared}, self.groups(), instance_id=self.instance_id()
            ):
                # Served differently than the window recorded (or by another gateway): left to the pause.
                self._failed.update(entry.rollout_id for entry in prepared)
            self._prune()
            self._progress.set()

    async def _fetch_all(
        self, rollout_ids: Sequence[str], groups: Sequence[Group]
    ) -> dict[str, PreparedRollout]:
        """Fetch and adapt these rollouts now, in bounded batches; every one or an error."""
        group_of = {rid: group.group_id for group in groups for rid in group.rollout_ids}
        fetched: dict[str, PreparedRollout] = {}
        wanted = list(rollout_ids)
        while wanted:
            request, wanted = wanted[: self.batch_rollouts], wanted[self.batch_rollouts :]
            batch = await self.gateway.rollout_events_batch(request, max_bytes=self.batch_bytes)
            self.totals.requests += 1
            self.totals.bytes_fetched += batch.size_bytes
            if batch.missing:
                raise RolloutsMissing(batch.missing)
            prepared, errors = await asyncio.to_thread(
                adapt_documents,
                batch.documents,
                group_of={rid: group_of[rid] for rid in request},
                instance_id=batch.instance_id,
                config=self.config,
            )
            errors = malformed_errors(batch.malformed) | errors
            if errors:
                raise next(iter(errors.values()))
            fetched.update((entry.rollout_id, entry) for entry in prepared)
            wanted = batch.omitted + wanted
        unanswered = [rollout_id for rollout_id in rollout_ids if rollout_id not in fetched]
        if unanswered:
            raise RolloutsMissing(unanswered)
        return fetched
