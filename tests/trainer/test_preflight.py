"""`asyncrl trainer --preflight` and Ray's CPU sizing: each check's verdict on fake probes, and the real CLI.

The probes (package versions, CUDA, /dev/shm, the cgroup files) are replaced so that every failure can be
produced on this CPU machine; the CLI test runs the real command on a reference run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.api import load_run
from asyncrl.trainer.backends.verl.resources import RayResourcesError, cgroup_cpu_limit, plan_ray_cpus
from asyncrl.trainer.preflight import GPU_STACK_PINS, Probes, failures, node_checks, run_checks
from tests.support.kube import run_manifest
from tests.trainer.backends.verl_support import verl_manifest

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def cgroup(tmp_path: Path, cpu_max: str | None) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    if cpu_max is not None:
        (root / "cpu.max").write_text(cpu_max + "\n")
    return root


def good_probes(tmp_path: Path, **changes: object) -> Probes:
    values: dict[str, object] = {
        "version": GPU_STACK_PINS.get,
        "cuda": lambda: (True, 2, "CUDA 13.0, torch 2.11.0"),
        "shm_bytes": lambda: 16 * GiB,
        "cgroup_root": cgroup(tmp_path, "1600000 100000"),  # 16 CPUs
        "node_cpus": 64,
    }
    values.update(changes)
    return Probes(**values)  # type: ignore[arg-type]


def model_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return directory


def verl_run(tmp_path: Path, **trainer: object):  # type: ignore[no-untyped-def]
    manifest = verl_manifest(trainer=dict(trainer))
    manifest["spec"]["model"]["path"] = str(model_dir(tmp_path))
    return load_run(manifest)


def failed(checks: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {check.name: check.line() for check in failures(checks)}


def test_a_pod_with_everything_passes_every_check(tmp_path: Path) -> None:
    checks = run_checks(verl_run(tmp_path), checkpoint_dir=tmp_path / "ckpt", probes=good_probes(tmp_path))
    assert [check.name for check in checks] == [
        "packages",
        "cuda",
        "gpus",
        "ray cpus",
        "/dev/shm",
        "gpu memory",
        "model",
        "context length",
        "checkpoints",
        "checkpoint resume",
    ]
    assert failures(checks) == []
    assert "12 CPUs needed, 16 available (the pod's CPU limit 16)" in checks[3].line()


@pytest.mark.parametrize(
    ("change", "name", "words"),
    [
        ({"version": {**GPU_STACK_PINS, "vllm": None}.get}, "packages", "vllm missing (needs 0.24.0)"),
        ({"version": {**GPU_STACK_PINS, "ray": "2.49.0"}.get}, "packages", "ray 2.49.0 (needs 2.60.0)"),
        ({"cuda": lambda: (False, 0, "torch 2.11.0 sees no CUDA device")}, "cuda", "no CUDA device"),
        ({"cuda": lambda: (True, 1, "CUDA 13.0")}, "gpus", "1 visible, spec.trainer.gpus is 2"),
        ({"shm_bytes": lambda: 64 << 20}, "/dev/shm", "0.1 GiB (at least 2 GiB for 2 GPU(s))"),
        ({"node_cpus": 8, "cgroup_root": Path("/nonexistent")}, "ray cpus", "15 CPUs needed, 8 available"),
    ],
)
def test_each_failure_names_the_numbers_and_the_fix(
    tmp_path: Path, change: dict[str, object], name: str, words: str
) -> None:
    run = verl_run(tmp_path, gpus=2)
    checks = run_checks(run, checkpoint_dir=None, probes=good_probes(tmp_path, **change))
    problems = failed(checks)
    assert list(problems) == [name]
    assert words in problems[name]
    assert "fix: " in problems[name]


def test_a_missing_model_and_an_unwritable_checkpoint_folder_fail(tmp_path: Path) -> None:
    manifest = verl_manifest()
    manifest["spec"]["model"]["path"] = str(tmp_path / "absent")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    checks = run_checks(
        load_run(manifest), checkpoint_dir=not_a_folder / "ckpt", probes=good_probes(tmp_path)
    )
    problems = failed(checks)
    assert "absent has no config.json" in problems["model"]
    assert "cannot write in" in problems["checkpoints"]


def test_ray_is_sized_by_the_cgroup_limit_and_refuses_with_the_numbers(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(cgroup(tmp_path, "max 100000")) is None
    assert cgroup_cpu_limit(tmp_path / "nothing") is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("650000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(v1) == 6.5
    plan = plan_ray_cpus(gpus=1, storage_units=2, cgroup_root=v1, node_cpus=64)
    assert (plan.needed, plan.available) == (6, 6)  # Ray gets the pod's 6, not the node's 64
    with pytest.raises(RayResourcesError, match=r"12 CPUs needed, 6 available \(the pod's CPU limit 6.5\)"):
        plan_ray_cpus(gpus=1, storage_units=8, cgroup_root=v1, node_cpus=64)
    unlimited = plan_ray_cpus(gpus=1, storage_units=8, cgroup_root=tmp_path / "nothing", node_cpus=12)
    assert unlimited.available == 12


def test_the_pins_are_the_trainer_images_constraints() -> None:
    lines = (REPO / "trainer_image" / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))
    assert {name: pins.get(name) for name in GPU_STACK_PINS} == dict(GPU_STACK_PINS)


def test_the_cli_prints_one_line_per_check_and_fails_with_the_fix(tmp_path: Path) -> None:
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(run_manifest("pre")))  # the reference backend: CPU checks only
    command = [sys.executable, "-m", "asyncrl.cli", "trainer", "--preflight", f"--config={run_file}"]
    good = subprocess.run([*command, f"--checkpoint-dir={tmp_path / 'ckpt'}"], capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr
    assert [line.split()[0] for line in good.stdout.splitlines()] == ["ok", "ok"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = subprocess.run([*command, f"--checkpoint-dir={blocked / 'ckpt'}"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "FAIL  checkpoints: cannot write in" in bad.stdout
    assert "fix: mount a writable volume" in bad.stdout


def test_the_cli_refuses_a_gpu_run_verl_would_fail_at_its_first_update(tmp_path: Path) -> None:
    """6 rows per update over 4 GPUs: verl's train_mini_batch asserts on it (see test_verl_layout.py)."""
    manifest = run_manifest("pre", trainBatchSize=2, rollout={"samplesPerPrompt": 3})
    manifest["spec"]["trainer"] = {"backend": "Verl", "gpus": 4}
    manifest["spec"]["async"] = {"enabled": True, "windowSize": 4}
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(manifest))
    command = [sys.executable, "-m", "asyncrl.cli", "trainer", "--preflight", f"--config={run_file}"]
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "spec.trainBatchSize: verl trains on trainBatchSize x rollout.samplesPerPrompt = 2 x 3" in output
    assert "set spec.trainBatchSize to 4, or spec.rollout.samplesPerPrompt to 4 or 2" in output


