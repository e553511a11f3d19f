"""The run's child objects as manifests: the trainer pod's layout and what each part gets."""

from __future__ import annotations

from typing import Any

from asyncrl.api import load_run
from asyncrl.workloads import children
from tests.support.kube import run_manifest


def _run(**spec: Any) -> tuple[dict[str, Any], Any]:
    manifest = run_manifest("demo", **spec)
    manifest["metadata"].update(namespace="team", uid="uid-1")
    return manifest, load_run(manifest).spec


def test_the_gateway_is_a_native_sidecar_and_the_trainer_holds_the_gpus() -> None:
    run, spec = _run(trainer={"backend": "Reference", "gpus": 2})
    pod = children.trainer_job(run, spec)["spec"]["template"]["spec"]
    (gateway,) = pod["initContainers"]
    (trainer,) = pod["containers"]
    assert gateway["restartPolicy"] == "Always"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Strings: the Kubernetes client (37+) refuses an integer quantity before sending the Job.
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert trainer["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in gateway.get("resources", {}).get("limits", {})
    assert (
        pod["restartPolicy"] == "OnFailure"
    )  # a trainer crash restarts in place; the gateway keeps the window
    port = spec.gateway.port
    assert not [arg for arg in gateway["args"] if arg.startswith("--upstream")]  # the trainer registers
    assert f"--gateway-url=http://127.0.0.1:{port}" in trainer["args"]


def test_a_verl_trainer_pod_gets_a_memory_backed_dev_shm() -> None:
    run, spec = _run(trainer={"backend": "Verl", "gpus": 1})
    pod = children.trainer_job(run, spec)["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]  # Ray, NCCL, vLLM
    assert {"name": "dshm", "mountPath": "/dev/shm"} in trainer["volumeMounts"]


def test_rows_from_a_configmap_are_mounted_and_passed_to_the_trainer() -> None:
    run, spec = _run(data={"configMapRef": {"name": "prompts", "key": "rows.jsonl"}})
    pod = children.trainer_job(run, spec)["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    volume = next(v for v in pod["volumes"] if v["name"] == "data")
    assert volume["configMap"] == {"name": "prompts", "items": [{"key": "rows.jsonl", "path": "rows"}]}
    assert f"--data-file={children.DATA_DIR}/rows" in trainer["args"]
    assert {"name": "data", "mountPath": children.DATA_DIR, "readOnly": True} in trainer["volumeMounts"]


def test_every_child_is_owned_by_the_run() -> None:
    run, spec = _run()
    for child in (
        children.gateway_key_secret(run),
        children.config_map(run, "template"),
        children.trainer_job(run, spec),
        children.gateway_service(run, spec),
    ):
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("AsyncTrainingRun", "uid-1", True)
        assert child["metadata"]["namespace"] == "team"


def test_the_trainer_serves_prometheus_metrics_and_the_service_and_pod_say_where() -> None:
    run, spec = _run()
    job = children.trainer_job(run, spec)
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=9400" in trainer["args"]
    assert {"name": "metrics", "containerPort": 9400} in trainer["ports"]
    service = children.gateway_service(run, spec)
    assert {"name": "metrics", "port": 9400, "targetPort": "metrics"} in service["spec"]["ports"]
    for annotated in (job["spec"]["template"]["metadata"], service["metadata"]):
        assert annotated["annotations"]["prometheus.io/scrape"] == "true"
        assert annotated["annotations"]["prometheus.io/port"] == "9400"


def test_a_gateway_on_the_metrics_port_moves_the_trainer_metrics_aside() -> None:
    run, spec = _run(gateway={"port": 9400})
    (trainer,) = children.trainer_job(run, spec)["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=9401" in trainer["args"]
    ports = [port["port"] for port in children.gateway_service(run, spec)["spec"]["ports"]]
    assert ports == [9400, 9401]
