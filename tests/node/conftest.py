"""Fixtures for the tests on a real node: a cluster whose pods run in containers (asyncrl.testing.node).

The cluster starts once for the package (about a minute on two cores) and stops when tests/node is done, so
its processes do not idle beside the rest of the suite. It needs root and `scripts/provision-node.sh`; where
either is missing the tests are skipped with the reason, unless ASYNCRL_REQUIRE_NODE=1, which turns the skip
into a failure (CI sets it, so it can never pass without having run them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.controlplane import images_dir
from asyncrl.testing.node import NodeCluster, NodeClusterError, missing_prerequisites
from asyncrl.testing.waiting import wait_for
from tests.support.kube import kubectl_run

REQUIRE_ENV = "ASYNCRL_REQUIRE_NODE"
# CI shares two cores between the node and the test; pod starts take seconds there, image pulls none.
POD_TIMEOUT = 180.0


def skip_or_fail_without_node() -> None:
    """Skip (or fail, under ASYNCRL_REQUIRE_NODE=1) with every reason a node cannot start here."""
    reasons = missing_prerequisites()
    if not reasons:
        return
    message = "a node cluster cannot start here: " + "; ".join(reasons)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1: these tests must run)", pytrace=False)
    pytest.skip(message)


def started_node_cluster(work_dir: Path) -> NodeCluster:
    skip_or_fail_without_node()
    cluster = NodeCluster(work_dir=work_dir)
    try:
        cluster.start()
    except NodeClusterError as error:
        pytest.fail(str(error), pytrace=False)
    return cluster


@pytest.fixture(scope="package")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    cluster = started_node_cluster(tmp_path_factory.mktemp("node"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def node_kubectl(node_cluster: NodeCluster) -> list[str]:
    return node_cluster.kubectl()


@pytest.fixture
def busybox(node_cluster: NodeCluster) -> str:
    """The busybox image provisioned for smoke tests (already in the node's containerd)."""
    assert node_cluster.tools is not None
    return node_cluster.tools.busybox_image


@pytest.fixture(scope="package")
def operator_image(node_cluster: NodeCluster) -> str:
    """The operator image (Python and the kubernetes client) from scripts/provision-images.sh, imported into
    the node once; skipped where it has not been built."""
    tarball = images_dir() / "operator.tar"
    if not tarball.is_file():
        pytest.skip(
            f"the operator image is not built ({tarball} is missing): run scripts/provision-images.sh"
        )
    (name,) = node_cluster.import_images([tarball])
    return name


@pytest.fixture
def node_namespace(node_cluster: NodeCluster, node_kubectl: list[str]) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods are refused until it does)."""
    name = f"n-{os.urandom(4).hex()}"
    created = kubectl_run(node_kubectl, "create", "namespace", name)
    assert created.returncode == 0, created.stderr
    wait_for(
        lambda: node_cluster.api_get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=60,
        what=f"the default ServiceAccount of {name}",
    )
    yield name
    kubectl_run(node_kubectl, "delete", "namespace", name, "--wait=false")


def apply(kubectl: list[str], namespace: str, *manifests: dict[str, Any]) -> None:
    document = {"apiVersion": "v1", "kind": "List", "items": list(manifests)}
    applied = kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(document))
    assert applied.returncode == 0, applied.stderr


def get(kubectl: list[str], namespace: str, kind: str, name: str) -> dict[str, Any]:
    found = kubectl_run(kubectl, "get", kind, name, "-n", namespace, "-o", "json")
    assert found.returncode == 0, found.stderr
    document: dict[str, Any] = json.loads(found.stdout)
    return document


def pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """A pod of one container `main` running `command`; `spec` adds or replaces pod spec fields."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}],
            **spec,
        },
    }
    return body


def wait_for_pod_phase(
    cluster: NodeCluster, namespace: str, name: str, *phases: str, timeout: float = POD_TIMEOUT
) -> dict[str, Any]:
    """The pod once its phase is one of `phases`; on timeout the message holds its status and the node's
    component logs."""
    last: list[dict[str, Any]] = [{}]

    def in_phase() -> dict[str, Any] | None:
        found = cluster.api_get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        last[0] = found or {}
        return found if found and found.get("status", {}).get("phase") in phases else None

    try:
        return wait_for(in_phase, timeout=timeout, what=f"pod {namespace}/{name} in {phases}", interval=0.5)
    except AssertionError as error:
        status = json.dumps(last[0].get("status"), indent=1)
        raise AssertionError(f"{error}\nstatus: {status}\n{cluster.describe_failure()}") from None


def logs(kubectl: list[str], namespace: str, name: str, *args: str) -> str:
    read = kubectl_run(kubectl, "logs", "-n", namespace, name, *args)
    assert read.returncode == 0, read.stderr
    return read.stdout
