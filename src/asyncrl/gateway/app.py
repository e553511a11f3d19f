"""Assemble one gateway: state, store, proxy and routes behind a single ASGI callable."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from asyncrl.gateway.access import Caller, route_access
from asyncrl.gateway.admission import (
    BODY_METHODS,
    CLIENT_GONE,
    PARSED_BODY_SCOPE_KEY,
    ClientGone,
    Refused,
    admit_connection,
    authorize,
    body_limit,
    enter_share,
    parse_json,
    read_charged_body,
    replay,
)
from asyncrl.gateway.api import build_api
from asyncrl.gateway.budgets import AgentBudgets
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause_state import PauseState
from asyncrl.gateway.proxy import ProxyHandler, Receive, Scope, Send, send_json
from asyncrl.gateway.store import RolloutStore
from asyncrl.gateway_api.paths import PROXY_PREFIX

ADMISSION_ROUTE = "admission"  # the metric's route for requests refused or abandoned before their handler


@dataclass
class Gateway:
    """The gateway's parts; `asgi` is what uvicorn serves."""

    config: GatewayConfig
    pause: PauseState
    store: RolloutStore
    metrics: GatewayMetrics
    proxy: ProxyHandler
    api: FastAPI
    budgets: AgentBudgets

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.api(scope, receive, send)
        elif scope["path"].startswith(PROXY_PREFIX):
            await self.proxy(scope, receive, send)  # the hot path checks the same limits itself
        else:
            await self._at_the_door(scope, receive, send)

    async def _at_the_door(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Token, then the agent's share, then body bytes, then JSON: each refused before the next is looked
        at (see admission.py). The parsed body goes to the route in the scope, so it is parsed once."""
        authorization = content_length = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length":
                content_length = value.decode("latin-1")
        access = route_access(scope["method"], scope["path"])
        agent: str | None = None  # the rollout whose agent token is calling: its share is charged
        try:
            caller = authorize(self.key, authorization, access)
            admit_connection(scope, caller)
            if caller is Caller.AGENT:
                agent = access.rollout_id
            enter_share(self.budgets, agent)
        except Refused as refused:
            await self._refuse(send, refused)
            return
        try:
            try:
                body = await read_charged_body(
                    receive,
                    budgets=self.budgets,
                    rollout_id=agent,
                    limit=body_limit(
                        access,
                        max_body_bytes=self.config.max_body_bytes,
                        max_event_bytes=self.config.max_event_bytes,
                    ),
                    declared_length=content_length,
                    timeout_seconds=self.config.body_timeout_seconds,
                )
                if body and scope["method"] in BODY_METHODS:
                    scope[PARSED_BODY_SCOPE_KEY] = parse_json(
                        body,
                        max_depth=self.config.max_json_depth,
                        count_parsed=self.metrics.parsed_body_bytes.inc,
                    )
            except Refused as refused:
                await self._refuse(send, refused)
                return
            except ClientGone:  # left mid-body: nothing to answer, nothing went wrong here
                self.metrics.requests.labels(ADMISSION_ROUTE, str(CLIENT_GONE)).inc()
                return
            await self.api(scope, replay(body, receive), send)
        finally:
            if agent is not None:
                self.budgets.leave(agent)

    async def _refuse(self, send: Send, refused: Refused) -> None:
        if refused.rejection_reason is not None:
            self.metrics.rejections.labels(refused.rejection_reason).inc()
        await send_json(send, refused.status, refused.body, refused.headers)

    @property
    def key(self) -> str:
        return self.config.key.get_secret_value()


def build_gateway(config: GatewayConfig) -> Gateway:
    pause = PauseState(config.run.retry_after_seconds)
    store = RolloutStore(
        max_events_per_rollout=config.max_events_per_rollout,
        max_feed_entries=config.max_completion_feed_entries,
        max_event_bytes=config.max_event_bytes,
        max_capture_bytes_per_rollout=config.run.max_capture_bytes_per_rollout,
        max_capture_bytes=config.run.max_capture_bytes,
    )
    metrics = GatewayMetrics()
    metrics.watch_capture(lambda: store.capture_bytes)
    budgets = AgentBudgets(config.agent_budget)
    proxy = ProxyHandler(config=config, pause=pause, store=store, metrics=metrics, budgets=budgets)
    api = build_api(config=config, pause=pause, store=store, metrics=metrics, proxy=proxy)
    return Gateway(
        config=config, pause=pause, store=store, metrics=metrics, proxy=proxy, api=api, budgets=budgets
    )
