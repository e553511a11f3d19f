"""Sizes a run's agent pool (`agents.mode: Pool`) and tells the gateway which of its pods exist.

Replaces the claim loop for a Pool run: the pods claim from the gateway themselves. The pool's token Secret
and Deployment are children of the run, created (and recreated) by the reconcile like the others, at the size
the keeper would give them. The keeper follows `agents.pool.replicas` and `suspend` (zero pods while suspended
or after the run failed): the size is the dispatcher's concern, as it is the agent Jobs' number in Jobs mode,
and it changes with a spec edit or the dispatcher's own stop, both of which the keeper is woken for. Every
half-minute it tells the gateway which pool pods exist, so the rollouts of a pod that is gone (deleted,
evicted, its node lost) are failed instead of waiting for their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.operator.kube import JSON, Kube
from asyncrl.workloads import names
from asyncrl.workloads.pool import pool_replicas

logger = logging.getLogger(__name__)

RELEASE_INTERVAL_SECONDS = 30.0
UNSIZED_RETRY_SECONDS = 5.0  # the Deployment not created yet: size it this much later


@dataclass
class PoolInputs:
    """What the keeper reads from its run controller, each time it looks."""

    run: Callable[[], JSON]
    spec: Callable[[], AsyncTrainingRunSpec]
    stopped: Callable[[], bool]  # the run failed: no pods


async def keep_agent_pool(
    inputs: PoolInputs,
    *,
    kube: Kube,
    gateway: GatewayClient,
    gateway_call: Callable[[Callable[[], Awaitable[list[str]]]], Awaitable[list[str]]],
    changed: asyncio.Event,
) -> None:
    run = inputs.run()
    namespace, name = run["metadata"]["namespace"], run["metadata"]["name"]
    deployment = names.agent_pool_name(name)
    labels = names.common_labels(name, names.COMPONENT_AGENT_POOL)  # the Deployment's selector
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    applied: int | None = None  # the size last set; None: not yet (the reconcile creates it at the size)
    while True:
        wanted = pool_replicas(inputs.spec(), stopped=inputs.stopped())
        if wanted != applied:
            try:
                await kube.scale_deployment(namespace, deployment, wanted)
            except ApiException as error:
                if error.status != 404:
                    raise
                logger.info("run %s: the agent pool is not created yet; sizing it later", name)
            else:
                if applied is not None:
                    logger.info("run %s: agent pool scaled %d -> %d pods", name, applied, wanted)
                applied = wanted
        live = await kube.list_pod_names(namespace, selector)
        failed = await gateway_call(functools.partial(gateway.release_pool_workers, live))
        if failed:
            logger.warning("run %s: %d rollouts of agent pool pods that are gone failed", name, len(failed))
        changed.clear()
        timeout = RELEASE_INTERVAL_SECONDS if applied is not None else UNSIZED_RETRY_SECONDS
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=timeout)
