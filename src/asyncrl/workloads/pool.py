"""The agent pool of `agents.mode: Pool`, built as plain manifests (pure; the operator's `pool_keeper.py`
applies them).

The pool is a Deployment of long-lived agent pods made from the same agent template as the Jobs: the template
is rendered for a placeholder row and its pod spec kept (image, resources, volumes, service account, security
context, sidecars), with the first container's command replaced by the pool runner (`asyncrl agent-pool`),
which renders the template again for each rollout and runs the container's own command with that rollout's
variables and AGL_* environment. The runner reads the template from the run's ConfigMap (or the user's) and
holds the agent pool token from a Secret, which only the pool routes of the gateway accept. Both objects are
owned by the run, so deleting the run deletes them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.workloads import names
from asyncrl.workloads.agent_jobs import quantity_text

JSON = dict[str, Any]
TEMPLATE_DIR = "/etc/asyncrl/agent-template"
TEMPLATE_FILE = "agent-job.yaml.j2"
TEMPLATE_VOLUME = "asyncrl-agent-template"
POOL_TOKEN_ENV = "ASYNCRL_POOL_TOKEN"  # the names the runner reads (asyncrl.agent_pool)
WORKER_ENV = "ASYNCRL_POOL_WORKER"


@dataclass(frozen=True)
class TemplateSource:
    """Where the pool pods read the agent template: a ConfigMap and its key."""

    config_map: str
    key: str


def template_source(run_name: str, spec: AsyncTrainingRunSpec, *, run_file_key: str) -> TemplateSource:
    """The run's own ConfigMap for an inline template (key `run_file_key`), else the user's ConfigMap."""
    reference = spec.agents.template.config_map_ref
    if reference is None:
        return TemplateSource(names.config_map_name(run_name), run_file_key)
    return TemplateSource(reference.name, reference.key)


def pool_replicas(spec: AsyncTrainingRunSpec, *, stopped: bool) -> int:
    """Pods wanted now: none while the run is suspended or stopped (failed), else `agents.pool.replicas`."""
    return 0 if spec.suspend or stopped else spec.agents.pool.replicas


def agent_pool_secret(run: Mapping[str, Any], owner: Mapping[str, Any], token: str) -> JSON:
    run_name = run["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(run, owner, names.agent_pool_secret_name(run_name)),
        "type": "Opaque",
        "stringData": {"token": token},
    }


def agent_pool_deployment(
    run: Mapping[str, Any],
    spec: AsyncTrainingRunSpec,
    *,
    owner: Mapping[str, Any],
    sample_job: Mapping[str, Any],
    agent_gateway_url: str,
    template: TemplateSource,
    replicas: int,
) -> JSON:
    """The pool's Deployment from the template's Job rendered for a placeholder row (`sample_job`)."""
    run_name, namespace = run["metadata"]["name"], run["metadata"]["namespace"]
    labels = names.common_labels(run_name, names.COMPONENT_AGENT_POOL)
    pod_template: JSON = copy.deepcopy(dict(sample_job["spec"]["template"]))
    pod_metadata = pod_template.setdefault("metadata", {})
    pod_metadata["labels"] = {**(pod_metadata.get("labels") or {}), **labels}
    pod_spec = pod_template.setdefault("spec", {})
    pod_spec["restartPolicy"] = "Always"  # a Deployment's pods; a killed runner restarts in place
    pod_spec.pop("activeDeadlineSeconds", None)  # the runner enforces each rollout's timeout
    pod_spec["volumes"] = [
        *(pod_spec.get("volumes") or []),
        {
            "name": TEMPLATE_VOLUME,
            "configMap": {
                "name": template.config_map,
                "items": [{"key": template.key, "path": TEMPLATE_FILE}],
            },
        },
    ]
    for container in [*(pod_spec.get("initContainers") or []), *pod_spec["containers"]]:
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            if resources.get(kind):
                resources[kind] = {name: quantity_text(value) for name, value in resources[kind].items()}
    agent = pod_spec["containers"][0]
    agent["command"] = ["asyncrl", "agent-pool"]
    agent["args"] = [
        f"--gateway-url={agent_gateway_url}",
        f"--template-file={TEMPLATE_DIR}/{TEMPLATE_FILE}",
        f"--run-name={run_name}",
        f"--namespace={namespace}",
        f"--rollout-timeout-seconds={spec.rollout_timeout_seconds}",
    ]
    reserved = {POOL_TOKEN_ENV, WORKER_ENV}
    agent["env"] = [
        *(entry for entry in agent.get("env") or [] if entry.get("name") not in reserved),
        {
            "name": POOL_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": names.agent_pool_secret_name(run_name), "key": "token"}},
        },
        {"name": WORKER_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    agent["volumeMounts"] = [
        *(agent.get("volumeMounts") or []),
        {"name": TEMPLATE_VOLUME, "mountPath": TEMPLATE_DIR, "readOnly": True},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(run, owner, names.agent_pool_name(run_name)),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": pod_template,
        },
    }


def _metadata(run: Mapping[str, Any], owner: Mapping[str, Any], name: str) -> JSON:
    run_name = run["metadata"]["name"]
    return {
        "name": name,
        "namespace": run["metadata"]["namespace"],
        "labels": names.common_labels(run_name, names.COMPONENT_AGENT_POOL),
        "ownerReferences": [dict(owner)],
    }
