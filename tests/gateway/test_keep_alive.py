"""Idle keep-alive connections: a client's pooled connection is never closed under it by the gateway.

uvicorn closes an idle connection after its keep-alive timeout (5 s by default), and httpx reuses a pooled
connection for up to 5 s of idleness: a request sent after about 5 s idle met the gateway's close (8 of 24
trainer resumes failed with ReadError). The gateway now keeps idle connections longer than any client's pool
does, and the trainer's client resends idempotent calls whose connection was reset.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from asyncrl.gateway_api.client import GatewayClient
from tests.gateway.conftest import RunningGateway

pytestmark = pytest.mark.slow

TRIALS = 100
AIOHTTP_KEEP_ALIVE_SECONDS = 15  # aiohttp's connector keeps idle connections this long (the longest client)


def test_an_idle_connection_stays_open_longer_than_any_clients_pool_keeps_it(gateway: RunningGateway) -> None:
    """The gateway's side of the race, measured directly: one raw HTTP/1.1 connection, idle a little longer
    than aiohttp's pool keeps one, then a second request on it. With uvicorn's default (5 s) the gateway had
    closed it, and any client reusing it in the instant of the close got a reset."""

    async def scenario() -> tuple[bytes, bytes]:
        host, port = gateway.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))

        async def get() -> bytes:
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = next(
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length")
            )
            await reader.readexactly(length)
            return head

        try:
            first = await get()
            await asyncio.sleep(AIOHTTP_KEEP_ALIVE_SECONDS + 1)
            second = await get()  # on the same connection
        finally:
            writer.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert first.startswith(b"HTTP/1.1 200")
    assert second.startswith(b"HTTP/1.1 200")


def test_a_resume_after_five_idle_seconds_never_meets_a_closed_connection(gateway: RunningGateway) -> None:
    """100 clients without any retry (plain httpx, as agents' SDKs pool): pause, idle 4.9-5.1 s, resume."""
    rng = random.Random(0)
    idles = [rng.uniform(4.9, 5.1) for _ in range(TRIALS)]
    headers = {"authorization": f"Bearer {gateway.key}"}

    async def trial(idle: float) -> str | None:
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
            paused = await client.post("/proxy/pause", json={"reason": "keep-alive test"})
            paused.raise_for_status()
            await asyncio.sleep(idle)  # the one pooled connection sits idle for about 5 s
            try:
                resumed = await client.post("/proxy/resume", json={"model_version": 0})
            except httpx.TransportError as error:
                return f"{type(error).__name__} after {idle:.3f}s idle"
            return None if resumed.status_code == 200 else f"HTTP {resumed.status_code}"

    async def all_trials() -> list[str | None]:
        return await asyncio.gather(*(trial(idle) for idle in idles))

    failures = [failure for failure in asyncio.run(all_trials()) if failure is not None]
    assert failures == [], f"{len(failures)} of {TRIALS}: {failures[:5]}"


def test_the_trainers_client_resends_an_idempotent_call_whose_connection_was_reset(
    gateway: RunningGateway,
) -> None:
    """The first resume meets a reset (a stand-in for a connection the network dropped: raised by the
    transport below the real client); the client sends it again and the gateway ends open."""
    resets = {"left": 1}

    class ResettingTransport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/proxy/resume" and resets["left"]:
                resets["left"] -= 1
                raise httpx.ReadError("connection reset by peer", request=request)
            return await super().handle_async_request(request)

    async def scenario() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            client._http._transport = ResettingTransport()
            await client.pause(reason="reset test", wait_seconds=1)
            view = await client.resume(model_version=1)
            assert not view.paused
            assert (await client.state()).model_version == 1

    asyncio.run(scenario())
    assert resets["left"] == 0
