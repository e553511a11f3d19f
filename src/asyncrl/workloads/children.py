"""The child objects of a run, built as plain manifests from its spec (pure; the reconciler creates them).

- the gateway key Secret (only when the user gave none),
- a ConfigMap with the run (what the trainer and the gateway read) and the agent template,
- the trainer Job: one pod; the trainer container holds the GPUs, the gateway runs as a native sidecar (an
  init container with `restartPolicy: Always`), so it outlives a trainer-container restart,
- the gateway Service that agents and the operator use.
Every child carries the common labels and an ownerReference to the run, so deleting the run deletes them.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import yaml

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.api.types.spec import RESTRICTED_SECURITY_CONTEXT, ResourceRequirements, TrainerBackend
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.tokens import KEY_ENV_VAR
from asyncrl.launch.commands import gateway_args, trainer_args
from asyncrl.workloads import names
from asyncrl.workloads.pod_template import MergedPodTemplate, merge_pod_template

JSON = dict[str, Any]
CONFIG_DIR = "/etc/asyncrl/config"
KEY_DIR = "/etc/asyncrl/gateway-key"
CHECKPOINT_DIR = "/var/lib/asyncrl/checkpoints"
DATA_DIR = "/etc/asyncrl/data"
RUN_FILE = "run.yaml"
TEMPLATE_FILE = "agent-job.yaml.j2"
TRAINER_METRICS_PORT = 9400  # the trainer's Prometheus endpoint (`asyncrl trainer --metrics-port`)


def trainer_metrics_port(spec: AsyncTrainingRunSpec) -> int:
    """The trainer's metrics port: 9400, or 9401 where the gateway (same pod, same network) took 9400."""
    return TRAINER_METRICS_PORT if spec.gateway.port != TRAINER_METRICS_PORT else TRAINER_METRICS_PORT + 1


def metrics_annotations(port: int) -> dict[str, str]:
    """What annotation-based Prometheus scrape configs read (`prometheus.io/*`)."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def owner_reference(run: Mapping[str, Any]) -> JSON:
    return {
        "apiVersion": run["apiVersion"],
        "kind": run["kind"],
        "name": run["metadata"]["name"],
        "uid": run["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(run: Mapping[str, Any], name: str, component: str) -> JSON:
    return {
        "name": name,
        "namespace": run["metadata"]["namespace"],
        "labels": names.common_labels(run["metadata"]["name"], component),
        "ownerReferences": [owner_reference(run)],
    }


def gateway_key_ref(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> tuple[str, str]:
    """(secret name, key) of the gateway key: the user's Secret, or the one the operator generates."""
    if spec.gateway.key_secret_ref is not None:
        return spec.gateway.key_secret_ref.name, spec.gateway.key_secret_ref.key
    return names.gateway_key_secret_name(run["metadata"]["name"]), "key"


def gateway_key_secret(run: Mapping[str, Any], key: str | None = None) -> JSON:
    """The generated key Secret: a fresh key, or `key` when recreated for a run whose gateway has one."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(
            run, names.gateway_key_secret_name(run["metadata"]["name"]), names.COMPONENT_GATEWAY
        ),
        "type": "Opaque",
        "stringData": {"key": key if key is not None else secrets.token_urlsafe(32)},
    }


def config_map(run: Mapping[str, Any], template_source: str | None) -> JSON:
    """The run as the trainer and the gateway read it (name, namespace, uid, spec) and, when inline, the agent
    template."""
    document = {
        "apiVersion": run["apiVersion"],
        "kind": run["kind"],
        "metadata": {key: run["metadata"][key] for key in ("name", "namespace", "uid")},
        "spec": run["spec"],
    }
    data = {RUN_FILE: yaml.safe_dump(document, sort_keys=True)}
    if template_source is not None:
        data[TEMPLATE_FILE] = template_source
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(run, names.config_map_name(run["metadata"]["name"]), names.COMPONENT_TRAINER),
        "data": data,
    }


GPU_RESOURCE = "nvidia.com/gpu"


def container_resources(given: ResourceRequirements | None) -> dict[str, dict[str, str]]:
    """A container's resources; every quantity a string, as the API and its client require."""
    resources: dict[str, dict[str, str]] = {}
    if given is not None:
        for section, quantities in (("limits", given.limits), ("requests", given.requests)):
            if quantities:
                resources[section] = {name: str(value) for name, value in quantities.items()}
    return resources


