"""Assemble one gateway: state, store, proxy and routes behind a single ASGI callable."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import FastAPI

from asyncrl.gateway.api import build_api
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause import PauseState
from asyncrl.gateway.proxy import PROXY_PREFIX, ProxyHandler, Receive, Scope, Send
from asyncrl.gateway.store import RolloutStore


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
        if scope["type"] == "http" and scope["path"].startswith(PROXY_PREFIX):
            await self.proxy(scope, receive, send)
            return
        if scope["type"] == "http" and not await self._within_body_limit(scope, send):
            return
        await self.api(scope, receive, send)

    async def _within_body_limit(self, scope: Scope, send: Send) -> bool:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.config.max_body_bytes:
                body = json.dumps(
                    {"error": "request body too large", "limit_bytes": self.config.max_body_bytes}
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": 413,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body.encode()})
                return False
        return True


def build_gateway(config: GatewayConfig) -> Gateway:
    pause = PauseState(config.retry_after_seconds)
    store = RolloutStore(
        max_events_per_rollout=config.max_events_per_rollout,
        max_feed_entries=config.max_completion_feed_entries,
    )
    metrics = GatewayMetrics()
    proxy = ProxyHandler(config=config, pause=pause, store=store, metrics=metrics)
    api = build_api(config=config, pause=pause, store=store, metrics=metrics, proxy=proxy)
    return Gateway(config=config, pause=pause, store=store, metrics=metrics, proxy=proxy, api=api)
