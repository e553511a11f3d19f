"""`asyncrl trainer --preflight`: what a GPU trainer pod needs, checked in seconds instead of found in hours.

The trainer also runs these checks first thing, so a pod that lacks a package, a GPU, CPUs for Ray's
bundles, shared memory, its model or a writable checkpoint folder fails at once with the fix, rather than
after minutes of loading (or never: verl's placement groups wait forever for CPUs they cannot get).

Each container is checked for what it holds. With one node the trainer container holds the GPUs and starts
Ray itself: every check. With `spec.trainer.nodes > 1` it is the Ray driver in the head pod, without GPUs;
it checks only what the driver uses, and the Ray nodes' containers, where verl's workers run, are checked
through Ray (preflight_cluster.py runs `node_checks` on each node).

Each check is a small function returning a `Check`; the probes that touch the machine (package versions,
CUDA, the GPU's memory, /dev/shm, cgroups) are parameters, so the checks are tested on CPU with fake probes.
Two checks read the run's files: whether the actor's resident state and vLLM's reservation fit the real GPU
when vLLM wakes (`memory_budget`), and whether the latest checkpoint was saved with this run's GPUs.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.api import AsyncTrainingRun
from asyncrl.api.types.spec import TrainerBackend
from asyncrl.trainer.backends.verl import memory_budget
from asyncrl.trainer.backends.verl.config import context_length_error, context_length_fix, served_context
from asyncrl.trainer.backends.verl.resources import (
    DEFAULT_STORAGE_UNITS,
    RayResourcesError,
    plan_ray_cpus,
)
from asyncrl.trainer.checkpoints import latest_checkpoint
from asyncrl.trainer.recovery import resume_decision, sharded_world_size

# The trainer image's GPU stack (trainer_image/constraints.txt; a test keeps the two equal).
GPU_STACK_PINS: Mapping[str, str] = {
    "torch": "2.11.0",
    "vllm": "0.24.0",
    "verl": "0.9.1",
    "transformers": "5.9.0",
    "ray": "2.60.0",
    "TransferQueue": "0.1.11",
    "tensordict": "0.10.0",
}
REFERENCE_PACKAGES = ("torch", "transformers")
# NCCL and vLLM's workers exchange through /dev/shm; a container's default (64 MiB) breaks them. A floor,
# not a measured need: 1 GiB per GPU.
SHM_BYTES_PER_GPU = 1 << 30
STORAGE_UNITS_KEY = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # A failure a restart may cure (the Ray cluster is still forming), not a setting to change.
    transient: bool = False

    def line(self) -> str:
        text = f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}; fix: {self.fix}"


@dataclass(frozen=True)
class Probes:
    """What the checks read from the machine; replaced in tests."""

    version: Callable[[str], str | None]
    cuda: Callable[[], tuple[bool, int, str]]  # (available, devices visible, driver/runtime description)
    shm_bytes: Callable[[], int | None]
    cgroup_root: Path = Path("/sys/fs/cgroup")
    node_cpus: int | None = None
    # The smallest visible GPU's memory in bytes; None: unknown (no CUDA), the memory check is skipped.
    gpu_memory_bytes: Callable[[], int | None] = lambda: None


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_state() -> tuple[bool, int, str]:
    try:
        import torch
    except ImportError:
        return False, 0, "torch is not installed"
    if not torch.cuda.is_available():
        return False, 0, f"torch {torch.__version__} sees no CUDA device"
    return True, torch.cuda.device_count(), f"CUDA {torch.version.cuda}, torch {torch.__version__}"


def shm_size() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").total
    except OSError:
        return None


def gpu_memory() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    devices = range(torch.cuda.device_count())
    return min(int(torch.cuda.get_device_properties(index).total_memory) for index in devices)


MACHINE = Probes(version=installed_version, cuda=cuda_state, shm_bytes=shm_size, gpu_memory_bytes=gpu_memory)


def check_packages(backend: TrainerBackend, probes: Probes) -> Check:
    if backend is TrainerBackend.REFERENCE:
        missing = [name for name in REFERENCE_PACKAGES if probes.version(name) is None]
        if missing:
            return Check("packages", False, f"missing {', '.join(missing)}", "pip install 'asyncrl[trainer]'")
        return Check("packages", True, ", ".join(f"{n} {probes.version(n)}" for n in REFERENCE_PACKAGES))
    found = {name: probes.version(name) for name in GPU_STACK_PINS}
    wrong = [
        f"{name} {found[name] or 'missing'} (needs {pin})"
        for name, pin in GPU_STACK_PINS.items()
        if found[name] != pin
    ]
    if wrong:
        return Check(
            "packages",
            False,
            "; ".join(wrong),
            "use the trainer image, or pip install '.[trainer,gpu]' "
            "--constraint trainer_image/constraints.txt",
        )
    return Check("packages", True, ", ".join(f"{name} {version}" for name, version in found.items()))


def check_cuda(gpus: int, probes: Probes, *, field: str = "spec.trainer.gpus") -> list[Check]:
    """`field`: the spec field that gives this container its GPUs (gpusPerNode on a Ray node)."""
    available, visible, description = probes.cuda()
    if not available:
        fix = f"run on a GPU node with the NVIDIA driver (the pod asks for {field} nvidia.com/gpu)"
        return [Check("cuda", False, description, fix)]
    checks = [Check("cuda", True, description)]
    if visible < gpus:
        checks.append(
            Check(
                "gpus",
                False,
                f"{visible} visible, {field} is {gpus}",
                f"set {field} to the GPUs the pod gets, or check CUDA_VISIBLE_DEVICES",
            )
        )
    else:
        checks.append(Check("gpus", True, f"{visible} visible, {field} is {gpus}"))
    return checks


def check_ray_cpus(gpus: int, storage_units: int, probes: Probes) -> Check:
    try:
        plan = plan_ray_cpus(
            gpus=gpus, storage_units=storage_units, cgroup_root=probes.cgroup_root, node_cpus=probes.node_cpus
        )
    except RayResourcesError as error:
        return Check("ray cpus", False, error.detail, error.fix)
    return Check("ray cpus", True, plan.describe())


def check_shm(gpus: int, probes: Probes) -> Check:
    size = probes.shm_bytes()
    needed = SHM_BYTES_PER_GPU * max(gpus, 1)
    if size is None:
        return Check("/dev/shm", False, "not mounted", "mount an emptyDir with medium: Memory at /dev/shm")
    detail = f"{size / 2**30:.1f} GiB (at least {needed / 2**30:.0f} GiB for {gpus} GPU(s))"
    if size < needed:
        return Check("/dev/shm", False, detail, "mount a larger emptyDir with medium: Memory at /dev/shm")
    return Check("/dev/shm", True, detail)


def check_model_path(path: str) -> Check:
    local = path.startswith(("/", "./", "../", "~"))
    if not local:
        return Check("model", True, f"{path!r} is not a local path: verl fetches it from the Hub")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        return Check(
            "model",
            False,
            f"{directory} has no config.json",
            "mount the model's Hugging Face directory there, or fix spec.model.path",
        )
    return Check("model", True, f"{directory}")


def check_context_length(run: AsyncTrainingRun) -> Check:
    """The run's vLLM context fits the model's positions (read from its local config.json)."""
    config_file = Path(run.spec.model.path).expanduser() / "config.json"
    try:
        model_config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return Check("context length", True, f"not checked: {config_file} is not readable here")
    error = context_length_error(model_config, run)
    if error is not None:
        return Check("context length", False, error, context_length_fix(model_config))
    return Check("context length", True, f"{served_context(run)} tokens (vLLM's max_model_len)")


def check_checkpoint_dir(directory: Path | None) -> Check:
    if directory is None:
        return Check("checkpoints", True, "no --checkpoint-dir: none are saved")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".preflight-{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as error:
        return Check(
            "checkpoints",
            False,
            f"cannot write in {directory}: {error.strerror}",
            "mount a writable volume there (spec.trainer.checkpoint.claimName) owned by the pod's user",
        )
    return Check("checkpoints", True, f"{directory} is writable")


def memory_check(
    model_config: dict[str, Any],
    settings: memory_budget.MemorySettings,
    *,
    gpu_bytes: int,
    world_size: int,
) -> Check:
    """The pure decision: refused, with the figures and the fixes, when the estimate does not fit."""
    try:
        shape = memory_budget.model_shape(model_config)
    except memory_budget.UnsupportedModel as error:
        return Check("gpu memory", True, f"not estimated: {error}")
    found = memory_budget.estimate(shape, settings, gpu_bytes=gpu_bytes, world_size=world_size)
    verdict = found.verdict
    detail = f"{verdict}: {found.breakdown()}"
    if verdict is not memory_budget.Verdict.REFUSE:
        return Check("gpu memory", True, detail)
    fixes = memory_budget.fixes(shape, settings, gpu_bytes=gpu_bytes, world_size=world_size)
    return Check("gpu memory", False, detail, "; ".join(fixes))


def check_gpu_memory(run: AsyncTrainingRun, probes: Probes) -> Check:
    """The estimate against the real GPU, when the model's config.json is a local file."""
    gpu_bytes = probes.gpu_memory_bytes()
    config_file = Path(run.spec.model.path).expanduser() / "config.json"
    if gpu_bytes is None:
        return Check("gpu memory", True, "not estimated: the GPU's memory is unknown here")
    try:
        model_config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return Check("gpu memory", True, f"not estimated: {config_file} is not readable here")
    world_size = sharded_world_size(run.spec) or 1
    settings = memory_budget.memory_settings(run)
    return memory_check(model_config, settings, gpu_bytes=gpu_bytes, world_size=world_size)