def trainer_resources(spec: AsyncTrainingRunSpec) -> JSON:
    """The trainer container's resources: `trainer.resources`, and `trainer.gpus` as the GPU limit and
    request (a pod must request extended resources it limits)."""
    resources = container_resources(spec.trainer.resources)
    if spec.trainer.gpus:
        for section in ("limits", "requests"):
            resources.setdefault(section, {})[GPU_RESOURCE] = str(spec.trainer.gpus)
    return dict(resources)


# The API server refuses a ConfigMap whose data exceeds 1 MiB; keep room for its metadata.
MAX_CONFIG_MAP_DATA_BYTES = 1024 * 1024 - 16 * 1024


def config_map_size_error(config_map: Mapping[str, Any]) -> str | None:
    """Why the run's ConfigMap cannot be stored (large inline rows or template), or None."""
    size = sum(len(key.encode()) + len(value.encode()) for key, value in config_map["data"].items())
    if size <= MAX_CONFIG_MAP_DATA_BYTES:
        return None
    return (
        f"the run's spec and agent template take {size} bytes, more than a ConfigMap holds "
        f"({MAX_CONFIG_MAP_DATA_BYTES} bytes): move the rows of spec.data.inline into a file "
        "(spec.data.configMapRef or spec.data.path) and a long template into agents.template.configMapRef"
    )


TRAINER_CONTAINER = "trainer"


