"""How long one listing of many rollouts holds the gateway's event loop (issue 24 item 6).

    python benchmarks/rollout_listing.py                    # 100,000 rollouts (about a minute to create)
    python benchmarks/rollout_listing.py --rollouts 20000

Real parts: the `asyncrl gateway` process and the trainer's `GatewayClient`. Printed first, without HTTP:
the loop's work for one answer of all rows as the route built it before paging, and for the longest page now
(`--skip-in-process` leaves it out). Then the script creates `--rollouts` queued rollouts in a gateway (in
requests of `--create-batch`) and lists them all with `GatewayClient.list_rollouts()` (what the trainer's
resync and recovery call) while a second connection sends `GET /healthz` one after another from its own
thread: the listing's wall time, the rows it returned, and the `/healthz` latencies during the listing (the
slowest: the longest the loop was held, as another caller sees it; on a loaded machine, scheduling too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

import httpx
from _common import KEY, management_headers, ms, percentile, run_client, running_servers, table, verdict
from fastapi.encoders import jsonable_encoder

from asyncrl.gateway.store import RolloutStore
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.models import DEFAULT_LISTING_PAGE, RolloutCreate, RolloutPage

TARGET_LOOP_HOLD_SECONDS = 0.2


async def create(url: str, *, total: int, batch: int) -> None:
    async with httpx.AsyncClient(base_url=url, headers=management_headers(), timeout=120) as http:
        for start in range(0, total, batch):
            body = [
                {"rollout_id": f"r{i}", "group_id": f"g{i // 8}", "step": 0, "input": {"prompt": f"q {i}"}}
                for i in range(start, min(start + batch, total))
            ]
            response = await http.post("/api/rollouts", json=body)
            response.raise_for_status()


async def measure(url: str, *, total: int, batch: int) -> tuple[float, int, list[float]]:
    await create(url, total=total, batch=batch)
    done = threading.Event()
    health_seconds: list[float] = []

    def probe() -> None:  # its own thread, so the client's parsing of the listing does not delay it
        with httpx.Client(base_url=url, timeout=300) as http:
            while not done.is_set():
                started = time.perf_counter()
                http.get("/healthz").raise_for_status()
                health_seconds.append(time.perf_counter() - started)

    async with GatewayClient(url, KEY, timeout_seconds=300) as gateway:
        prober = asyncio.create_task(asyncio.to_thread(probe))
        await asyncio.sleep(0.5)  # the probe's connection is open and warm
        health_seconds.clear()
        started = time.perf_counter()
        rollouts, _cursor = await gateway.list_rollouts()
        listing_seconds = time.perf_counter() - started
        done.set()
        await prober
    return listing_seconds, len(rollouts), health_seconds


def loop_work(total: int) -> tuple[float, float, int]:
    """In this process, without HTTP: the work one listing puts on the gateway's loop. One answer as the route
    built it before paging (views, FastAPI's `jsonable_encoder`, `json.dumps`), and the longest page as it
    builds them now (`list_page`, views, `model_dump_json`). Returns (one answer s, longest page s, pages)."""
    store = RolloutStore()
    store.create(
        RolloutCreate(rollout_id=f"r{i}", group_id=f"g{i // 8}", step=0, input={"prompt": f"q {i}"})
        for i in range(total)
    )
    started = time.perf_counter()
    json.dumps(jsonable_encoder({"rollouts": [r.view() for r in store.select()], "cursor": 0}))
    one_answer = time.perf_counter() - started
    longest, pages = 0.0, 0
    after: int | None = 0
    while after is not None:
        started = time.perf_counter()
        page = store.list_page(state=None, group_id=None, after=after, limit=DEFAULT_LISTING_PAGE)
        next_page = None if page.last_position is None else str(page.last_position)
        RolloutPage(rollouts=[r.view() for r in page.items], cursor=0, next_page=next_page).model_dump_json()
        longest = max(longest, time.perf_counter() - started)
        after, pages = page.last_position, pages + 1
    return one_answer, longest, pages


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--create-batch", type=int, default=1000)
    parser.add_argument("--gateway-pythonpath", default=None, help="run the gateway from DIR/asyncrl")
    parser.add_argument("--skip-in-process", action="store_true", help="only the run against the gateway")
    args = parser.parse_args()
    if not args.skip_in_process:
        one_answer, longest_page, pages = loop_work(args.rollouts)
        print(
            table(
                ["rollouts", "one answer s", f"pages of {DEFAULT_LISTING_PAGE}", "longest page ms"],
                [[args.rollouts, f"{one_answer:.2f}", pages, ms(longest_page)]],
            )
        )
    with running_servers(pythonpath=args.gateway_pythonpath) as servers:
        listing, rows, health = await measure(
            servers.gateway_url, total=args.rollouts, batch=args.create_batch
        )
    slowest_health = max(health, default=float("nan"))
    print(
        table(
            ["rollouts", "rows listed", "listing s", "/healthz answers", "p50 ms", "p99 ms", "slowest ms"],
            [
                [
                    args.rollouts,
                    rows,
                    f"{listing:.2f}",
                    len(health),
                    ms(percentile(health, 50)),
                    ms(percentile(health, 99)),
                    ms(slowest_health),
                ]
            ],
        )
    )
    print(
        verdict(
            f"the listing holds the loop < {TARGET_LOOP_HOLD_SECONDS * 1000:.0f} ms",
            slowest_health < TARGET_LOOP_HOLD_SECONDS,
            f"{ms(slowest_health)} ms",
        )
    )


if __name__ == "__main__":
    run_client(main)
