"""An agent over its byte budget that waits exactly what Retry-After says is admitted on its next try
(issue 37 item 1), over real HTTP against a real gateway process.

Before, a body's declared length was taken from the bucket before the body was read, and when its JSON values
could then not be paid for, the 429 kept that first charge and its Retry-After covered only the second
shortfall: a polite agent posting a 600 KB body needed 759 attempts for 5 calls, with Retry-After shrinking to
0.02 s. A refused request must cost nothing, and Retry-After must be when the same request will be admitted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.gateway.budgets import VALUE_COST_BYTES, json_values
from tests.gateway.conftest import RunningGateway, launch_gateway, start_rollouts

RATE = 1024 * 1024  # bytes per second: small, so that each call waits about a second for its budget
BURST = 2 * 1024 * 1024
CALLS = 6
DEADLINE_SECONDS = 120.0


def _body() -> bytes:
    """A chat call of about 230 KB whose 15,000 commas make it cost about 1.2 MB of the budget."""
    content = "word " * 40_000 + ",".join(["a"] * 15_000)
    return httpx.Request(
        "POST", "http://x", json={"model": "m", "messages": [{"role": "user", "content": content}]}
    ).content


@pytest.fixture
def budgeted(upstream_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    running = launch_gateway(
        [upstream_url],
        tmp_path,
        f"--agent-bytes-per-second={RATE}",
        f"--agent-burst-bytes={BURST}",
        f"--max-body-bytes={BURST}",
    )
    yield running
    running.process.stop()


def test_an_agent_that_waits_the_retry_after_is_admitted_on_its_next_try(budgeted: RunningGateway) -> None:
    body = _body()
    cost = len(body) + VALUE_COST_BYTES * json_values(body)
    assert RATE < cost < BURST  # each call waits for its budget, and the bucket can always pay for one
    start_rollouts(budgeted, "r1")
    attempts: list[int] = []
    waits: list[float] = []
    deadline = time.monotonic() + DEADLINE_SECONDS
    with budgeted.agent("r1") as agent:
        for _ in range(CALLS):
            tries = 0
            while True:
                assert time.monotonic() < deadline, f"attempts so far: {attempts}, this call {tries}"
                tries += 1
                response = agent.post(
                    budgeted.proxy_path("r1"), content=body, headers={"content-type": "application/json"}
                )
                if response.status_code == 200:
                    break
                assert response.status_code == 429, response.text
                assert response.json()["setting"] == "--agent-bytes-per-second"
                wait = float(response.headers["retry-after-ms"]) / 1000
                waits.append(wait)
                time.sleep(wait)  # exactly what it was told
            attempts.append(tries)
    # The first call is paid from the full bucket; each later one is refused at most twice (once when its
    # declared length cannot be paid, once for its JSON values), then admitted. Before: 759 for 5 calls.
    assert attempts[0] == 1
    assert max(attempts) <= 3, attempts
    # Never told to wait longer than the whole request takes to pay for from an empty bucket.
    assert max(waits) <= cost / RATE + 0.01, waits


def test_a_body_whose_bytes_and_values_together_exceed_the_burst_is_413_not_an_endless_429(
    budgeted: RunningGateway,
) -> None:
    """Its declared length alone fits the bucket, and its values alone too, but never both: it can never be
    admitted, so it must not be told to retry (before, it got 429 after 429)."""
    content = "w" * (BURST // 2) + "," * (BURST // 2 // VALUE_COST_BYTES + 1000)
    start_rollouts(budgeted, "r2")
    with budgeted.agent("r2") as agent:
        response = agent.post(
            budgeted.proxy_path("r2"), json={"model": "m", "messages": [{"content": content}]}
        )
    assert response.status_code == 413, response.text
    assert response.json()["setting"] == "--agent-burst-bytes"
