"""What the operator's control-plane tests ask of the cluster: apply a run, read its status, list its Jobs
and Events. One copy, so every test reads the cluster the same way."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from asyncrl.api.types.meta import GROUP, PLURAL, VERSION
from asyncrl.operator import names


def kubectl_run(kubectl: list[str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kubectl, *args], input=stdin, capture_output=True, text=True, check=False)


def apply_run(
    kubectl: list[str], namespace: str, manifest: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` of a manifest, sent as JSON as a user's YAML would arrive."""
    return kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


def run_object(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    result: dict[str, Any] = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return result


def run_status(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(run_object(api_client, namespace, name).get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def agent_jobs(api_client: Any, namespace: str, run: str | None = None) -> list[Any]:
    from kubernetes import client

    selector = names.AGENT_JOB_SELECTOR + (f",{names.LABEL_RUN}={run}" if run else "")
    return list(client.BatchV1Api(api_client).list_namespaced_job(namespace, label_selector=selector).items)


def trainer_job(api_client: Any, namespace: str, run: str) -> Any:
    """The run's trainer Job, or None while it does not exist."""
    from kubernetes import client

    try:
        return client.BatchV1Api(api_client).read_namespaced_job(names.trainer_job_name(run), namespace)
    except client.exceptions.ApiException:
        return None


def events(kubectl: list[str], namespace: str, *, reason: str | None = None) -> list[dict[str, Any]]:
    listing = kubectl_run(kubectl, "get", "events.events.k8s.io", "-n", namespace, "-o", "json")
    assert listing.returncode == 0, listing.stderr
    items: list[dict[str, Any]] = json.loads(listing.stdout)["items"]
    return [item for item in items if reason is None or item.get("reason") == reason]