def trainer_job(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> JSON:
    """The trainer Job, with the user's pod template applied (see `trainer_job_with_template`)."""
    job, _ = trainer_job_with_template(run, spec)
    return job


def trainer_job_with_template(
    run: Mapping[str, Any], spec: AsyncTrainingRunSpec
) -> tuple[JSON, MergedPodTemplate]:
    """The trainer Job and the merge of `spec.trainer.podTemplate` into its pod (what was refused)."""
    pod_template = _trainer_pod_template(run, spec)
    merged = merge_pod_template(pod_template, spec.trainer.pod_template, trainer_container=TRAINER_CONTAINER)
    return _trainer_job_around(run, spec, merged.template), merged


def _trainer_pod_template(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> JSON:
    """The trainer pod as the operator builds it, before the user's pod template is merged in."""
    run_name = run["metadata"]["name"]
    secret_name, _ = gateway_key_ref(run, spec)
    optional = _optional_volumes(spec)
    trainer = _trainer_container(run, spec, extra_mounts=[mount for _, mount in optional])
    volumes: list[JSON] = [
        {"name": "config", "configMap": {"name": names.config_map_name(run_name)}},
        {"name": "gateway-key", "secret": {"secretName": secret_name}},
        *(volume for volume, _ in optional),
        {"name": "checkpoints", **_checkpoint_volume(spec)},
    ]
    labels = names.common_labels(run_name, names.COMPONENT_TRAINER)
    return {
        "metadata": {"labels": labels, "annotations": metrics_annotations(trainer_metrics_port(spec))},
        "spec": {
            # OnFailure restarts the trainer container in place; the gateway sidecar (and with it the
            # rollout store and the window) survives, and the trainer recovers from it.
            "restartPolicy": "OnFailure",
            "initContainers": [_gateway_sidecar(run, spec)],
            "containers": [trainer],
            "volumes": volumes,
        },
    }


def _gateway_sidecar(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> JSON:
    """The gateway as a native sidecar: starts first, keeps running, stops after the trainer."""
    port = spec.gateway.port
    _, secret_key = gateway_key_ref(run, spec)
    return {
        "name": "gateway",
        "image": spec.gateway.image,
        "restartPolicy": "Always",
        "command": ["asyncrl", "gateway"],
        "args": gateway_args(
            config=f"{CONFIG_DIR}/{RUN_FILE}", port=port, host="0.0.0.0", key_file=f"{KEY_DIR}/{secret_key}"
        ),
        "ports": [{"name": "gateway", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": paths.READYZ, "port": "gateway"}, "periodSeconds": 2},
        "resources": container_resources(spec.gateway.resources),
        "securityContext": dict(RESTRICTED_SECURITY_CONTEXT),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},  # the run, as the trainer reads it
            {"name": "gateway-key", "mountPath": KEY_DIR, "readOnly": True},
        ],
    }


def _trainer_container(
    run: Mapping[str, Any], spec: AsyncTrainingRunSpec, *, extra_mounts: list[JSON]
) -> JSON:
    """The trainer container, which talks to the gateway sidecar on the pod's loopback."""
    args = trainer_args(
        config=f"{CONFIG_DIR}/{RUN_FILE}",
        gateway_url=f"http://127.0.0.1:{spec.gateway.port}",
        checkpoint_dir=CHECKPOINT_DIR,
        metrics_port=trainer_metrics_port(spec),
    )
    if spec.data.config_map_ref is not None:
        args.append(f"--data-file={DATA_DIR}/rows")
    return {
        "name": TRAINER_CONTAINER,
        "image": spec.trainer.image,
        "command": ["asyncrl", "trainer"],
        "args": args,
        "ports": [{"name": "metrics", "containerPort": trainer_metrics_port(spec)}],
        "env": _trainer_env(run, spec),
        "resources": trainer_resources(spec),
        "securityContext": dict(RESTRICTED_SECURITY_CONTEXT),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "checkpoints", "mountPath": CHECKPOINT_DIR},
            *extra_mounts,
        ],
    }


def _trainer_env(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> list[JSON]:
    """The gateway key and the W&B settings (the API key only when the run names its Secret)."""
    secret_name, secret_key = gateway_key_ref(run, spec)
    env: list[JSON] = [
        {
            "name": KEY_ENV_VAR,
            "valueFrom": {"secretKeyRef": {"name": secret_name, "key": secret_key}},
        },
        {"name": "WANDB_MODE", "value": spec.logging.wandb.mode.wandb_mode},
    ]
    if spec.logging.wandb.api_key_secret_ref is not None:
        ref = spec.logging.wandb.api_key_secret_ref
        env.append(
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    return env


def _optional_volumes(spec: AsyncTrainingRunSpec) -> list[tuple[JSON, JSON]]:
    """The volumes only some runs have, each with the trainer container's mount of it."""
    optional: list[tuple[JSON, JSON]] = []
    if spec.trainer.backend is TrainerBackend.VERL:
        # Ray's object store, NCCL and vLLM's workers share memory through /dev/shm, which is 64 MiB in a
        # container unless a memory-backed volume replaces it.
        optional.append(
            ({"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "dshm", "mountPath": "/dev/shm"})
        )
    data_ref = spec.data.config_map_ref
    if data_ref is not None:  # the rows file, mounted for the trainer's --data-file
        volume = {
            "name": "data",
            "configMap": {"name": data_ref.name, "items": [{"key": data_ref.key, "path": "rows"}]},
        }
        optional.append((volume, {"name": "data", "mountPath": DATA_DIR, "readOnly": True}))
    return optional


def _checkpoint_volume(spec: AsyncTrainingRunSpec) -> JSON:
    """The run's checkpoint claim, else a volume that lives as long as the pod."""
    if spec.trainer.checkpoint.claim_name:
        return {"persistentVolumeClaim": {"claimName": spec.trainer.checkpoint.claim_name}}
    return {"emptyDir": {}}


def _trainer_job_around(run: Mapping[str, Any], spec: AsyncTrainingRunSpec, template: JSON) -> JSON:
    """The Job that runs the merged pod template, suspended when the run or a Kueue queue says so."""
    metadata = _metadata(run, names.trainer_job_name(run["metadata"]["name"]), names.COMPONENT_TRAINER)
    # The pod template's labels on the Job too (the operator's win): Kueue reads its queue label there.
    template_labels = (template.get("metadata") or {}).get("labels") or {}
    metadata["labels"] = {**template_labels, **metadata["labels"]}
    # A queued Job starts suspended, as Kueue expects, and Kueue resumes it on admission (not the run: no
    # suspended-by-run mark unless spec.suspend says so).
    queued = names.queue_of(template_labels) is not None
    job: JSON = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"suspend": spec.suspend or queued, "backoffLimit": 3, "template": template},
    }
    if spec.suspend:  # suspended by the run, so the run resumes it (see names.ANNOTATION_SUSPENDED_BY_RUN)
        job["metadata"]["annotations"] = {names.ANNOTATION_SUSPENDED_BY_RUN: "true"}
    return job


def gateway_service(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> JSON:
    run_name = run["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **_metadata(run, names.gateway_service_name(run_name), names.COMPONENT_GATEWAY),
            "annotations": metrics_annotations(trainer_metrics_port(spec)),
        },
        "spec": {
            "selector": names.common_labels(run_name, names.COMPONENT_TRAINER),
            "ports": [
                {"name": "gateway", "port": spec.gateway.port, "targetPort": "gateway"},
                {"name": "metrics", "port": trainer_metrics_port(spec), "targetPort": "metrics"},
            ],
        },
    }


def gateway_service_url(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> str:
    service = names.gateway_service_name(run["metadata"]["name"])
    return f"http://{service}.{run['metadata']['namespace']}.svc:{spec.gateway.port}"
