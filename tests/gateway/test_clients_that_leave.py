"""Clients that leave are not errors: a held call whose client disconnects, and a body cut off mid-way.

Before: the first raised `InvalidStateError: Result is not set` (a 500 and a traceback, 20 of 20), the second
raised `CancelledError` out of the door ("Exception in ASGI application", counted as a 500; one client made
204 tracebacks). Both are now counted as 499 (client gone), with nothing in the log.
"""

from __future__ import annotations

import asyncio
from functools import partial

import httpx

from tests.gateway.conftest import RunningGateway, create_rollouts
from tests.gateway.test_pauses import CHAT, _held_is, admin_headers, agent_headers, until

LEAVERS = 20


def metric_value(gateway: RunningGateway, line_prefix: str) -> float:
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith(line_prefix):
            return float(line.split()[-1])
    return 0.0


def no_traceback(gateway: RunningGateway) -> None:
    log = gateway.process.log()
    for sign in ("Traceback", "InvalidStateError", "Exception in ASGI application", "never retrieved"):
        assert sign not in log, f"{sign!r} in the gateway's log:\n{log[-3000:]}"


def test_held_calls_whose_clients_leave_are_499_without_a_traceback(gateway: RunningGateway) -> None:
    rollouts = [f"r{i}" for i in range(LEAVERS)]
    with gateway.management() as admin:
        create_rollouts(admin, *rollouts)

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as admin:
            await admin.post("/proxy/pause", json={"reason": "u"}, headers=admin_headers(gateway))
            calls = []
            for rid in rollouts:  # each on its own connection, so that leaving closes it
                client = httpx.AsyncClient(base_url=gateway.url, timeout=30)
                call = client.post(gateway.proxy_path(rid), json=CHAT, headers=agent_headers(gateway, rid))
                calls.append((client, asyncio.create_task(call)))
            await until(partial(_held_is, admin, gateway, LEAVERS), f"{LEAVERS} held calls")
            for client, call in calls:  # the agents give up: their connections close
                call.cancel()
                await client.aclose()
            await until(partial(_held_is, admin, gateway, 0), "the held queue to empty")
            await admin.post("/proxy/resume", headers=admin_headers(gateway))

    asyncio.run(scenario())
    assert metric_value(gateway, 'asyncrl_gateway_requests_total{code="499",route="proxy"}') == LEAVERS
    assert metric_value(gateway, 'asyncrl_gateway_requests_total{code="500",route="proxy"}') == 0
    no_traceback(gateway)


def test_bodies_cut_off_mid_way_are_499_without_a_traceback(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    host, port = gateway.url.removeprefix("http://").split(":")
    targets = [
        ("/api/rollouts", f"Bearer {gateway.key}"),  # the management API's door
        (gateway.proxy_path("r1"), agent_headers(gateway, "r1")["authorization"]),  # the proxy's own
    ]

    async def cut_off(path: str, authorization: str) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n"
            'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"a": '.encode()
        )
        await writer.drain()
        await asyncio.sleep(0.2)  # the gateway is reading the body
        writer.close()
        await reader.read()  # the gateway closes its side: nothing was answered

    async def scenario() -> None:
        for _ in range(5):
            for path, authorization in targets:
                await cut_off(path, authorization)

    asyncio.run(scenario())
    admission = 'asyncrl_gateway_requests_total{code="499",route="admission"}'
    proxy = 'asyncrl_gateway_requests_total{code="499",route="proxy"}'

    async def counted() -> bool:
        return metric_value(gateway, admission) == 5 and metric_value(gateway, proxy) == 5

    asyncio.run(until(counted, "the cut-off bodies counted as 499"))
    no_traceback(gateway)
