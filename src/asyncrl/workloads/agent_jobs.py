"""Shape a rendered agent Job into what the operator creates: our name, labels, owner, limits and AGL_* env.

Whatever the template says, these are enforced: one attempt (`backoffLimit: 0`, `restartPolicy: Never`), the
rollout timeout as `activeDeadlineSeconds`, cleanup after `ttlSecondsAfterFinished`, a deterministic name, and
the rollout's own gateway URLs and token in every container. Resource quantities leave as strings (`cpu: 1`
becomes "1"): the Kubernetes client refuses numbers there. The Job was checked structurally when rendered
(`job_structure.py`), so its fields have the shapes used here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.agent import AgentEnvironment
from asyncrl.agent_templates.render import TemplateError, rollout_variables
from asyncrl.gateway_api.models import RolloutView
from asyncrl.gateway_api.tokens import agent_token as token_for
from asyncrl.launch.podspec import Image, container_argv
from asyncrl.workloads import names
from asyncrl.workloads.names import ATTEMPT_ID


@dataclass(frozen=True)
class AgentLaunch:
    """One rollout's agent, before its Job is rendered: the template's variables and the agent's AGL_* env."""

    variables: dict[str, Any]
    env: dict[str, str]


def agent_launch(
    rollout: RolloutView,
    *,
    run_name: str,
    namespace: str,
    job_name: str,
    gateway_url: str,
    gateway_key: str | None = None,
    agent_token: str | None = None,
) -> AgentLaunch:
    """The one rollout → agent step, shared by the operator (a Job), local mode (a process), a pool pod
    (`agent_pool.py`) and `asyncrl manifest agent-job` (a preview): the rollout's template variables and its
    gateway URLs and token. The token is derived from `gateway_key`, or given (`agent_token`: a pool pod is
    handed it by the gateway and never holds the key).
    """
    variables = rollout_variables(
        rollout, attempt_id=ATTEMPT_ID, job_name=job_name, run_name=run_name, namespace=namespace
    )
    if agent_token is None:
        if gateway_key is None:
            raise ValueError("agent_launch needs the gateway key or the rollout's agent token")
        agent_token = token_for(gateway_key, rollout.rollout_id)
    env = AgentEnvironment.with_token(
        gateway_url=gateway_url,
        token=agent_token,
        rollout_id=rollout.rollout_id,
        attempt_id=ATTEMPT_ID,
        mode=rollout.mode,
    )
    return AgentLaunch(variables=variables, env=env.as_env())


def agent_process(
    job: Mapping[str, Any],
    agent_env: Mapping[str, str],
    *,
    inherited: Mapping[str, str],
    why_a_command: str,
    value_from: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and env of a rendered agent Job's first container, run as a process without a container runtime
    (local mode, the pool pod). The env returned is what the Job adds to `inherited` (the runner's own env):
    the template's `value`s, then the AGL_* env; the argv is the container's command and args with
    Kubernetes' $(VAR) expansion against `inherited` with those added.

    `why_a_command` ends the error for a container without a command. `value_from` is the error for a
    `valueFrom` entry (formatted with its `name`), or None where the runner's own environment already holds
    those entries (the pool pod: the kubelet resolved them).
    """
    container = job["spec"]["template"]["spec"]["containers"][0]
    if not container.get("command"):
        raise TemplateError(f"container {container.get('name')!r} has no command; {why_a_command}")
    env: dict[str, str] = {}
    for variable in container.get("env") or []:
        if "valueFrom" not in variable:
            env[variable["name"]] = str(variable.get("value", ""))
        elif value_from is not None:
            raise TemplateError(value_from.format(name=variable["name"]))
    env.update(agent_env)
    argv = container_argv(Image(), container["command"], container.get("args"), {**inherited, **env})
    return argv, env


@dataclass(frozen=True)
class AgentJobSettings:
    run_name: str
    namespace: str
    owner_reference: Mapping[str, Any]
    timeout_seconds: int
    ttl_seconds_after_finished: int


def shape_agent_job(
    job: Mapping[str, Any],
    *,
    settings: AgentJobSettings,
    rollout_id: str,
    group_id: str,
    attempt_id: str,
    agent_env: Mapping[str, str],
) -> dict[str, Any]:
    shaped: dict[str, Any] = copy.deepcopy(dict(job))
    metadata = shaped.setdefault("metadata", {})
    metadata["name"] = names.agent_job_name(settings.run_name, rollout_id)
    metadata["namespace"] = settings.namespace
    metadata.pop("generateName", None)
    labels = {
        **(metadata.get("labels") or {}),
        **names.common_labels(settings.run_name, names.COMPONENT_AGENT),
    }
    labels[names.LABEL_ROLLOUT] = names.rollout_label(rollout_id)
    metadata["labels"] = labels
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        names.ANNOTATION_ROLLOUT_ID: rollout_id,
        names.ANNOTATION_GROUP_ID: group_id,
        names.ANNOTATION_ATTEMPT_ID: attempt_id,
    }
    metadata["ownerReferences"] = [dict(settings.owner_reference)]

    spec = shaped.setdefault("spec", {})
    spec["backoffLimit"] = 0
    spec["activeDeadlineSeconds"] = settings.timeout_seconds
    spec["ttlSecondsAfterFinished"] = settings.ttl_seconds_after_finished
    spec.pop("completions", None)
    spec.pop("parallelism", None)
    template = spec.setdefault("template", {})
    pod_metadata = template.setdefault("metadata", {})
    pod_metadata["labels"] = {**(pod_metadata.get("labels") or {}), **labels}
    pod_spec = template.setdefault("spec", {})
    pod_spec["restartPolicy"] = "Never"
    for container in [*(pod_spec.get("initContainers") or []), *pod_spec["containers"]]:
        env = [entry for entry in container.get("env") or [] if entry.get("name") not in agent_env]
        container["env"] = env + [{"name": name, "value": value} for name, value in agent_env.items()]
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            if resources.get(kind):
                resources[kind] = {name: quantity_text(value) for name, value in resources[kind].items()}
    return shaped


def quantity_text(value: Any) -> Any:
    """A Kubernetes quantity as the API's string form: 1 → "1", 0.5 → "0.5"; strings unchanged."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value
