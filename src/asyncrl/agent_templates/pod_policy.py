"""What a rendered agent Job may ask of the cluster: the operator's `--agent-pod-policy`.

Whoever can create an AsyncTrainingRun in a namespace writes the agent template, and the operator, not that
user, creates the Jobs. Without a policy the template is a way to run any pod the operator's service account
could create: a privileged container, the node's filesystem (hostPath), the node's network, another service
account's API token, any Secret, ConfigMap or claim of the namespace (another run's data or checkpoints), or a
Job that adopts other runs' pods. `restricted` refuses all of these, naming the field; `unrestricted` trusts
every run author as much as the operator itself. The check is pure (the rendered Job only, no API call), so
`asyncrl validate`, `asyncrl render-agent-job` and the operator refuse the same templates.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from asyncrl.agent_templates.errors import TemplateError

POD_SPEC = "spec.template.spec"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
DEFAULT_SERVICE_ACCOUNT = "default"
# Keys that name a Secret wherever they appear in a pod spec: env valueFrom.secretKeyRef, envFrom[].secretRef,
# volumes[].secret, projected sources[].secret, and the secretRef/secretName of volume plugins (csi, cephfs,
# azureFile, ...). imagePullSecrets are not among them: the kubelet uses those, the containers never see them.
SECRET_KEYS = frozenset({"secret", "secretKeyRef", "secretRef", "secretName", "nodePublishSecretRef"})
# Keys that name a ConfigMap: volumes[].configMap, projected sources[].configMap, envFrom[].configMapRef and
# env valueFrom.configMapKeyRef. The policy sees only the Job, not whose a ConfigMap is, so it refuses all of
# them but the cluster's CA bundle, which every namespace holds and every pod's API token volume mounts.
CONFIG_MAP_KEYS = frozenset({"configMap", "configMapRef", "configMapKeyRef"})
PUBLIC_CONFIG_MAPS = frozenset({"kube-root-ca.crt"})
# Volume types an agent pod may use: its own scratch space and what the pod knows of itself. `secret` and
# `configMap` are checked by the reference rules; `csi` inline volumes are served only by drivers the
# cluster's administrator marked for it (CSIDriver volumeLifecycleModes: Ephemeral), as in Pod Security
# "restricted". Every other type (persistentVolumeClaim, hostPath, nfs, iscsi, cephfs, gitRepo, ...) reaches
# storage outside the run's pod.
ALLOWED_VOLUMES = frozenset(
    {"emptyDir", "ephemeral", "downwardAPI", "projected", "secret", "configMap", "csi"}
)
VOLUME_REASONS = {
    "hostPath": "a volume from the node's filesystem is not allowed",
    "persistentVolumeClaim": (
        "a claim of the namespace is not allowed (it may be another run's checkpoints or data; "
        "use emptyDir, or an ephemeral volume for a new claim)"
    ),
    "nfs": "a network filesystem export is not allowed (storage shared outside the run, no claim or quota)",
}
# An ephemeral volume's new claim may not start as a copy of, or pick, existing storage.
EPHEMERAL_SOURCES = ("dataSource", "dataSourceRef", "volumeName", "selector")
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

    RESTRICTED = "restricted"  # no privileged or host access, no other identity, no other run's objects
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


def with_restricted_defaults(job: dict[str, Any]) -> dict[str, Any]:
    """`job` with what Pod Security "restricted" requires filled in where the template left it unset: the pod
    runs as non-root with the RuntimeDefault seccomp profile, and each container drops every capability and
    cannot gain privileges. Without these, a namespace that enforces "restricted" (the level docs/security.md
    recommends for runs) refuses every agent pod while the Job itself is admitted. What the template sets is
    kept: the namespace's own Pod Security level, not the operator, judges it."""
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    pod_context: dict[str, Any] = pod.setdefault("securityContext", {})
    pod_context.setdefault("runAsNonRoot", True)
    pod_context.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    for field in ("initContainers", "containers"):
        for container in pod.get(field) or []:
            context: dict[str, Any] = container.setdefault("securityContext", {})
            context.setdefault("allowPrivilegeEscalation", False)
            capabilities: dict[str, Any] = context.setdefault("capabilities", {})
            capabilities.setdefault("drop", ["ALL"])
    return job


