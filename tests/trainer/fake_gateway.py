"""An in-memory gateway for unit tests of the step loop: the trainer's `TrainerGateway` without HTTP.

A fake, on purpose: the step loop's logic (what it draws, trains, carries, drops, redraws) is tested fast and
deterministically here, while tests/trainer/test_restarts.py and test_prefetch_loop.py run it against the
real gateway process. As much as can run in-process is real: rollouts live in the gateway's own
`RolloutStore` (its state machine, completion feed and long-poll, 404/409/410 rules), the pause is the
gateway's `PauseState`, events documents are built by the gateway's `capture.events_document` and parsed
with the client's parsers, and every answer is one of the gateway's wire models. Only the HTTP layer and the
agents are replaced: tests finish rollouts themselves (`finish_group`, or `on_groups_created` as the agents),
and `restart()` replaces the whole instance as a killed and restarted gateway process would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from asyncrl.gateway.capture import events_document
from asyncrl.gateway.pause_state import PauseState
from asyncrl.gateway.store import (
    CapturedCall,
    FeedGap,
    RolloutConflict,
    RolloutNotFound,
    RolloutStore,
)
from asyncrl.gateway_api.client import EventsBatch, GatewayError, PauseResult
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import (
    DEFAULT_EVENTS_BATCH_BYTES,
    CompletionEntry,
    CompletionPage,
    GatewayStats,
    PauseView,
    RolloutCreate,
    RolloutView,
    UpstreamsUpdate,
    UpstreamsView,
    WindowSummary,
)
from asyncrl.rollouts import TERMINAL_STATES, RolloutState

ATTEMPT = "a1"
PROMPT_TOKENS = (101, 102, 103)
RESPONSE_TOKENS = (201, 202)


@dataclass(frozen=True)
class GatewayCall:
    """One call the loop made: the method, whether the gateway was paused when it came, its model version."""

    method: str
    paused: bool
    instance: int  # which gateway instance answered (0, then 1 after the first restart, ...)
    model_version: int | None = None  # `resume` only


@dataclass
class GatewayInstance:
    """What one gateway process holds; all of it is lost when the process restarts."""

    number: int
    store: RolloutStore = field(default_factory=RolloutStore)
    pause: PauseState = field(default_factory=lambda: PauseState(default_retry_after_seconds=5.0))
    upstreams: tuple[str, ...] = ()
    model: str = "served-model"  # the gateway's --model until the trainer names its own
    summaries: list[WindowSummary] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # set when the process died

    def pause_fields(self) -> dict[str, Any]:
        """The pause state's fields of `PauseView` (and of the stats), as a Reject-mode gateway sends them.
        No agent call goes through this gateway, so none is ever in flight and every drain ends at once."""
        return {**self.pause.snapshot().as_json(), "model_version": self.pause.model_version}


class FakeGateway:
    """Implements `asyncrl.trainer.gateway_port.TrainerGateway` in memory (see the module docstring)."""

    def __init__(self, *, max_feed_entries: int = 100_000) -> None:
        self.max_feed_entries = max_feed_entries  # the completions the feed keeps (older cursors get 410)
        self.instance = self._start(number=0)
        self.calls: list[GatewayCall] = []
        self.created: list[RolloutCreate] = []  # every rollout ever created, in order, across restarts
        self.group_ids: list[str] = []  # every group ever created, in creation order, across restarts
        # The agents: called with the ids of groups just created (tests finish some of them at once).
        self.on_groups_created: Callable[[Sequence[str]], None] | None = None
        # Called when a completions long-poll finds nothing to deliver and starts to wait.
        self.on_long_poll: Callable[[], None] | None = None

    # -- what tests do ------------------------------------------------------------------------------------

    def restart(self) -> None:
        """The gateway process dies and a new one answers: a new instance id, no rollouts, no upstreams, no
        pause, a feed starting from 0; a long-poll waiting in the old process loses its connection."""
        self.instance.gone.set()
        self.instance = self._start(number=self.instance.number + 1)

    def finish_group(
        self, group_id: str, *, state: RolloutState = RolloutState.SUCCEEDED, reward: float = 1.0
    ) -> None:
        """Every unfinished rollout of the group ends as an agent would end it (see `finish_rollout`)."""
        for rollout in self.instance.store.select(group_id=group_id):
            if not rollout.state.is_terminal:
                self.finish_rollout(rollout.rollout_id, state=state, reward=reward)

    def finish_rollout(
        self, rollout_id: str, *, state: RolloutState = RolloutState.SUCCEEDED, reward: float = 1.0
    ) -> None:
        """What an agent does: start, make one model call (captured with token ids and log-probs), post its
        reward, end in `state`."""
        store, version = self.instance.store, self.instance.pause.model_version
        store.transition(rollout_id, RolloutState.RUNNING, message=None, attempt_id=ATTEMPT)
        call = CapturedCall(
            attempt_id=ATTEMPT,
            path="chat/completions",
            status=200,
            latency_seconds=0.01,
            model_version=version,
            started_at=time.time(),
            prompt_token_ids=PROMPT_TOKENS,
            response_token_ids=RESPONSE_TOKENS,
            response_logprobs=(-0.5,) * len(RESPONSE_TOKENS),
        )
        store.record_call(rollout_id, call)
        data = {"value": reward}
        store.record_event(rollout_id, ATTEMPT, "reward", data, size=len(json.dumps(data)))
        store.transition(rollout_id, state, message=None, attempt_id=ATTEMPT)

    def rollout_states(self, group_id: str) -> dict[str, RolloutState]:
        rollouts = self.instance.store.select(group_id=group_id)
        return {rollout.rollout_id: rollout.state for rollout in rollouts}

    def created_ids(self, group_id: str) -> list[str]:
        """The ids of the group's rollouts as created (whether the gateway still holds them or not)."""
        return [creation.rollout_id for creation in self.created if creation.group_id == group_id]

    def feed(self) -> list[CompletionEntry]:
        """The current instance's completion feed as retained: what the operator reads to delete Jobs."""
        return list(self.instance.store._feed_from(0))

    def inputs(self) -> dict[str, Any]:
        """Group id -> the dataset row its rollouts were created with."""
        return {creation.group_id: creation.input for creation in self.created}

    # -- TrainerGateway -----------------------------------------------------------------------------------

    async def stats(self) -> GatewayStats:
        instance = self._called("stats")
        store = instance.store
        return GatewayStats(
            instance_id=store.instance_id,
            rollouts=store.counts_by_state(),
            finished_totals={state: store.finished_totals.get(state, 0) for state in TERMINAL_STATES},
            launches=store.launch_totals,
            cursor=store.feed_cursor,
            **instance.pause_fields(),
        )

    async def set_upstreams(self, urls: Iterable[str], *, model: str | None) -> UpstreamsView:
        instance = self._called("set_upstreams")
        try:
            update = UpstreamsUpdate(upstreams=list(urls), model=model)
        except ValidationError as error:
            raise GatewayError(422, str(error), None) from error
        instance.upstreams = tuple(update.upstreams)
        instance.model = update.model or instance.model
        return UpstreamsView(upstreams=list(instance.upstreams), model=instance.model)

    async def pause(
        self,
        *,
        reason: str | None,
        retry_after_seconds: float,
        wait_seconds: float,
        abort: bool = False,
    ) -> PauseResult:
        pause = self._called("pause").pause
        pause.pause(reason=reason, retry_after_seconds=retry_after_seconds)
        if abort:
            pause.abort_inflight()
        drain = await pause.wait_drained(wait_seconds)
        return PauseResult(
            paused=pause.paused,
            inflight=drain.inflight,
            drained=drain.drained,
            inflight_at_pause=drain.inflight_at_pause,
            drain_seconds=drain.drain_seconds,
            aborted=drain.aborted,
        )

    async def resume(self, *, model_version: int | None) -> PauseView:
        instance = self._called("resume", model_version=model_version)
        instance.pause.resume(model_version=model_version)
        return PauseView(**instance.pause_fields())

    async def create_rollouts(self, rollouts: Iterable[RolloutCreate]) -> list[RolloutView]:
        instance = self._called("create_rollouts")
        requests = list(rollouts)
        known = {rollout.rollout_id for rollout in instance.store.select()}
        try:
            created = instance.store.create(requests)
        except RolloutConflict as error:
            raise GatewayError(409, str(error), None) from error
        new = [request for request in requests if request.rollout_id not in known]
        self.created += new
        new_groups = list(dict.fromkeys(request.group_id for request in new))
        self.group_ids += new_groups
        if self.on_groups_created is not None and new_groups:
            self.on_groups_created(new_groups)
        return [rollout.view() for rollout in created]

    async def list_rollouts(self) -> tuple[list[RolloutView], int]:
        store = self._called("list_rollouts").store
        return [rollout.view() for rollout in store.select()], store.feed_cursor

    async def transition(self, rollout_id: str, state: RolloutState, *, message: str | None) -> RolloutView:
        store = self._called("transition").store
        try:
            return store.transition(rollout_id, state, message=message, attempt_id=None).view()
        except RolloutNotFound as error:
            raise GatewayError(404, str(error), None) from error
        except RolloutConflict as error:
            raise GatewayError(409, str(error), None) from error

    async def completions(self, *, after: int, wait_seconds: float) -> CompletionPage:
        instance = self._called("completions")
        store = instance.store
        if store.feed_cursor <= after and self.on_long_poll is not None:
            self.on_long_poll()
        if instance.gone.is_set():
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        poll = asyncio.ensure_future(store.completions(after=after, limit=1000, wait_seconds=wait_seconds))
        gone = asyncio.ensure_future(instance.gone.wait())
        try:
            await asyncio.wait({poll, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not poll.done():  # the process died under the long-poll
            poll.cancel()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        try:
            entries, cursor = poll.result()
        except FeedGap as error:
            raise GatewayError(410, str(error), None) from error
        return CompletionPage(entries=entries, cursor=cursor)

    async def delete_rollouts(self, rollout_ids: Iterable[str]) -> int:
        return self._called("delete_rollouts").store.delete(rollout_ids)

    async def rollout_events(self, rollout_id: str) -> EventsDocument:
        store = self._called("rollout_events").store
        try:
            rollout = store.get(rollout_id)
        except RolloutNotFound as error:
            raise GatewayError(404, str(error), None) from error
        return EventsDocument.model_validate_json(events_document(rollout))

    async def rollout_events_batch(self, rollout_ids: Iterable[str], *, max_bytes: int | None) -> EventsBatch:
        """The answer `POST /api/rollouts/events` gives (same bound: the first document always, then up to
        `max_bytes`), parsed as the client parses it."""
        store = self._called("rollout_events_batch").store
        bound = max_bytes if max_bytes is not None else DEFAULT_EVENTS_BATCH_BYTES
        documents: list[bytes] = []
        missing: list[str] = []
        omitted: list[str] = []
        size = 0
        for rollout_id in dict.fromkeys(rollout_ids):
            if documents and size >= bound:
                omitted.append(rollout_id)
                continue
            rollout = store.find(rollout_id)
            if rollout is None:
                missing.append(rollout_id)
                continue
            document = events_document(rollout)
            if documents and size + len(document) > bound:
                omitted.append(rollout_id)
                size = bound  # full: the rest are omitted too
                continue
            documents.append(document)
            size += len(document)
        head = json.dumps({"instance_id": store.instance_id, "missing": missing, "omitted": omitted})
        return EventsBatch.parse(b'%s,"documents":[%s]}' % (head[:-1].encode(), b",".join(documents)))

    async def put_summary(self, summary: WindowSummary) -> None:
        instance = self._called("put_summary")
        instance.store.set_summary(summary)
        instance.summaries.append(summary)

    # -- internals ----------------------------------------------------------------------------------------

    def _start(self, *, number: int) -> GatewayInstance:
        return GatewayInstance(number=number, store=RolloutStore(max_feed_entries=self.max_feed_entries))

    def _called(self, method: str, *, model_version: int | None = None) -> GatewayInstance:
        instance = self.instance
        self.calls.append(
            GatewayCall(
                method=method,
                paused=instance.pause.paused,
                instance=instance.number,
                model_version=model_version,
            )
        )
        return instance
