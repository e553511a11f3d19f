"""What a rendered agent Job may ask of the cluster: the operator's `--agent-pod-policy`.

Whoever can create an AsyncTrainingRun in a namespace writes the agent template, and the operator, not that
user, creates the Jobs. Without a policy the template is a way to run any pod the operator's service account
could create: a privileged container, the node's filesystem (hostPath), the node's network, another service
account's API token, or any Secret of the namespace. `restricted` refuses all of these, naming the field;
`unrestricted` trusts every run author as much as the operator itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from asyncrl.operator.template_errors import TemplateError

POD_SPEC = "spec.template.spec"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
DEFAULT_SERVICE_ACCOUNT = "default"
# Keys that name a Secret wherever they appear in a pod spec: env valueFrom.secretKeyRef, envFrom[].secretRef,
# volumes[].secret, projected sources[].secret, and the secretRef/secretName of volume plugins (csi, cephfs,
# azureFile, ...). imagePullSecrets are not among them: the kubelet uses those, the containers never see them.
SECRET_KEYS = frozenset({"secret", "secretKeyRef", "secretRef", "secretName", "nodePublishSecretRef"})
# Pod Security Standards "baseline": the capabilities a container may add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)


class AgentPodPolicy(StrEnum):
    """`asyncrl operator --agent-pod-policy`."""

    RESTRICTED = "restricted"  # no privileged or host access, no other service account, no Secret
    UNRESTRICTED = "unrestricted"  # the template may ask for anything the operator may create


def check_pod_policy(job: dict[str, Any], policy: AgentPodPolicy) -> None:
    """Raise TemplateError naming the first field of a structurally valid agent Job that `policy` refuses."""
    if policy is AgentPodPolicy.UNRESTRICTED:
        return
    violation = next(restricted_violations(job), None)
    if violation is not None:
        path, why = violation
        raise TemplateError(
            f"agent template: {path}: {why}; refused by the operator's --agent-pod-policy=restricted "
            "(see docs/security.md)"
        )


def restricted_violations(job: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, why) of every field the restricted policy refuses: pod fields, then containers, then Secrets."""
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    for field in HOST_NAMESPACES:
        if pod.get(field):
            yield f"{POD_SPEC}.{field}", "sharing the node's namespaces is not allowed"
    for field in ("serviceAccountName", "serviceAccount"):
        account = pod.get(field)
        if account not in (None, "", DEFAULT_SERVICE_ACCOUNT):
            yield (
                f"{POD_SPEC}.{field}",
                f"the service account {account!r} is not allowed (agents run as the namespace's default)",
            )
    for index, volume in enumerate(pod.get("volumes") or []):
        if "hostPath" in volume:
            yield (
                f"{POD_SPEC}.volumes[{index}].hostPath",
                "a volume from the node's filesystem is not allowed",
            )
    if (pod.get("securityContext") or {}).get("sysctls"):
        yield f"{POD_SPEC}.securityContext.sysctls", "kernel parameters are not allowed"
    for field in CONTAINER_LISTS:
        for index, container in enumerate(pod.get(field) or []):
            yield from _container_violations(container, f"{POD_SPEC}.{field}[{index}]")
    for path in _secret_references(pod, POD_SPEC):
        yield path, "a Secret reference is not allowed (agents get only their AGL_KEY)"


def _container_violations(container: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    context = container.get("securityContext") or {}
    if context.get("privileged"):
        yield f"{path}.securityContext.privileged", "a privileged container is not allowed"
    if context.get("allowPrivilegeEscalation"):
        yield f"{path}.securityContext.allowPrivilegeEscalation", "privilege escalation is not allowed"
    added = (context.get("capabilities") or {}).get("add") or []
    for index, capability in enumerate(added):
        if str(capability).upper().removeprefix("CAP_") not in BASELINE_CAPABILITIES:
            yield (
                f"{path}.securityContext.capabilities.add[{index}]",
                f"the capability {capability!r} is not allowed",
            )
    for index, port in enumerate(container.get("ports") or []):
        if port.get("hostPort"):
            yield f"{path}.ports[{index}].hostPort", "a port on the node is not allowed"


def _secret_references(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, dict):
        for key, child in value.items():
            child_path = f"{path}.{key}"
            if key in SECRET_KEYS and child is not None:
                yield child_path
            elif key != "imagePullSecrets":
                yield from _secret_references(child, child_path)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _secret_references(child, f"{path}[{index}]")