def restricted_violations(job: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, why) of every field the restricted policy refuses: the Job's, the pod's, then containers, then
    Secret and ConfigMap references."""
    spec: dict[str, Any] = job["spec"]
    if spec.get("manualSelector"):
        yield (
            "spec.manualSelector",
            "a Job that picks its own pods is not allowed (it could adopt and delete other runs' pods)",
        )
    if spec.get("selector") is not None:
        yield (
            "spec.selector",
            "a pod selector is not allowed (the API server generates one that matches only this Job's pods)",
        )
    pod: dict[str, Any] = spec["template"]["spec"]
    for field in HOST_NAMESPACES:
        if pod.get(field):
            yield f"{POD_SPEC}.{field}", "sharing the node's namespaces is not allowed"
    if pod.get("shareProcessNamespace"):
        yield (
            f"{POD_SPEC}.shareProcessNamespace",
            "one process namespace for the pod's containers is not allowed (the agent could read and signal "
            "the other containers' processes and files, a grader's among them)",
        )
    if pod.get("nodeName"):
        yield (
            f"{POD_SPEC}.nodeName",
            "naming the node is not allowed (it bypasses the scheduler, its taints and the node's capacity; "
            "use nodeSelector or affinity)",
        )
    for field in ("serviceAccountName", "serviceAccount"):
        account = pod.get(field)
        if account not in (None, "", DEFAULT_SERVICE_ACCOUNT):
            yield (
                f"{POD_SPEC}.{field}",
                f"the service account {account!r} is not allowed (agents run as the namespace's default)",
            )
    for index, volume in enumerate(pod.get("volumes") or []):
        yield from _volume_violations(volume, f"{POD_SPEC}.volumes[{index}]")
    if (pod.get("securityContext") or {}).get("sysctls"):
        yield f"{POD_SPEC}.securityContext.sysctls", "kernel parameters are not allowed"
    for field in CONTAINER_LISTS:
        for index, container in enumerate(pod.get(field) or []):
            yield from _container_violations(container, f"{POD_SPEC}.{field}[{index}]")
    for path in _secret_references(pod, POD_SPEC):
        yield path, "a Secret reference is not allowed (agents get only their AGL_KEY)"
    for path, name in _config_map_references(pod, POD_SPEC):
        yield (
            path,
            f"a reference to the ConfigMap {name!r} is not allowed (the operator cannot tell whose it is: it "
            "may be another run's config or data); pass settings in the template's env or the image",
        )


def _volume_violations(volume: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    for kind in volume:
        if kind == "name":
            continue
        if kind not in ALLOWED_VOLUMES:
            yield (
                f"{path}.{kind}",
                VOLUME_REASONS.get(
                    kind,
                    f"the volume type {kind!r} is not allowed (storage outside the agent's pod; "
                    "allowed: emptyDir, ephemeral, downwardAPI, projected, csi)",
                ),
            )
    claim = ((volume.get("ephemeral") or {}).get("volumeClaimTemplate") or {}).get("spec") or {}
    for field in EPHEMERAL_SOURCES:
        if claim.get(field) is not None:
            yield (
                f"{path}.ephemeral.volumeClaimTemplate.spec.{field}",
                "a new claim made from, or choosing, existing storage is not allowed (another run's claim "
                "or volume)",
            )
    for index, source in enumerate((volume.get("projected") or {}).get("sources") or []):
        audience = (source.get("serviceAccountToken") or {}).get("audience")
        if audience:
            yield (
                f"{path}.projected.sources[{index}].serviceAccountToken.audience",
                f"a service-account token for the audience {audience!r} is not allowed (other services would "
                "accept it as the namespace's default service account; only the API server's is allowed)",
            )


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
    if context.get("procMount") not in (None, "", "Default"):
        yield (
            f"{path}.securityContext.procMount",
            f"procMount {context['procMount']!r} is not allowed (an unmasked /proc exposes the node's kernel "
            "interfaces)",
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


def _config_map_references(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, name) of every ConfigMap reference but the public ones (`PUBLIC_CONFIG_MAPS`)."""
    if isinstance(value, dict):
        for key, child in value.items():
            child_path = f"{path}.{key}"
            if key in CONFIG_MAP_KEYS and child is not None:
                name = child.get("name") if isinstance(child, dict) else None
                if name not in PUBLIC_CONFIG_MAPS:
                    yield child_path, str(name)
            else:
                yield from _config_map_references(child, child_path)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _config_map_references(child, f"{path}[{index}]")
