"""A typed async client of the gateway, used by the trainer and the operator.

Every call maps to one route; errors come back as `GatewayError` carrying the status and the gateway's own
message. Long-polls (claim, completions, summary) pass their wait to the server and extend the HTTP timeout
accordingly, so nobody polls in a loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from asyncrl.gateway_api import paths
from asyncrl.gateway_api.events import EventsDocument, parse_events_batch
from asyncrl.gateway_api.models import (
    DEFAULT_LISTING_PAGE,
    ClaimRequest,
    CompletionPage,
    EventsBatchRequest,
    GatewayStats,
    LaunchReceipt,
    LaunchRequest,
    PauseView,
    RolloutCreate,
    RolloutPage,
    RolloutView,
    TrainerReport,
    Transition,
    UpstreamsView,
    WindowSummary,
)
from asyncrl.gateway_api.pool import PoolRelease, PoolReleased
from asyncrl.rollouts import RolloutState


class GatewayError(RuntimeError):
    def __init__(self, status: int, error: str, body: Any) -> None:
        super().__init__(f"gateway answered {status}: {error}")
        self.status = status
        self.error = error
        self.body = body


@dataclass(frozen=True)
class PauseResult:
    paused: bool
    inflight: int
    drained: bool
    inflight_at_pause: int
    drain_seconds: float
    aborted: int = 0  # calls in flight cancelled upstream by a pause with abort


@dataclass(frozen=True)
class EventsBatch:
    """The answer of `POST /api/rollouts/events`: events documents of many rollouts from one gateway."""

    instance_id: str  # the gateway instance that holds these rollouts (a restarted one holds none of ours)
    documents: list[EventsDocument]  # one per rollout found and readable
    missing: list[str]  # ids the gateway does not hold
    omitted: list[str]  # ids left out because the answer reached its byte bound: ask again
    size_bytes: int  # bytes of the answer's body
    malformed: dict[str, str] = field(default_factory=dict)  # ids whose document did not validate: why

    @classmethod
    def parse(cls, body: bytes) -> EventsBatch:
        answer, malformed = parse_events_batch(body)
        return cls(
            instance_id=answer.instance_id,
            documents=list(answer.documents),
            missing=list(answer.missing),
            omitted=list(answer.omitted),
            size_bytes=len(body),
            malformed=malformed,
        )


IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})
# A reset or refused connection, before any answer: the request may be sent again if it is idempotent.
RETRYABLE_ERRORS = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
CONNECTION_RETRIES = 3
CONNECTION_RETRY_SECONDS = 0.05


def new_claim_key() -> str:
    """A fresh name for one claim (`GatewayClient.claim`): keep it until that claim's answer is read."""
    return f"claim-{uuid.uuid4().hex}"


