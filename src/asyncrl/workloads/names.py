"""Names and labels of what the operator creates: deterministic, so a restart finds rather than duplicates."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from asyncrl.api.types.meta import (
    GROUP as GROUP,  # the API group: the labels and annotations below live under it
)

MANAGED_BY = "asyncrl-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = f"{GROUP}/run"
LABEL_ROLLOUT = f"{GROUP}/rollout"  # a hash: rollout ids may hold characters labels cannot
ANNOTATION_ROLLOUT_ID = f"{GROUP}/rollout-id"
ANNOTATION_GROUP_ID = f"{GROUP}/group-id"
ANNOTATION_ATTEMPT_ID = f"{GROUP}/attempt-id"
# Marks a trainer Job or RayCluster the run suspended, so that it resumes only those: one suspended by someone
# else (Kueue suspends a labelled workload until it admits it) is left for them to resume.
ANNOTATION_SUSPENDED_BY_RUN = f"{GROUP}/suspended-by-run"
# Kueue's queue label: a run whose trainer pod template carries it has its trainer Job (or RayCluster) created
# suspended and labelled, and Kueue resumes it when the queue's quota admits it (docs/queueing.md).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def queue_of(labels: Mapping[str, str] | None) -> str | None:
    """The Kueue queue named in these labels, if any."""
    return (labels or {}).get(KUEUE_QUEUE_LABEL) or None


ATTEMPT_ID = "a1"  # one attempt per rollout: an agent Job has backoffLimit 0

COMPONENT_AGENT = "agent"
COMPONENT_TRAINER = "trainer"
COMPONENT_GATEWAY = "gateway"

# Server-side selectors: the operator's watches per namespace (every object it creates carries the label),
# and a run's agent Jobs.
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
AGENT_JOB_SELECTOR = f"{MANAGED_SELECTOR},{LABEL_COMPONENT}={COMPONENT_AGENT}"


def _hash(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _bounded(prefix: str, suffix: str, limit: int = 63) -> str:
    """`prefix-suffix` within `limit` characters; a long prefix is cut and made unique by a hash."""
    name = f"{prefix}-{suffix}"
    if len(name) <= limit:
        return name
    keep = limit - len(suffix) - 10
    return f"{prefix[:keep].rstrip('-')}-{_hash(prefix, 8)}-{suffix}"


def rollout_label(rollout_id: str) -> str:
    return _hash(rollout_id, 16)


def agent_job_name(run: str, rollout_id: str) -> str:
    """One Job per rollout, always the same name for the same rollout (AlreadyExists means: done before)."""
    return _bounded(run, f"r-{rollout_label(rollout_id)}", limit=63)


def trainer_job_name(run: str) -> str:
    return _bounded(run, "trainer", limit=52)  # pods of a Job get a suffix; keep room


def ray_cluster_name(run: str) -> str:
    """A multi-node run's RayCluster; KubeRay derives `<name>-head-svc` and its pods' names from it."""
    return _bounded(run, "ray", limit=40)


def gateway_service_name(run: str) -> str:
    return _bounded(run, "gateway")


def gateway_key_secret_name(run: str) -> str:
    return _bounded(run, "gateway-key", limit=253)


def config_map_name(run: str) -> str:
    return _bounded(run, "config", limit=253)


def common_labels(run: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "asyncrl",
        LABEL_INSTANCE: run,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RUN: run,
    }


COMPONENT_AGENT_POOL = "agent-pool"


def agent_pool_name(run: str) -> str:
    """The Deployment of a run's agent pool (`agents.mode: Pool`); its pods get a suffix of ~17 characters."""
    return _bounded(run, "agents", limit=46)


def agent_pool_secret_name(run: str) -> str:
    return _bounded(run, "agent-pool-token", limit=253)
