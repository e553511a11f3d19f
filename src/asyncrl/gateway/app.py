"""Assemble one gateway: state, store, proxy and routes behind a single ASGI callable."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from asyncrl.gateway.api import build_api
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.door import (
    BODY_METHODS,
    CLIENT_GONE,
    ClientGone,
    Refused,
    authorize,
    parse_json,
    read_body,
    replay,
    route_access,
)
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.paths import PROXY_PREFIX
from asyncrl.gateway.pause import PauseState
from asyncrl.gateway.proxy import ProxyHandler, Receive, Scope, Send, send_json
from asyncrl.gateway.store import RolloutStore

DOOR_ROUTE = "door"  # the metric's route for requests refused or abandoned before their handler


@dataclass
class Gateway:
    """The gateway's parts; `asgi` is what uvicorn serves."""

    config: GatewayConfig
    pause: PauseState
    store: RolloutStore
    metrics: GatewayMetrics
    proxy: ProxyHandler
    api: FastAPI

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.api(scope, receive, send)
        elif scope["path"].startswith(PROXY_PREFIX):
            await self.proxy(scope, receive, send)  # the hot path checks the same limits itself
        else:
            await self._at_the_door(scope, receive, send)

    async def _at_the_door(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Token, then body bytes, then JSON: each refused before the next is looked at (see door.py)."""
        authorization = content_length = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length":
                content_length = value.decode("latin-1")
        try:
            authorize(self.key, authorization, route_access(scope["method"], scope["path"]))
            body = await read_body(receive, limit=self.config.max_body_bytes, declared_length=content_length)
            if body and scope["method"] in BODY_METHODS:
                parse_json(body, max_depth=self.config.max_json_depth)
        except Refused as refused:
            if refused.rejection_reason is not None:
                self.metrics.rejections.labels(refused.rejection_reason).inc()
            await send_json(send, refused.status, refused.body, refused.headers)
            return
        except ClientGone:  # left mid-body: nothing to answer, nothing went wrong here
            self.metrics.requests.labels(DOOR_ROUTE, str(CLIENT_GONE)).inc()
            return
        await self.api(scope, replay(body, receive), send)

    @property
    def key(self) -> str:
        return self.config.key.get_secret_value()


def build_gateway(config: GatewayConfig) -> Gateway:
    pause = PauseState(config.retry_after_seconds)
    store = RolloutStore(
        max_events_per_rollout=config.max_events_per_rollout,
        max_feed_entries=config.max_completion_feed_entries,
        max_event_bytes=config.max_event_bytes,
        max_capture_bytes_per_rollout=config.max_capture_bytes_per_rollout,
        max_capture_bytes=config.max_capture_bytes,
    )
    metrics = GatewayMetrics()
    metrics.watch_capture(lambda: store.capture_bytes)
    proxy = ProxyHandler(config=config, pause=pause, store=store, metrics=metrics)
    api = build_api(config=config, pause=pause, store=store, metrics=metrics, proxy=proxy)
    return Gateway(config=config, pause=pause, store=store, metrics=metrics, proxy=proxy, api=api)