class GatewayClient:
    """`async with GatewayClient(url, key) as gateway: ...`"""

    def __init__(self, base_url: str, key: str, *, timeout_seconds: float = 30.0) -> None:
        self._timeout = timeout_seconds
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"authorization": f"Bearer {key}"},
            timeout=timeout_seconds,
        )

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        wait: float = 0.0,
        idempotent: bool | None = None,
        retry_timeouts: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """One call; an idempotent one (GET/PUT/DELETE, or marked) is sent again when its connection was reset
        or refused before an answer came (a pooled connection the server closed as it was reused), and with
        `retry_timeouts` also when no answer came in time."""
        retry = idempotent if idempotent is not None else method in IDEMPOTENT_METHODS
        attempts = CONNECTION_RETRIES + 1 if retry else 1
        retryable = (*RETRYABLE_ERRORS, httpx.TimeoutException) if retry_timeouts else RETRYABLE_ERRORS
        for attempt in range(attempts):
            try:
                response = await self._http.request(method, path, timeout=self._timeout + wait, **kwargs)
                break
            except retryable:
                if attempt + 1 == attempts:
                    raise
                await asyncio.sleep(CONNECTION_RETRY_SECONDS * (attempt + 1))
        if response.status_code >= 400:
            try:
                body = response.json()
                error = str(body.get("error", body))
            except ValueError:
                body, error = response.text, response.text
            raise GatewayError(response.status_code, error, body)
        return response

    # -- pause / resume -----------------------------------------------------------------------------------

    async def pause(
        self,
        *,
        reason: str | None,
        retry_after_seconds: float = 5,
        wait_seconds: float = 300.0,
        abort: bool = False,
        lease_seconds: float | None = None,
    ) -> PauseResult:
        """Pause and wait (server-side) for in-flight calls to finish; returns the drain measurements.

        With `abort` the calls in flight are cancelled upstream first (drain policy Abort), so the drain
        ends at once; the gateway re-issues them after the resume (Hold) or answers them 429 (Reject).
        With `lease_seconds` the gateway resumes by itself that long after the pause unless `renew_pause`
        extends it.
        """
        body: dict[str, Any] = {"reason": reason, "retry_after_seconds": retry_after_seconds, "abort": abort}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        response = await self._request(
            "POST",
            paths.PAUSE,
            wait=wait_seconds,
            idempotent=True,  # a second pause while paused keeps the gateway paused
            params={"wait": wait_seconds},
            json=body,
        )
        view = PauseView.model_validate(response.json())
        if view.drained is None or view.inflight_at_pause is None or view.drain_seconds is None:
            raise GatewayError(response.status_code, "the pause answer has no drain fields", view.wire())
        return PauseResult(
            paused=view.paused,
            inflight=view.inflight,
            drained=view.drained,
            inflight_at_pause=view.inflight_at_pause,
            drain_seconds=view.drain_seconds,
            aborted=view.aborted or 0,
        )

    async def renew_pause(self, *, lease_seconds: float) -> PauseView:
        """Extend the pause in effect to `lease_seconds` from now; `paused` is False when there was none (the
        gateway was resumed, or its lease ran out). Never pauses a gateway that is open."""
        response = await self._request(
            "POST", paths.PAUSE_RENEW, idempotent=True, json={"lease_seconds": lease_seconds}
        )
        return PauseView.model_validate(response.json())

    async def resume(self, *, model_version: int | None = None) -> PauseView:
        response = await self._request(
            "POST", paths.RESUME, idempotent=True, json={"model_version": model_version}
        )
        return PauseView.model_validate(response.json())

    async def state(self) -> PauseView:
        return PauseView.model_validate((await self._request("GET", paths.PAUSE_STATE)).json())

    # -- upstreams ----------------------------------------------------------------------------------------

    async def set_upstreams(self, urls: Iterable[str], *, model: str | None = None) -> UpstreamsView:
        """Replace the inference servers model calls go to (and, when given, the model name sent to them).

        Calls in flight finish on the server they started on. Returns where calls go now; an invalid URL or
        an empty list raises `GatewayError` (422).
        """
        if isinstance(urls, str):
            raise TypeError("set_upstreams() takes a list of URLs, not one string")
        body: dict[str, Any] = {"upstreams": list(urls)}
        if model is not None:
            body["model"] = model
        return UpstreamsView.model_validate_json(
            (await self._request("PUT", paths.UPSTREAMS, json=body)).content
        )

    async def upstreams(self) -> UpstreamsView:
        """Where model calls go now (no upstream until registered) and the model name sent there."""
        return UpstreamsView.model_validate_json((await self._request("GET", paths.UPSTREAMS)).content)

    # -- rollouts -----------------------------------------------------------------------------------------

    async def create_rollouts(self, rollouts: Iterable[RolloutCreate]) -> list[RolloutView]:
        payload = [rollout.model_dump(mode="json") for rollout in rollouts]
        response = await self._request("POST", paths.ROLLOUTS, json=payload)
        return [RolloutView.model_validate(item) for item in response.json()["rollouts"]]

    async def list_rollouts(
        self, *, state: RolloutState | None = None, group_id: str | None = None
    ) -> tuple[list[RolloutView], int]:
        """Every rollout (filtered), page after page, and the completion-feed cursor when the listing began.

        The first page's cursor: a rollout that ended while the pages were read is in the feed after it,
        even if a later page shows it ended too (recording a terminal state twice is harmless; missing one
        is not).
        """
        rollouts: list[RolloutView] = []
        page = await self.list_rollouts_page(state=state, group_id=group_id)
        cursor = page.cursor
        rollouts.extend(page.rollouts)
        while page.next_page is not None:
            page = await self.list_rollouts_page(state=state, group_id=group_id, page=page.next_page)
            rollouts.extend(page.rollouts)
        return rollouts, cursor

    async def list_rollouts_page(
        self,
        *,
        state: RolloutState | None = None,
        group_id: str | None = None,
        page: str | None = None,
        limit: int = DEFAULT_LISTING_PAGE,
    ) -> RolloutPage:
        """One page of the listing: the first without `page`, then the one its `next_page` names."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("state", state), ("group_id", group_id), ("page", page)):
            if value is not None:
                params[key] = value
        response = await self._request("GET", paths.ROLLOUTS, params=params)
        return RolloutPage.model_validate_json(response.content)

    async def get_rollout(self, rollout_id: str) -> RolloutView:
        return RolloutView.model_validate((await self._request("GET", paths.rollout_path(rollout_id))).json())

    async def claim(
        self,
        *,
        limit: int = 50,
        wait_seconds: float = 30.0,
        lease_seconds: float = 120.0,
        takeover: bool = False,
        claim_key: str | None = None,
    ) -> list[RolloutView]:
        """Queued rollouts to start; `takeover` also takes those leased by an earlier (dead) claimer.

        The claim is named by `claim_key` (a fresh one when None) and sent again with it when its connection
        is reset or its answer does not come in time: the gateway answers a repeated key with the rollouts
        that key already holds, so a lost answer leases nothing to nobody. A caller that retries a failed
        claim itself passes the same `claim_key` again (`new_claim_key()`), and a fresh one once it has read
        an answer.
        """
        request = ClaimRequest(
            limit=limit,
            wait_seconds=wait_seconds,
            lease_seconds=lease_seconds,
            takeover=takeover,
            claim_key=claim_key or new_claim_key(),
        )
        response = await self._request(
            "POST",
            paths.ROLLOUTS_CLAIM,
            wait=wait_seconds,
            idempotent=True,
            retry_timeouts=True,
            json=request.model_dump(mode="json"),
        )
        return [RolloutView.model_validate(item) for item in response.json()["rollouts"]]

    async def launch(self, rollout_id: str, *, launch_id: str) -> LaunchReceipt:
        """Mark a queued rollout launched before creating its agent; 409 (`GatewayError`) if it already was
        under another `launch_id` or is no longer queued. Repeating the same `launch_id` is a no-op."""
        body = LaunchRequest(launch_id=launch_id).model_dump(mode="json")
        response = await self._request("POST", paths.rollout_launch_path(rollout_id), json=body)
        return LaunchReceipt.model_validate(response.json())

    async def transition(
        self,
        rollout_id: str,
        state: RolloutState,
        *,
        message: str | None = None,
        attempt_id: str | None = None,
        instance_id: str | None = None,
    ) -> RolloutView:
        """Move a rollout to `state`; with `instance_id`, only on that gateway instance (else 409)."""
        body = Transition(
            state=state, message=message, attempt_id=attempt_id, instance_id=instance_id
        ).model_dump(mode="json", exclude_none=True)
        response = await self._request("POST", paths.rollout_transition_path(rollout_id), json=body)
        return RolloutView.model_validate(response.json())

    async def completions(
        self, *, after: int, limit: int = 1000, wait_seconds: float = 30.0
    ) -> CompletionPage:
        params = {"after": after, "limit": limit, "wait": wait_seconds}
        response = await self._request("GET", paths.COMPLETIONS, wait=wait_seconds, params=params)
        return CompletionPage.model_validate(response.json())

    async def delete_rollouts(self, rollout_ids: Iterable[str]) -> int:
        response = await self._request("POST", paths.ROLLOUTS_DELETE, json={"rollout_ids": list(rollout_ids)})
        return int(response.json()["deleted"])

    async def rollout_events(self, rollout_id: str) -> EventsDocument:
        """The rollout, its captured model calls (token ids, log-probs) and its agent events."""
        response = await self._request("GET", paths.rollout_events_path(rollout_id))
        return await asyncio.to_thread(EventsDocument.model_validate_json, response.content)

    async def rollout_events_batch(
        self, rollout_ids: Iterable[str], *, max_bytes: int | None = None
    ) -> EventsBatch:
        """Many rollouts' events documents in one request (at most `MAX_EVENTS_BATCH_ROLLOUTS` ids), bounded
        by `max_bytes`; ids left out for the bound come back in `omitted`. Parsed off the event loop."""
        if isinstance(rollout_ids, str):
            raise TypeError("rollout_events_batch() takes a list of rollout ids, not one string")
        request = EventsBatchRequest(rollout_ids=list(rollout_ids))
        if max_bytes is not None:
            request = EventsBatchRequest(rollout_ids=request.rollout_ids, max_bytes=max_bytes)
        response = await self._request("POST", paths.ROLLOUTS_EVENTS, json=request.model_dump(mode="json"))
        return await asyncio.to_thread(EventsBatch.parse, response.content)

    async def stats(self) -> GatewayStats:
        """Rollouts by state now and finished ever, launches ever, the feed cursor, the trainer's report, the
        pause state, and `instance_id` (changes when the gateway restarted and lost its state)."""
        return GatewayStats.model_validate((await self._request("GET", paths.STATS)).json())

    async def release_pool_workers(self, live_workers: list[str]) -> list[str]:
        """Fail the rollouts held by agent pool pods not in `live_workers` (`gateway/routes/pool.py`)."""
        body = PoolRelease(live_workers=live_workers).model_dump()
        response = await self._request("POST", paths.POOL_RELEASE, json=body)
        return PoolReleased.model_validate(response.json()).failed

    async def report_trainer(self, report: TrainerReport) -> None:
        """Leave the trainer's failure report with the gateway (it outlives the trainer container)."""
        await self._request("PUT", paths.TRAINER_REPORT, json=report.model_dump(mode="json"))

    # -- window summary -----------------------------------------------------------------------------------

    async def put_summary(self, summary: WindowSummary) -> None:
        await self._request("PUT", paths.WINDOW_SUMMARY, json=summary.model_dump(mode="json"))

    async def summary(
        self, *, after_step: int | None = None, after_posted: int | None = None, wait_seconds: float = 0.0
    ) -> WindowSummary | None:
        """The latest summary; with `after_step`, wait up to `wait_seconds` for a later step's; with
        `after_posted`, for any summary posted after that one (a redone step's too)."""
        params: dict[str, Any] = {"wait": wait_seconds}
        if after_step is not None:
            params["after_step"] = after_step
        if after_posted is not None:
            params["after_posted"] = after_posted
        response = await self._request("GET", paths.WINDOW_SUMMARY, wait=wait_seconds, params=params)
        if response.status_code == 204:
            return None
        return WindowSummary.model_validate(response.json())
