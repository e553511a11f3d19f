"""`--agent-pod-policy=restricted` refuses every way a template reaches past its own pod, naming the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from asyncrl.agent_templates.pod_policy import AgentPodPolicy, check_pod_policy, restricted_violations
from asyncrl.agent_templates.render import TemplateError


def _job(
    pod: dict[str, Any] | None = None, *, job: dict[str, Any] | None = None, **container: Any
) -> dict[str, Any]:
    agent = {"name": "agent", "image": "python:3.12", **container}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"template": {"spec": {"containers": [agent], **(pod or {})}}, **(job or {})},
    }


# The volume the API server's service-account admission adds to every pod, written out in a template.
API_TOKEN_VOLUME = {
    "name": "api-token",
    "projected": {
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                }
            },
        ]
    },
}


POD = "spec.template.spec"
AGENT = f"{POD}.containers[0]"
REFUSED = {
    "privileged": (_job(securityContext={"privileged": True}), f"{AGENT}.securityContext.privileged"),
    "privilege-escalation": (
        _job(securityContext={"allowPrivilegeEscalation": True}),
        f"{AGENT}.securityContext.allowPrivilegeEscalation",
    ),
    "capability": (
        _job(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}),
        f"{AGENT}.securityContext.capabilities.add[1]",
    ),
    "host-port": (_job(ports=[{"containerPort": 80, "hostPort": 80}]), f"{AGENT}.ports[0].hostPort"),
    "host-path": (
        _job({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
        f"{POD}.volumes[0].hostPath",
    ),
    "host-network": (_job({"hostNetwork": True}), f"{POD}.hostNetwork"),
    "host-pid": (_job({"hostPID": True}), f"{POD}.hostPID"),
    "host-ipc": (_job({"hostIPC": True}), f"{POD}.hostIPC"),
    "sysctls": (
        _job({"securityContext": {"sysctls": [{"name": "a", "value": "1"}]}}),
        f"{POD}.securityContext",
    ),
    "service-account": (_job({"serviceAccountName": "admin"}), f"{POD}.serviceAccountName"),
    "service-account-deprecated": (_job({"serviceAccount": "admin"}), f"{POD}.serviceAccount"),
    "env-secret": (
        _job(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        f"{AGENT}.env[0].valueFrom.secretKeyRef",
    ),
    "env-from-secret": (_job(envFrom=[{"secretRef": {"name": "s"}}]), f"{AGENT}.envFrom[0].secretRef"),
    "secret-volume": (
        _job({"volumes": [{"name": "creds", "secret": {"secretName": "s"}}]}),
        f"{POD}.volumes[0].secret",
    ),
    "projected-secret": (
        _job({"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "s"}}]}}]}),
        f"{POD}.volumes[0].projected.sources[0].secret",
    ),
    "csi-secret": (
        _job({"volumes": [{"name": "c", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}}]}),
        f"{POD}.volumes[0].csi.nodePublishSecretRef",
    ),
    # issue 24: what an agent pod could still reach of other runs under `restricted`
    "claim": (
        _job(
            {"volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "other-run-checkpoints"}}]}
        ),
        f"{POD}.volumes[0].persistentVolumeClaim",
    ),
    "nfs": (
        _job({"volumes": [{"name": "share", "nfs": {"server": "10.0.0.1", "path": "/exports"}}]}),
        f"{POD}.volumes[0].nfs",
    ),
    "other-volume-type": (
        _job({"volumes": [{"name": "repo", "gitRepo": {"repository": "https://example.com/r.git"}}]}),
        f"{POD}.volumes[0].gitRepo",
    ),
    "ephemeral-clone": (
        _job(
            {
                "volumes": [
                    {
                        "name": "copy",
                        "ephemeral": {
                            "volumeClaimTemplate": {
                                "spec": {
                                    "accessModes": ["ReadWriteOnce"],
                                    "resources": {"requests": {"storage": "1Gi"}},
                                    "dataSource": {"kind": "PersistentVolumeClaim", "name": "other-run"},
                                }
                            }
                        },
                    }
                ]
            }
        ),
        f"{POD}.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSource",
    ),
    "ephemeral-picks-a-volume": (
        _job(
            {
                "volumes": [
                    {
                        "name": "pick",
                        "ephemeral": {
                            "volumeClaimTemplate": {
                                "spec": {
                                    "accessModes": ["ReadOnlyMany"],
                                    "resources": {"requests": {"storage": "1Gi"}},
                                    "selector": {"matchLabels": {"data": "other-run"}},
                                }
                            }
                        },
                    }
                ]
            }
        ),
        f"{POD}.volumes[0].ephemeral.volumeClaimTemplate.spec.selector",
    ),
    "node-name": (_job({"nodeName": "gpu-node-7"}), f"{POD}.nodeName"),
    "share-process-namespace": (_job({"shareProcessNamespace": True}), f"{POD}.shareProcessNamespace"),
    "proc-mount": (
        _job(securityContext={"procMount": "Unmasked"}),
        f"{AGENT}.securityContext.procMount",
    ),
    "manual-selector": (_job(job={"manualSelector": True}), "spec.manualSelector"),
    "selector": (_job(job={"selector": {"matchLabels": {"asyncrl.dev/run": "other"}}}), "spec.selector"),
    "config-map-volume": (
        _job({"volumes": [{"name": "cfg", "configMap": {"name": "other-run-config"}}]}),
        f"{POD}.volumes[0].configMap",
    ),
    "config-map-env-from": (
        _job(envFrom=[{"configMapRef": {"name": "other-run-config"}}]),
        f"{AGENT}.envFrom[0].configMapRef",
    ),
    "config-map-value-from": (
        _job(env=[{"name": "ROWS", "valueFrom": {"configMapKeyRef": {"name": "prompts", "key": "rows"}}}]),
        f"{AGENT}.env[0].valueFrom.configMapKeyRef",
    ),
    "config-map-projected": (
        _job({"volumes": [{"name": "p", "projected": {"sources": [{"configMap": {"name": "prompts"}}]}}]}),
        f"{POD}.volumes[0].projected.sources[0].configMap",
    ),
    "token-audience": (
        _job(
            {
                "volumes": [
                    {
                        "name": "aws",
                        "projected": {
                            "sources": [
                                {"serviceAccountToken": {"audience": "sts.amazonaws.com", "path": "t"}}
                            ]
                        },
                    }
                ]
            }
        ),
        f"{POD}.volumes[0].projected.sources[0].serviceAccountToken.audience",
    ),
    "init-container": (
        _job({"initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": True}}]}),
        f"{POD}.initContainers[0].securityContext.privileged",
    ),
}


@pytest.mark.parametrize(("job", "path"), REFUSED.values(), ids=REFUSED.keys())
def test_restricted_refuses_the_field_and_names_it(job: dict[str, Any], path: str) -> None:
    with pytest.raises(TemplateError) as raised:
        check_pod_policy(job, AgentPodPolicy.RESTRICTED)
    assert path in str(raised.value)
    assert "--agent-pod-policy=restricted" in str(raised.value)
    check_pod_policy(job, AgentPodPolicy.UNRESTRICTED)  # the operator's flag turns it off


@pytest.mark.parametrize(
    "job",
    [
        _job(),
        _job({"serviceAccountName": "default", "automountServiceAccountToken": True}),
        _job({"imagePullSecrets": [{"name": "registry"}]}),  # the kubelet's, never the container's
        _job(
            {"hostNetwork": False}, securityContext={"privileged": False, "allowPrivilegeEscalation": False}
        ),
        _job(env=[{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        _job(securityContext={"capabilities": {"add": ["CHOWN"], "drop": ["ALL"]}}),
        _job(
            {
                "volumes": [
                    {"name": "tmp", "emptyDir": {}},
                    API_TOKEN_VOLUME,
                    {
                        "name": "scratch",
                        "ephemeral": {
                            "volumeClaimTemplate": {
                                "spec": {
                                    "accessModes": ["ReadWriteOnce"],
                                    "resources": {"requests": {"storage": "1Gi"}},
                                }
                            }
                        },
                    },
                    {"name": "inline", "csi": {"driver": "scratch.example.com"}},
                ]
            }
        ),
        _job(
            {"shareProcessNamespace": False, "nodeName": ""},
            job={"manualSelector": False},
            securityContext={"procMount": "Default"},
        ),
    ],
    ids=[
        "plain",
        "default-account",
        "pull-secret",
        "explicitly-off",
        "field-ref",
        "baseline-cap",
        "own-volumes",
        "explicitly-off-issue-24",
    ],
)
def test_restricted_allows_ordinary_agent_pods(job: dict[str, Any]) -> None:
    check_pod_policy(job, AgentPodPolicy.RESTRICTED)


def test_a_volume_type_is_named_with_its_own_reason() -> None:
    claim = _job({"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "ckpt"}}]})
    with pytest.raises(TemplateError, match="another run's checkpoints"):
        check_pod_policy(claim, AgentPodPolicy.RESTRICTED)
    iscsi = _job({"volumes": [{"name": "d", "iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}]})
    with pytest.raises(TemplateError, match=re.escape("the volume type 'iscsi' is not allowed")):
        check_pod_policy(iscsi, AgentPodPolicy.RESTRICTED)


def test_every_violation_is_listed() -> None:
    job = _job({"hostNetwork": True, "serviceAccountName": "admin"}, securityContext={"privileged": True})
    assert [path for path, _ in restricted_violations(job)] == [
        f"{POD}.hostNetwork",
        f"{POD}.serviceAccountName",
        f"{AGENT}.securityContext.privileged",
    ]