def check_checkpoint_resume(directory: Path | None, *, world_size: int | None) -> Check:
    """The latest checkpoint, if any, was saved with this run's GPUs (its FSDP shards are per rank)."""
    found = latest_checkpoint(directory) if directory is not None else None
    if found is None:
        return Check("checkpoint resume", True, "no checkpoint to resume")
    path, state = found
    decision = resume_decision(checkpoint=str(path), saved_world_size=state.world_size, world_size=world_size)
    return Check("checkpoint resume", not decision.refused, decision.detail, decision.fix)


def run_checks(
    run: AsyncTrainingRun,
    *,
    checkpoint_dir: Path | None,
    probes: Probes = MACHINE,
    storage_units: int = DEFAULT_STORAGE_UNITS,
) -> list[Check]:
    """The checks of the container `asyncrl trainer` runs in, for what that container holds.

    One node: the trainer container holds the GPUs and starts Ray sized to its cgroup, so everything. More
    nodes: it is the Ray driver, without GPUs, and Ray's CPUs are the nodes' (preflight_cluster.py); the
    driver itself needs the packages (verl loads vLLM's replica class in the driver), the model (verl reads
    its tokenizer there) and the checkpoint folder.
    """
    spec = run.spec
    backend = spec.trainer.backend
    checks = [check_packages(backend, probes)]
    if backend is TrainerBackend.VERL and spec.trainer.nodes == 1:
        gpus = spec.trainer.gpus
        checks += check_cuda(gpus, probes)
        checks.append(check_ray_cpus(gpus, storage_units, probes))
        checks.append(check_shm(gpus, probes))
        checks.append(check_gpu_memory(run, probes))
    if backend is TrainerBackend.VERL:
        checks.append(check_model_path(spec.model.path))
        checks.append(check_context_length(run))
    checks.append(check_checkpoint_dir(checkpoint_dir))
    if backend is TrainerBackend.VERL:  # the Reference backend's files do not depend on the GPUs
        checks.append(check_checkpoint_resume(checkpoint_dir, world_size=sharded_world_size(spec)))
    return checks


def node_checks(
    *, gpus: int, model_path: str, checkpoint_dir: Path | None, probes: Probes = MACHINE
) -> list[Check]:
    """What a Ray node's container must hold for verl's workers there; run on each node by a Ray task that
    holds the node's GPUs (preflight_ray.py)."""
    return [
        *check_cuda(gpus, probes, field="spec.trainer.gpusPerNode"),
        check_shm(gpus, probes),
        check_model_path(model_path),
        check_checkpoint_dir(checkpoint_dir),
    ]


def failures(checks: list[Check]) -> list[Check]:
    return [check for check in checks if not check.ok]


def report(checks: list[Check]) -> str:
    return "\n".join(check.line() for check in checks)


def storage_units_from(run: AsyncTrainingRun) -> int:
    """TransferQueue's storage units the run asks for (verlOverrides), else verl's default."""
    from asyncrl.api.types.verl_overrides import flatten_overrides

    overrides = flatten_overrides(run.spec.trainer.verl_overrides or {})
    value = overrides.get(STORAGE_UNITS_KEY, DEFAULT_STORAGE_UNITS)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_STORAGE_UNITS
