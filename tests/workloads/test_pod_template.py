"""spec.trainer.podTemplate merged into the trainer pod: what the user gets, what the operator keeps, says."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.api import InvalidRunError, load_run
from asyncrl.api.types.spec import RESTRICTED_SECURITY_CONTEXT, TrainerPodTemplate
from asyncrl.workloads import children, names
from asyncrl.workloads.pod_template import merge_pod_template
from tests.support.kube import run_manifest


def _job(**trainer: Any) -> tuple[dict[str, Any], str | None]:
    manifest = run_manifest("demo", trainer={"backend": "Reference", "gpus": 0, **trainer})
    manifest["metadata"].update(namespace="team", uid="uid-1")
    job, merged = children.trainer_job_with_template(manifest, load_run(manifest).spec)
    return job, merged.refused_message()


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def _container(job: dict[str, Any], name: str) -> dict[str, Any]:
    pod = _pod(job)
    return next(c for c in [*pod["containers"], *pod["initContainers"]] if c["name"] == name)


MODEL_ON_A_PVC = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"cost-center": "42"}},
    "nodeSelector": {"gpu": "h200"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    },
    "priorityClassName": "training",
    "serviceAccountName": "trainer",
    "securityContext": {"fsGroup": 10001},
    "volumes": [
        {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
        {"name": "hf-token", "secret": {"secretName": "hf-token"}},
    ],
    "trainerContainer": {
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
        "envFrom": [{"configMapRef": {"name": "proxy-settings"}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
        "securityContext": {"runAsUser": 10001},
    },
}


def test_every_field_of_the_template_reaches_the_trainer_pod() -> None:
    job, refused = _job(podTemplate=MODEL_ON_A_PVC)
    assert refused is None
    template, pod, trainer = job["spec"]["template"], _pod(job), _container(job, "trainer")
    assert template["metadata"]["labels"]["team"] == "rl"
    assert template["metadata"]["labels"][names.LABEL_RUN] == "demo"  # the Service still selects the pod
    assert (
        template["metadata"]["annotations"]["cost-center"] == "42"
    )  # beside the operator's prometheus.io ones
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "serviceAccountName"):
        assert pod[key] == MODEL_ON_A_PVC[key]
    assert pod["securityContext"] == {"fsGroup": 10001}
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod[
        "volumes"
    ]
    assert {"config", "gateway-key", "checkpoints", "models", "hf-token"} == {
        v["name"] for v in pod["volumes"]
    }
    assert trainer["env"][-1]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert trainer["envFrom"] == [{"configMapRef": {"name": "proxy-settings"}}]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in trainer["volumeMounts"]
    # The user's keys on top of the restricted default: what they did not set stays restricted.
    assert trainer["securityContext"] == {**RESTRICTED_SECURITY_CONTEXT, "runAsUser": 10001}
    gateway = _container(job, "gateway")
    assert "env" not in gateway or all(e["name"] != "HF_TOKEN" for e in gateway["env"])
    assert all(m["name"] != "models" for m in gateway["volumeMounts"])


def test_without_a_template_both_containers_are_restricted_and_the_gateway_has_requests() -> None:
    job, refused = _job()
    assert refused is None
    for name in ("trainer", "gateway"):
        assert _container(job, name)["securityContext"] == RESTRICTED_SECURITY_CONTEXT
    assert _container(job, "gateway")["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"}}
    assert "serviceAccountName" not in _pod(job)


def test_the_gateway_resources_replace_the_default_requests() -> None:
    manifest = run_manifest("demo", gateway={"resources": {"limits": {"cpu": 2, "memory": "1Gi"}}})
    manifest["metadata"].update(namespace="team", uid="uid-1")
    job = children.trainer_job(manifest, load_run(manifest).spec)
    assert _container(job, "gateway")["resources"] == {"limits": {"cpu": "2", "memory": "1Gi"}}


def test_fields_the_operator_owns_are_kept_and_each_refusal_is_named() -> None:
    job, refused = _job(
        podTemplate={
            "metadata": {"labels": {names.LABEL_RUN: "someone-else", names.LABEL_NAME: "asyncrl", "ok": "1"}},
            "volumes": [{"name": "config", "emptyDir": {}}, {"name": "mine", "emptyDir": {}}],
            "trainerContainer": {
                "env": [{"name": "WANDB_MODE", "value": "online"}, {"name": "MINE", "value": "1"}],
                "volumeMounts": [
                    {"name": "mine", "mountPath": children.CHECKPOINT_DIR},
                    {"name": "mine", "mountPath": "/mine"},
                ],
            },
        }
    )
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels[names.LABEL_RUN] == "demo"
    assert labels["ok"] == "1"
    pod, trainer = _pod(job), _container(job, "trainer")
    assert [v for v in pod["volumes"] if v["name"] == "config"] == [
        {"name": "config", "configMap": {"name": names.config_map_name("demo")}}
    ]
    assert {"name": "mine", "emptyDir": {}} in pod["volumes"]
    assert [e for e in trainer["env"] if e["name"] == "WANDB_MODE"] == [
        {"name": "WANDB_MODE", "value": "disabled"}
    ]
    assert {"name": "MINE", "value": "1"} in trainer["env"]
    mounts = [m for m in trainer["volumeMounts"] if m["mountPath"] == children.CHECKPOINT_DIR]
    assert mounts == [{"name": "checkpoints", "mountPath": children.CHECKPOINT_DIR}]
    assert {"name": "mine", "mountPath": "/mine"} in trainer["volumeMounts"]
    assert refused is not None
    assert "\n" not in refused
    # The same value as the operator's is no conflict; every real one is named, in the template's order.
    assert refused == (
        "spec.trainer.podTemplate: the operator keeps its own value of metadata.labels[asyncrl.dev/run], "
        "volumes[name=config], trainerContainer.env[name=WANDB_MODE], "
        f"trainerContainer.volumeMounts[mountPath={children.CHECKPOINT_DIR}] (fields it sets for the run); "
        "rename or remove them"
    )


def test_the_users_own_duplicates_are_left_for_the_api_server_to_name() -> None:
    job, refused = _job(
        podTemplate={"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}
    )
    assert refused is None
    assert [v["name"] for v in _pod(job)["volumes"]].count("a") == 2


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"volumes": [{"emptyDir": {}}]}, "spec.trainer.podTemplate.volumes[0].name"),
        ({"trainerContainer": {"volumeMounts": [{"name": "m"}]}}, "volumeMounts[0].mountPath"),
        ({"trainerContainer": {"env": [{"name": 5}]}}, "env[0].name"),
        ({"nodeSelectr": {"gpu": "h200"}}, "spec.trainer.podTemplate.nodeSelectr"),
        ({"nodeSelector": {"gpu": 1}}, "spec.trainer.podTemplate.nodeSelector.gpu"),
    ],
)
def test_entries_the_merge_cannot_key_are_refused_naming_the_field(
    template: dict[str, Any], field: str
) -> None:
    manifest = run_manifest("demo", trainer={"podTemplate": template})
    with pytest.raises(InvalidRunError) as raised:
        load_run(manifest)
    assert field in str(raised.value)


_names = st.sampled_from(["config", "checkpoints", "dshm", "data", "gateway-key", "models", "token", "x"])


@given(
    volumes=st.lists(_names, max_size=6),
    env=st.lists(st.sampled_from(["ASYNCRL_GATEWAY_KEY", "WANDB_MODE", "HF_TOKEN", "A"]), max_size=5),
)
def test_the_operator_always_keeps_its_own_entries_and_loses_none_of_the_users_others(
    volumes: list[str], env: list[str]
) -> None:
    manifest = run_manifest("demo", trainer={"backend": "Verl", "gpus": 1})
    manifest["metadata"].update(namespace="team", uid="uid-1")
    base = children.trainer_job(manifest, load_run(manifest).spec)["spec"]["template"]
    frozen = copy.deepcopy(base)
    user = TrainerPodTemplate.model_validate(
        {
            "volumes": [{"name": name, "emptyDir": {}} for name in volumes],
            "trainerContainer": {"env": [{"name": name, "value": "user"} for name in env]},
        }
    )
    merged = merge_pod_template(base, user, trainer_container="trainer")
    assert base == frozen  # pure: the operator's template is not modified
    owned_volumes = {v["name"] for v in base["spec"]["volumes"]}
    got = merged.template["spec"]["volumes"]
    assert [v for v in got if v["name"] in owned_volumes] == base["spec"]["volumes"]
    assert [v["name"] for v in got if v["name"] not in owned_volumes] == [
        n for n in volumes if n not in owned_volumes
    ]
    trainer_env = next(c for c in merged.template["spec"]["containers"] if c["name"] == "trainer")["env"]
    owned_env = {e["name"] for e in next(c for c in base["spec"]["containers"])["env"]}
    assert [e["name"] for e in trainer_env if e.get("value") == "user"] == [
        n for n in env if n not in owned_env
    ]
    expected_refusals = sum(n in owned_volumes for n in volumes) + sum(n in owned_env for n in env)
    assert len(merged.refused) == expected_refusals
