"""A stand-in for `asyncrl trainer` in the head pod of a multi-node run: the Ray driver, without GPUs.

It does what the verl backend does before training: reads the run from the ConfigMap the operator mounts
(`--config`), composes verl's config from it (verl's own Hydra files and validate_config), and joins the
run's Ray cluster the way the backend does (`ray_connection`, RAY_ADDRESS). It waits until Ray shows every
node of the run, writes what it saw to $ASYNCRL_PROBE_REPORT (JSON) and exits 0, which the operator reads
as the trainer finishing. The test asserts on the report.

With ASYNCRL_PROBE_FAIL set it instead reports a permanent failure (a configuration error, with that text) to
the gateway as `asyncrl trainer` does, then stays up: a driver that has said it cannot succeed must not keep
the cluster's GPUs until it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--gateway-url", default="")
    known, _ = parser.parse_known_args(argv)
    failure = os.environ.get("ASYNCRL_PROBE_FAIL")
    if failure:
        asyncio.run(_report_failure(known.gateway_url, failure))
        while True:
            time.sleep(60)
    import ray

    from asyncrl.api import load_run
    from asyncrl.trainer.backends.verl.cluster import ray_connection
    from asyncrl.trainer.backends.verl.config import compose_verl_config, verl_settings

    run = load_run(yaml.safe_load(Path(known.config).read_text()))
    config = compose_verl_config(verl_settings(run, checkpoint_dir=Path("/ckpt")))
    nnodes, gpus = int(config.trainer.nnodes), int(config.trainer.n_gpus_per_node)
    connection = ray_connection(nnodes=nnodes, env=os.environ)
    ray.init(**connection.init_kwargs)
    deadline = time.monotonic() + 240
    nodes: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        nodes = [node for node in ray.nodes() if node["Alive"]]
        if len(nodes) >= nnodes:
            break
        time.sleep(1)
    report = {
        "address": connection.address,
        "verl": {"nnodes": nnodes, "n_gpus_per_node": gpus},
        "nodes": [{"id": node["NodeID"], "resources": node["Resources"]} for node in nodes],
        "cluster_resources": ray.cluster_resources(),
    }
    ray.shutdown()
    Path(os.environ["ASYNCRL_PROBE_REPORT"]).write_text(json.dumps(report))
    print(json.dumps(report), flush=True)
    return 0 if len(nodes) >= nnodes else 1


async def _report_failure(gateway_url: str, message: str) -> None:
    from asyncrl.gateway_api.client import GatewayClient
    from asyncrl.gateway_api.models import TrainerOutcome, TrainerReport
    from asyncrl.gateway_api.tokens import KEY_ENV_VAR

    async with GatewayClient(gateway_url, os.environ[KEY_ENV_VAR], timeout_seconds=10.0) as gateway:
        deadline = time.monotonic() + 120
        while True:  # the gateway sidecar may still be starting
            try:
                report = TrainerReport(outcome=TrainerOutcome.CONFIG_ERROR, message=message)
                await gateway.report_trainer(report)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
