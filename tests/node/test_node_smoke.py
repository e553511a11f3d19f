"""What a real node gives pods that the pod runner cannot: containers, in-cluster identity, DNS, Services,
native sidecars, logs and port-forward through the kubelet. Each test fails naming the part that broke."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from asyncrl.testing.node import NodeCluster
from asyncrl.testing.waiting import wait_for
from tests.node.conftest import apply, get, logs, pod, wait_for_pod_phase
from tests.support.kube import kubectl_run

pytestmark = [pytest.mark.node, pytest.mark.slow]

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_a_pod_runs_in_a_container_and_kubectl_logs_reads_its_output(
    node_cluster: NodeCluster, node_kubectl: list[str], node_namespace: str, busybox: str
) -> None:
    apply(node_kubectl, node_namespace, pod("hello", busybox, ["sh", "-c", "echo hello from $(hostname)"]))
    done = wait_for_pod_phase(node_cluster, node_namespace, "hello", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    (status,) = done["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://"), status
    assert done["spec"]["nodeName"] == node_cluster.node_name
    assert logs(node_kubectl, node_namespace, "hello").strip() == "hello from hello"


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service_with_a_valid_token(
    node_cluster: NodeCluster, node_kubectl: list[str], node_namespace: str, busybox: str
) -> None:
    """DNS names kubernetes.default.svc; its Service (10.96.0.1:443) leads to the API server's HTTPS port; the
    projected token authenticates as the pod's ServiceAccount over TLS verified by the mounted CA.

    busybox's own TLS client offers no signature algorithms and the API server ends its handshake (alert 40),
    so the pod speaks plain HTTP to the port (Go's TLS server answers that in clear) and the TLS request with
    the pod's token and CA is made from here, with the in-cluster server name. The next test makes it from a
    pod with the Python client."""
    script = (
        "nslookup kubernetes.default.svc.cluster.local && "
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 kubernetes.default.svc 443; "
        f"echo; echo TOKEN: $(cat {SERVICE_ACCOUNT}/token); echo CA:; cat {SERVICE_ACCOUNT}/ca.crt"
    )
    apply(node_kubectl, node_namespace, pod("in-cluster", busybox, ["sh", "-c", script]))
    done = wait_for_pod_phase(node_cluster, node_namespace, "in-cluster", "Succeeded", "Failed")
    output = logs(node_kubectl, node_namespace, "in-cluster")
    assert done["status"]["phase"] == "Succeeded", output
    assert re.search(r"Address:?\s+10\.96\.0\.1\b", output), (
        f"kubernetes.default.svc did not resolve:\n{output}"
    )
    assert "Client sent an HTTP request to an HTTPS server" in output, (
        f"no API server behind 10.96.0.1:443:\n{output}"
    )
    token = re.search(r"^TOKEN: (\S+)$", output, re.MULTILINE)
    assert token, output
    mounted_ca = output.split("CA:\n", 1)[1]
    published = get(node_kubectl, node_namespace, "configmap", "kube-root-ca.crt")["data"]["ca.crt"]
    assert mounted_ca.strip() == published.strip()

    review = _self_subject_review(node_cluster, token=token[1], ca=mounted_ca)
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{node_namespace}:default"


def _self_subject_review(cluster: NodeCluster, *, token: str, ca: str) -> dict[str, Any]:
    """POST a SelfSubjectReview as `token`, verifying the server as `kubernetes.default.svc` with `ca`."""
    port = int(cluster.server.rsplit(":", 1)[1])
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    context = ssl.create_default_context(cadata=ca)
    with (
        socket.create_connection((cluster.node_address, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="kubernetes.default.svc") as tls,
    ):
        request = (
            "POST /apis/authentication.k8s.io/v1/selfsubjectreviews HTTP/1.1\r\n"
            "Host: kubernetes.default.svc\r\n"
            f"Authorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
        )
        tls.sendall(request.encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, payload = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 201"), head
    document: dict[str, Any] = json.loads(payload)
    return document


def test_the_python_client_in_a_pod_loads_in_cluster_config_and_is_authenticated(
    node_cluster: NodeCluster, node_kubectl: list[str], node_namespace: str, operator_image: str
) -> None:
    """What the operator does at start: `load_incluster_config()` (token, CA, KUBERNETES_SERVICE_HOST), TLS
    verified, as the pod's ServiceAccount."""
    code = (
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "review = client.AuthenticationV1Api().create_self_subject_review("
        "{'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'})\n"
        "print('user', review.status.user_info.username)\n"
    )
    apply(node_kubectl, node_namespace, pod("python-client", operator_image, ["python", "-c", code]))
    done = wait_for_pod_phase(node_cluster, node_namespace, "python-client", "Succeeded", "Failed")
    output = logs(node_kubectl, node_namespace, "python-client")
    assert done["status"]["phase"] == "Succeeded", output
    assert output.strip().splitlines()[-1] == f"user system:serviceaccount:{node_namespace}:default"


@pytest.mark.parametrize("server_name", ["kubernetes.default.svc", "10.96.0.1"])
def test_the_published_root_ca_verifies_the_api_server_under_its_in_cluster_names(
    node_cluster: NodeCluster, node_kubectl: list[str], server_name: str
) -> None:
    """What an in-cluster client with verification on (the Python client, kopf) checks: the CA of
    kube-root-ca.crt, and the serving certificate's names for the `kubernetes` Service."""
    ca = get(node_kubectl, "default", "configmap", "kube-root-ca.crt")["data"]["ca.crt"]
    context = ssl.create_default_context(cadata=ca)
    port = int(node_cluster.server.rsplit(":", 1)[1])
    with (
        socket.create_connection((node_cluster.node_address, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        assert tls.version() is not None


def wait_for_ready(cluster: NodeCluster, namespace: str, name: str) -> None:
    def ready() -> bool:
        found = cluster.api_get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}
        conditions = found.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, timeout=180, what=f"pod {namespace}/{name} Ready", interval=0.5)


def _web_server(name: str, image: str, text: str) -> dict[str, Any]:
    serve = f"mkdir -p /www && echo {text} > /www/index.html && exec httpd -f -p 8080 -h /www"
    body = pod(name, image, ["sh", "-c", serve], restartPolicy="Always")
    body["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "name": "http"}]
    body["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": 8080},
        "periodSeconds": 1,
    }
    return body


def test_a_service_answers_by_dns_name_from_another_pod_and_from_its_own_endpoint(
    node_cluster: NodeCluster, node_kubectl: list[str], node_namespace: str, busybox: str
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    apply(node_kubectl, node_namespace, _web_server("web", busybox, "hello-from-web"), service)

    def ready_endpoint() -> bool:
        slices = node_cluster.api_get(
            f"/apis/discovery.k8s.io/v1/namespaces/{node_namespace}/endpointslices"
            "?labelSelector=kubernetes.io/service-name%3Dweb"
        )
        endpoints = [e for s in (slices or {}).get("items", []) for e in s.get("endpoints") or []]
        return any(e.get("conditions", {}).get("ready") for e in endpoints)

    wait_for(ready_endpoint, timeout=180, what="a ready endpoint of Service web", interval=0.5)
    # kube-proxy programs the rule a moment after the EndpointSlice; the client retries for a bounded while.
    # (`timeout`, not `wget -T`: Debian's static busybox 1.35 crashes with -T.)
    fetch = (
        f"for i in $(seq 60); do timeout 5 wget -q -O - http://web.{node_namespace}.svc.cluster.local/ "
        "&& exit 0; sleep 1; done; exit 1"
    )
    apply(node_kubectl, node_namespace, pod("client", busybox, ["sh", "-c", fetch]))
    done = wait_for_pod_phase(node_cluster, node_namespace, "client", "Succeeded", "Failed")
    output = logs(node_kubectl, node_namespace, "client")
    assert done["status"]["phase"] == "Succeeded", output
    assert output.strip() == "hello-from-web"
    # Hairpin: the Service's only endpoint reaches itself through it (by the Service's name: in its own
    # /etc/hosts, `web` is the pod).
    fetch_itself = f"timeout 30 wget -q -O - http://web.{node_namespace}.svc.cluster.local/"
    hairpin = kubectl_run(node_kubectl, "exec", "-n", node_namespace, "web", "--", *fetch_itself.split())
    assert hairpin.returncode == 0, hairpin.stderr
    assert hairpin.stdout.strip() == "hello-from-web"


def test_a_native_sidecar_is_restarted_in_place_after_it_is_killed(
    node_cluster: NodeCluster, node_kubectl: list[str], node_namespace: str, busybox: str
) -> None:
    sidecar = {
        "name": "sidecar",
        "image": busybox,
        "imagePullPolicy": "Never",
        "restartPolicy": "Always",
        # A shell as PID 1 with a TERM handler: PID 1 ignores signals it does not handle.
        "command": ["sh", "-c", 'echo sidecar up; trap "exit 7" TERM; while true; do sleep 1; done'],
    }
    body = pod("with-sidecar", busybox, ["sleep", "3600"], restartPolicy="Always", initContainers=[sidecar])
    apply(node_kubectl, node_namespace, body)

    def sidecar_status() -> dict[str, Any] | None:
        found = node_cluster.api_get(f"/api/v1/namespaces/{node_namespace}/pods/with-sidecar") or {}
        statuses = found.get("status", {}).get("initContainerStatuses") or []
        return next((s for s in statuses if s["name"] == "sidecar"), None)

    before = wait_for_pod_phase(node_cluster, node_namespace, "with-sidecar", "Running")
    wait_for(lambda: (sidecar_status() or {}).get("started"), timeout=120, what="the sidecar started")
    killed = kubectl_run(
        node_kubectl, "exec", "-n", node_namespace, "with-sidecar", "-c", "sidecar", "--", "kill", "1"
    )
    assert killed.returncode == 0, killed.stderr
    restarted = wait_for(
        lambda: (s := sidecar_status()) and s["restartCount"] >= 1 and s.get("started") and s,
        timeout=180,
        what="the sidecar restarted and running again",
    )
    assert restarted["lastState"]["terminated"]["exitCode"] == 7
    after = get(node_kubectl, node_namespace, "pod", "with-sidecar")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["phase"] == "Running"
    (main,) = after["status"]["containerStatuses"]
    assert main["restartCount"] == 0
    assert "running" in main["state"]
    assert logs(node_kubectl, node_namespace, "with-sidecar", "-c", "sidecar").count("sidecar up") == 1


def test_kubectl_port_forward_reaches_a_pod_from_this_machine(
    node_cluster: NodeCluster, node_kubectl: list[str], node_namespace: str, busybox: str
) -> None:
    apply(node_kubectl, node_namespace, _web_server("forwarded", busybox, "hello-through-the-tunnel"))
    wait_for_ready(node_cluster, node_namespace, "forwarded")
    forward = subprocess.Popen(
        [
            *node_kubectl,
            "port-forward",
            "-n",
            node_namespace,
            "pod/forwarded",
            "--address=127.0.0.1",
            ":8080",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        match = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
        assert match, f"kubectl port-forward said: {line}"
        with urllib.request.urlopen(f"http://127.0.0.1:{match[1]}/", timeout=30) as response:
            assert response.read().decode().strip() == "hello-through-the-tunnel"
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_the_api_server_reads_logs_through_the_kubelet_with_its_client_certificate(
    node_cluster: NodeCluster,
) -> None:
    """The kubelet's API accepts the API server's client certificate and nothing anonymous."""
    request = urllib.request.Request(f"https://{node_cluster.node_address}:10250/pods")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10, context=context)
    assert refused.value.code == 401
