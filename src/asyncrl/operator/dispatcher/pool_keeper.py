"""Keeps a run's agent pool (`agents.mode: Pool`): its token Secret and Deployment exist and are sized.

Replaces the claim loop for a Pool run: the pods claim from the gateway themselves. The keeper creates the
children once (create-or-get), follows `agents.pool.replicas` and `suspend` (zero pods while suspended or
after the run failed), and every half-minute tells the gateway which pool pods exist, so the rollouts of a pod
that is gone (deleted, evicted, its node lost) are failed instead of waiting for their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asyncrl.agent_templates.render import sample_variables
from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.tokens import pool_token
from asyncrl.operator.kube import JSON, Kube
from asyncrl.workloads import names
from asyncrl.workloads.children import TEMPLATE_FILE, owner_reference
from asyncrl.workloads.names import ATTEMPT_ID
from asyncrl.workloads.pool import agent_pool_deployment, agent_pool_secret, pool_replicas, template_source

logger = logging.getLogger(__name__)

RELEASE_INTERVAL_SECONDS = 30.0


@dataclass
class PoolInputs:
    """What the keeper reads from its run controller, each time it looks."""

    run: Callable[[], JSON]
    spec: Callable[[], AsyncTrainingRunSpec]
    stopped: Callable[[], bool]  # the run failed: no pods
    agent_gateway_url: str
    gateway_key: str
    template_source: str


async def keep_agent_pool(
    inputs: PoolInputs,
    *,
    kube: Kube,
    renderer: TemplateRenderer,
    gateway: GatewayClient,
    gateway_call: Callable[[Callable[[], Awaitable[list[str]]]], Awaitable[list[str]]],
    changed: asyncio.Event,
) -> None:
    run, spec = inputs.run(), inputs.spec()
    namespace, name = run["metadata"]["namespace"], run["metadata"]["name"]
    variables = sample_variables(
        None, run_name=name, namespace=namespace, job_name=names.agent_pool_name(name), attempt_id=ATTEMPT_ID
    )
    sample_job = await renderer.render(inputs.template_source, variables, sample=True)
    owner = owner_reference(run)
    replicas = pool_replicas(spec, stopped=inputs.stopped())
    deployment = agent_pool_deployment(
        run,
        spec,
        owner=owner,
        sample_job=sample_job,
        agent_gateway_url=inputs.agent_gateway_url,
        template=template_source(name, spec, run_file_key=TEMPLATE_FILE),
        replicas=replicas,
    )
    await kube.create_or_get(agent_pool_secret(run, owner, pool_token(inputs.gateway_key)))
    stored, created, _ = await kube.create_or_get(deployment)
    if created:
        logger.info("run %s: created the agent pool (%d pods)", name, replicas)
    applied = int((stored.get("spec") or {}).get("replicas") or 0)
    selector = ",".join(
        f"{key}={value}" for key, value in deployment["spec"]["selector"]["matchLabels"].items()
    )
    while True:
        wanted = pool_replicas(inputs.spec(), stopped=inputs.stopped())
        if wanted != applied:
            await kube.scale_deployment(namespace, deployment["metadata"]["name"], wanted)
            logger.info("run %s: agent pool scaled %d -> %d pods", name, applied, wanted)
            applied = wanted
        live = await kube.list_pod_names(namespace, selector)
        failed = await gateway_call(functools.partial(gateway.release_pool_workers, live))
        if failed:
            logger.warning("run %s: %d rollouts of agent pool pods that are gone failed", name, len(failed))
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=RELEASE_INTERVAL_SECONDS)
