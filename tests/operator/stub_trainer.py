"""A test stand-in for `asyncrl trainer` in the operator's tests (the pod runner maps the trainer image here).

It is not the trainer: it exercises the operator's side of the contract. It serves the fake upstream on a
free port and registers it with the gateway sidecar (as the trainer registers its model servers), creates
the rollouts of each step in the gateway from the run's rows (inline, or a JSON array from `--data-file`),
waits for them on the completion feed (they end when the operator's agent Jobs do), posts a window summary
per step, deletes the consumed rollouts, and exits 0 after `totalSteps` steps (2 when unset).

With `model.path: "stub-fail:<outcome>:<file>"` it instead appends a line to <file> (so a test counts its
executions), leaves a TrainerReport of that outcome with the gateway, and exits with the trainer's code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from pathlib import Path

import yaml
from aiohttp import web

from asyncrl.fake_upstream import build_app
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import RolloutCreate, TrainerOutcome, TrainerReport, WindowSummary
from asyncrl.trainer.failures import EXIT_CODES

FAIL_PREFIX = "stub-fail:"


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--gateway-url", required=True)
    parser.add_argument("--inference-port", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--metrics-port", type=int, default=0)  # the real trainer serves Prometheus there
    parser.add_argument("--data-file", default="")  # spec.data.configMapRef, mounted: a JSON array of rows
    args = parser.parse_args()
    run = yaml.safe_load(Path(args.config).read_text())
    spec = run["spec"]
    rows = spec["data"].get("inline") or json.loads(Path(args.data_file).read_text())
    n = int(spec.get("rollout", {}).get("samplesPerPrompt", 4))
    steps = int(spec.get("totalSteps") or 2)

    runner = web.AppRunner(build_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.inference_port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async with GatewayClient(args.gateway_url, os.environ["ASYNCRL_GATEWAY_KEY"]) as gateway:
        while True:
            try:
                await gateway.state()
                break
            except Exception:
                await asyncio.sleep(0.2)
        await gateway.set_upstreams([f"http://127.0.0.1:{port}"])
        model_path = str(spec["model"]["path"])
        if model_path.startswith(FAIL_PREFIX):
            outcome_name, _, count_file = model_path.removeprefix(FAIL_PREFIX).partition(":")
            with Path(count_file).open("a") as count:
                count.write("started\n")
            outcome = TrainerOutcome(outcome_name)
            await gateway.report_trainer(TrainerReport(outcome=outcome, message=f"stub {outcome.value}"))
            await runner.cleanup()
            return EXIT_CODES[outcome]
        _, cursor = await gateway.list_rollouts()
        for step in range(steps):
            rollouts = [
                RolloutCreate(rollout_id=f"s{step}-g{g}-r{r}", group_id=f"s{step}-g{g}", step=step, input=row)
                for g, row in enumerate(rows)
                for r in range(n)
            ]
            await gateway.create_rollouts(rollouts)
            pending = {rollout.rollout_id for rollout in rollouts}
            finished: dict[str, str] = {}
            while pending:
                page = await gateway.completions(after=cursor, wait_seconds=30)
                cursor = page.cursor
                for entry in page.entries:
                    if entry.rollout_id in pending:
                        pending.discard(entry.rollout_id)
                        finished[entry.rollout_id] = entry.state.value
                        print(f"rollout {entry.rollout_id} {entry.state.value}: {entry.message}", flush=True)
            succeeded = sum(state == "succeeded" for state in finished.values())
            print(f"step {step}: {succeeded}/{len(finished)} rollouts succeeded", flush=True)
            await gateway.put_summary(
                WindowSummary(
                    step=step,
                    prev_carry_over_rollouts=0,
                    completed_rollouts=len(finished),
                    new_carry_over_rollouts=n,
                    carry_over_age_max_steps=1,
                    proxy_inflight_at_pause=0,
                    proxy_drain_seconds=0.01,
                    carry_over_age_histogram={"1": 1},
                    active_groups=1,
                    reward_mean=succeeded / len(finished),  # a stand-in's reward: the share that succeeded
                    total_steps=steps,
                )
            )
            with contextlib.suppress(GatewayError):
                await gateway.delete_rollouts(finished)
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
