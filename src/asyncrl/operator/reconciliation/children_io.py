"""Creating a run's children, create-or-get (safe to repeat, never a duplicate), from the pure builders of
`workloads/children.py`, `workloads/ray_cluster.py` and `workloads/pool.py`, and the one policy for a child
the API server refuses (`refusal`). Only the reconcile (`reconciler.py`) calls these: at the run's start and
whenever it finds a child missing; the same refusal is handled the same way both times.
"""

from __future__ import annotations

import logging

import pydantic
from kubernetes.client.exceptions import ApiException

from asyncrl.agent_templates.render import sample_variables
from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.api.types import AgentsMode
from asyncrl.gateway_api.tokens import pool_token
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.reconciliation import ray_child
from asyncrl.operator.reconciliation.reconcile import Child, Refusal, child_text
from asyncrl.operator.reconciliation.status import TrainerCreation
from asyncrl.operator.retry import one_line_reason
from asyncrl.workloads import children, names
from asyncrl.workloads.children import TEMPLATE_FILE, owner_reference
from asyncrl.workloads.names import ATTEMPT_ID
from asyncrl.workloads.pool import agent_pool_deployment, agent_pool_secret, pool_replicas, template_source

logger = logging.getLogger(__name__)

# The API server's answers that refuse the object itself (malformed, invalid, too large): the same object is
# refused again at every try, so the run fails saying why. Any other refusal (403: a quota, a permission the
# operator lacks; 404, 429, 5xx, no answer) is one a cluster admin can lift without a new run: it is tried
# again at every requeue. (409, the child exists, is no refusal: create-or-get takes the existing one.)
REFUSED_FOR_GOOD = frozenset({400, 413, 422})


class TrainerJobRejected(Exception):
    """The API server refused the trainer Job for good (an invalid pod template)."""


class ChildRefused(Exception):
    """The operator itself refuses to create a child as the spec stands (a ConfigMap too large to store)."""


def desired_children(spec: AsyncTrainingRunSpec, *, with_pool: bool) -> tuple[Child, ...]:
    """The children the run owns: a key Secret only when the user named none; an agents.mode Pool run's pool
    once its dispatcher serves the run (`with_pool`: the template was checked, the gateway key is known)."""
    owned: list[Child] = [Child.KEY_SECRET, Child.CONFIG_MAP, Child.SERVICE, Child.TRAINER]
    if spec.gateway.key_secret_ref is not None:
        owned.remove(Child.KEY_SECRET)
    if with_pool and spec.agents.mode is AgentsMode.POOL:
        owned += [Child.POOL_SECRET, Child.AGENT_POOL]
    return tuple(owned)


def desired_child(
    run: JSON, spec: AsyncTrainingRunSpec, child: Child, *, template: str, key: str | None
) -> JSON:
    """The manifest of one of the run's children but the trainer and the pool's Deployment (`key`: the gateway
    key it already has)."""
    match child:
        case Child.KEY_SECRET:
            return children.gateway_key_secret(run, key)
        case Child.CONFIG_MAP:
            return children.config_map(run, template if spec.agents.template.inline is not None else None)
        case Child.SERVICE:
            return children.gateway_service(run, spec)
        case Child.POOL_SECRET:
            assert key is not None, "the pool's Secret is derived from the gateway key"
            return agent_pool_secret(run, owner_reference(run), pool_token(key))
        case Child.TRAINER | Child.AGENT_POOL:
            raise ValueError(f"the {child.value} is created by its own function")


async def agent_pool(
    run: JSON,
    spec: AsyncTrainingRunSpec,
    *,
    renderer: TemplateRenderer,
    template: str,
    agent_gateway_url: str,
    stopped: bool,
) -> JSON:
    """The agent pool's Deployment (its pod is the template's, rendered for a sample row)."""
    namespace, name = run["metadata"]["namespace"], run["metadata"]["name"]
    variables = sample_variables(
        None, run_name=name, namespace=namespace, job_name=names.agent_pool_name(name), attempt_id=ATTEMPT_ID
    )
    sample_job = await renderer.render(template, variables, sample=True)
    return agent_pool_deployment(
        run,
        spec,
        owner=owner_reference(run),
        sample_job=sample_job,
        agent_gateway_url=agent_gateway_url,
        template=template_source(name, spec, run_file_key=TEMPLATE_FILE),
        replicas=pool_replicas(spec, stopped=stopped),
    )


async def create_child(kube: Kube, body: JSON) -> bool:
    """Create one child unless it exists; True when created."""
    _, created, _warnings = await kube.create_or_get(body)
    if created:
        logger.info("run %s: created %s %s", _run_name(body), body["kind"], body["metadata"]["name"])
    return created


def _run_name(body: JSON) -> str:
    return str(body["metadata"]["ownerReferences"][0]["name"])


async def create_trainer(kube: Kube, run: JSON, spec: AsyncTrainingRunSpec) -> TrainerCreation | None:
    """Create the trainer Job (or a multi-node run's RayCluster) unless it exists: what its creation reported,
    or None when it existed."""
    if spec.trainer.nodes > 1:  # the trainer on a KubeRay RayCluster instead of the Job (ray_child.py)
        ray = await ray_child.create_ray_cluster(kube, run, spec)
        return TrainerCreation(refused=ray.refused, warnings=ray.warnings) if ray.created else None
    trainer_job, merged = children.trainer_job_with_template(run, spec)
    try:
        _, created, warnings = await kube.create_or_get(trainer_job)
    except (ApiException, pydantic.ValidationError) as error:
        if _refused_for_good(error):
            raise TrainerJobRejected(
                f"the API server refused the trainer Job: {one_line_reason(error)}; fix spec.trainer "
                "(podTemplate, resources, image) in a new run"
            ) from error
        raise
    if not created:
        return None
    logger.info("run %s: created Job %s", run["metadata"]["name"], trainer_job["metadata"]["name"])
    return TrainerCreation(refused=merged.refused_message(), warnings=warnings)


def _refused_for_good(error: BaseException) -> bool:
    if isinstance(error, pydantic.ValidationError):  # the client refused the body before sending it
        return True
    return isinstance(error, ApiException) and int(error.status or 0) in REFUSED_FOR_GOOD


def refusal(child: Child, error: BaseException, *, started: bool, multi_node: bool) -> Refusal:
    """The one policy for a child that was not created, at the run's start (`started` False) or mid-run
    (`multi_node`: the trainer is a RayCluster)."""
    named = child_text(child, multi_node=multi_node)
    match error:
        case TrainerJobRejected() | ray_child.RayClusterRejected():
            return Refusal(type(error).__name__, str(error), permanent=True)
        case ChildRefused():
            return Refusal("InvalidSpec", str(error), permanent=True)
        case ray_child.ClaimMissing():  # the user may create it after the run: it is waited for
            return Refusal("WaitingForClaim", str(error), permanent=False)
        case _ if _refused_for_good(error):
            message = f"the API server refused {named}: {one_line_reason(error)}"
            return Refusal("ChildRejected", message, permanent=True)
    verb = "recreate" if started else "create"
    message = f"could not {verb} {named}: {one_line_reason(error)}; retrying"
    return Refusal(f"Child{verb.capitalize()}Failed", message, permanent=False)