def test_a_multi_node_runs_driver_checks_what_the_driver_uses_and_not_cuda_ray_cpus_or_shm(
    tmp_path: Path,
) -> None:
    """The driver container of a nodes: 2 run has no GPU, no CPU limit sized for Ray and a small /dev/shm
    (fake probes: this machine has no GPU either); none of that is its to hold, so it passes. The same
    container for a one-node run fails on each."""
    gpu_less_driver = good_probes(
        tmp_path,
        cuda=lambda: (False, 0, "torch 2.11.0 sees no CUDA device"),
        shm_bytes=lambda: 64 << 20,
        node_cpus=2,
        cgroup_root=tmp_path / "no-limit",
    )
    multi = verl_run(tmp_path, nodes=2, gpusPerNode=1, checkpoint={"claimName": "shared"})
    checks = run_checks(multi, checkpoint_dir=tmp_path / "ckpt", probes=gpu_less_driver)
    assert [check.name for check in checks] == [
        "packages",
        "model",
        "context length",
        "checkpoints",
        "checkpoint resume",
    ]
    assert failures(checks) == []

    (tmp_path / "single").mkdir()
    single = verl_run(tmp_path / "single", gpus=1)
    problems = failed(run_checks(single, checkpoint_dir=tmp_path / "ckpt", probes=gpu_less_driver))
    assert list(problems) == ["cuda", "ray cpus", "/dev/shm"]


def test_a_multi_node_drivers_packages_model_and_checkpoints_still_fail_with_the_fix(tmp_path: Path) -> None:
    manifest = verl_manifest(trainer={"nodes": 2, "gpusPerNode": 1, "checkpoint": {"claimName": "shared"}})
    manifest["spec"]["model"]["path"] = str(tmp_path / "absent")
    blocked = tmp_path / "file"
    blocked.write_text("")
    probes = good_probes(tmp_path, version={**GPU_STACK_PINS, "vllm": None}.get)
    problems = failed(run_checks(load_run(manifest), checkpoint_dir=blocked / "ckpt", probes=probes))
    assert list(problems) == ["packages", "model", "checkpoints"]
    assert "vllm missing" in problems["packages"]  # the driver loads vLLM's replica class (verl's replica.py)


def test_a_ray_nodes_container_is_checked_for_its_gpus_per_node(tmp_path: Path) -> None:
    """What the task on each Ray node runs there (fake probes: a node with one GPU of the two asked)."""
    probes = good_probes(tmp_path, cuda=lambda: (True, 1, "CUDA 13.0"), shm_bytes=lambda: 1 * GiB)
    checks = node_checks(
        gpus=2, model_path=str(model_dir(tmp_path)), checkpoint_dir=tmp_path / "ckpt", probes=probes
    )
    assert [check.name for check in checks] == ["cuda", "gpus", "/dev/shm", "model", "checkpoints"]
    problems = failed(checks)
    assert list(problems) == ["gpus", "/dev/shm"]
    assert "1 visible, spec.trainer.gpusPerNode is 2" in problems["gpus"]
    assert "fix: set spec.trainer.gpusPerNode to the GPUs the pod gets" in problems["gpus"]
