"""Creating a run's children, create-or-get (safe to repeat, never a duplicate), from the pure builders of
`workloads/children.py` and `workloads/ray_cluster.py`: at the run's start (handlers.py) and whenever the
reconcile finds one missing (reconciler.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pydantic
from kubernetes.client.exceptions import ApiException

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.reconciliation import ray_child
from asyncrl.operator.reconciliation.reconcile import Child
from asyncrl.operator.retry import kube_error_is_transient, one_line_reason
from asyncrl.workloads import children

logger = logging.getLogger(__name__)


class TrainerJobRejected(Exception):
    """The API server refused the trainer Job for good (a 4xx: an invalid pod template, a denied request)."""


@dataclass(frozen=True)
class TrainerJobCreation:
    """What the trainer Job's creation reported: the template fields refused, the API server's warnings."""

    created: bool
    refused: str | None
    warnings: list[str]


def desired_child(
    run: JSON, spec: AsyncTrainingRunSpec, child: Child, *, template: str, key: str | None
) -> JSON:
    """The manifest of one of the run's children but the trainer (`key`: the gateway key it already has)."""
    match child:
        case Child.KEY_SECRET:
            return children.gateway_key_secret(run, key)
        case Child.CONFIG_MAP:
            return children.config_map(run, template if spec.agents.template.inline is not None else None)
        case Child.SERVICE:
            return children.gateway_service(run, spec)
        case Child.TRAINER:
            raise ValueError("the trainer is created by create_trainer")


def desired_children(spec: AsyncTrainingRunSpec) -> tuple[Child, ...]:
    """The children the run owns (a key Secret only when the user named none)."""
    owned = tuple(Child)
    return (
        owned if spec.gateway.key_secret_ref is None else tuple(c for c in owned if c is not Child.KEY_SECRET)
    )


async def create_child(kube: Kube, body: JSON) -> bool:
    """Create one child unless it exists; True when created."""
    _, created, _warnings = await kube.create_or_get(body)
    if created:
        logger.info("run %s: created %s %s", _run_name(body), body["kind"], body["metadata"]["name"])
    return created


def _run_name(body: JSON) -> str:
    return str(body["metadata"]["ownerReferences"][0]["name"])


async def create_trainer(kube: Kube, run: JSON, spec: AsyncTrainingRunSpec) -> TrainerJobCreation:
    """Create the trainer Job (or a multi-node run's RayCluster) unless it exists."""
    if spec.trainer.nodes > 1:  # the trainer on a KubeRay RayCluster instead of the Job (ray_child.py)
        ray = await ray_child.create_ray_cluster(kube, run, spec)
        return TrainerJobCreation(created=ray.created, refused=ray.refused, warnings=ray.warnings)
    trainer_job, merged = children.trainer_job_with_template(run, spec)
    try:
        _, created, warnings = await kube.create_or_get(trainer_job)
    except Exception as error:
        # Retrying a 4xx would repeat the same refusal forever; the spec is what must change.
        if isinstance(error, ApiException | pydantic.ValidationError) and not kube_error_is_transient(error):
            raise TrainerJobRejected(
                f"the API server refused the trainer Job: {one_line_reason(error)}; fix spec.trainer "
                "(podTemplate, resources, image) in a new run"
            ) from error
        raise
    if created:
        logger.info("run %s: created Job %s", run["metadata"]["name"], trainer_job["metadata"]["name"])
    return TrainerJobCreation(created=created, refused=merged.refused_message(), warnings=warnings)


async def create_children(
    kube: Kube, run: JSON, spec: AsyncTrainingRunSpec, template: str
) -> TrainerJobCreation:
    """Create every child that is missing, the trainer last."""
    for child in desired_children(spec):
        if child is not Child.TRAINER:
            await create_child(kube, desired_child(run, spec, child, template=template, key=None))
    return await create_trainer(kube, run, spec)
