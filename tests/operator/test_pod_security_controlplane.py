"""Agent pods pass Pod Security "restricted": the API server's own admission judges the rendered pods.

The operator's `--agent-pod-policy=restricted` (the chart's default) fills in what that level requires where a
template leaves it unset. Before it did, a namespace enforcing "restricted" admitted every agent Job and
refused each of its pods, so a run stayed Running with no agent ever started (found on the real node). Here
the pod of each example's agent Job, rendered as the operator renders it, is sent to the real API server as a
server-side dry run in a namespace that enforces "restricted".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kube import REPO, kubectl_run

pytestmark = [pytest.mark.controlplane]

EXAMPLES = sorted(
    path.name
    for path in (REPO / "examples").glob("*.yaml")
    if "invalid" not in path.name  # run-invalid-async.yaml is refused before any Job is rendered
    and yaml.safe_load(path.read_text()).get("spec", {}).get("agents", {}).get("template", {}).get("inline")
)


def _rendered_pod(manifest: Path, policy: str) -> dict[str, Any]:
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "render-agent-job",
            str(manifest),
            f"--agent-pod-policy={policy}",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    job: dict[str, Any] = yaml.safe_load(rendered.stdout)
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent", "labels": template["metadata"].get("labels", {})},
        "spec": template["spec"],
    }


@pytest.fixture
def restricted_namespace(kubectl: list[str], namespace: str) -> str:
    labelled = kubectl_run(
        kubectl, "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    assert labelled.returncode == 0, labelled.stderr
    return namespace


def _dry_run_create(
    kubectl: list[str], namespace: str, pod: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return kubectl_run(
        kubectl, "create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(pod)
    )


def test_the_examples_cover_an_agent_template() -> None:
    assert "quickstart-cluster.yaml" in EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_examples_agent_pod_is_admitted_where_restricted_is_enforced(
    kubectl: list[str], restricted_namespace: str, example: str
) -> None:
    pod = _rendered_pod(REPO / "examples" / example, "restricted")
    created = _dry_run_create(kubectl, restricted_namespace, pod)
    assert created.returncode == 0, created.stderr


def test_without_the_defaults_the_same_pod_is_refused_by_pod_security(
    kubectl: list[str], restricted_namespace: str
) -> None:
    """The check above can fail: the unrestricted policy adds nothing, and the API server refuses the pod."""
    pod = _rendered_pod(REPO / "examples" / "quickstart-cluster.yaml", "unrestricted")
    created = _dry_run_create(kubectl, restricted_namespace, pod)
    assert created.returncode != 0
    assert 'violates PodSecurity "restricted' in created.stderr, created.stderr


def test_a_templates_own_security_settings_are_kept(tmp_path: Path) -> None:
    manifest = yaml.safe_load((REPO / "examples" / "quickstart-cluster.yaml").read_text())
    template = yaml.safe_load(
        manifest["spec"]["agents"]["template"]["inline"].replace("{{ input | tojson }}", "x")
    )
    pod_spec = template["spec"]["template"]["spec"]
    pod_spec["securityContext"] = {
        "runAsUser": 20000,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "a.json"},
    }
    pod_spec["containers"][0]["securityContext"] = {"capabilities": {"drop": ["NET_RAW"]}}
    text = yaml.safe_dump(template).replace("value: x", "value: {{ input | tojson }}")
    manifest["spec"]["agents"]["template"]["inline"] = text
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    pod = _rendered_pod(path, "restricted")
    assert pod["spec"]["securityContext"] == {
        "runAsUser": 20000,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "a.json"},
    }
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "capabilities": {"drop": ["NET_RAW"]},
        "allowPrivilegeEscalation": False,
    }
