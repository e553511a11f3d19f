"""A verl platform for CPU, for the tests that run verl's own trainer on this machine (tests/verl_cpu/).

verl 0.9.1 resolves its device through a platform registry (verl/plugin/platform/) and ships CUDA, ROCm and
NPU, not CPU. This module registers `cpu`; a process selects it with `VERL_PLATFORM=cpu` and loads it with
`VERL_USE_EXTERNAL_MODULES=asyncrl.testing.verl_cpu_platform` (verl/__init__.py:49 imports it), so every Ray
worker verl starts loads it the same way. No verl source is changed.

- Devices are CPU tensors; the Ray resource keeps verl's name "GPU", so that verl's resource pools, which
  count GPUs, are placed on a Ray started with `num_gpus=N` on a CPU-only machine.
- Collectives are gloo. verl joins the device's backend to gloo's (`cpu:gloo,{device}:{backend}`,
  verl/utils/distributed.py:91), which torch refuses for the CPU device ("Duplicate device type cpu"), so
  `init_process_group` is wrapped here to take that string as plain gloo (only in the processes that load
  this module, with VERL_PLATFORM=cpu).
- No CUDA IPC: verl's weight sender then moves the buckets through shared memory.
- In vLLM's worker processes (which import verl for its worker extension), vLLM's oneDNN linear kernel is
  turned off: it repacks each weight after loading and replaces the parameter with an empty one
  (vllm/model_executor/layers/utils.py, `dispatch_cpu_unquantized_gemm(remove_weight=True)`), so verl's
  weight sync then fails with "'Parameter' object has no attribute 'weight_loader'". Without it vLLM keeps
  the weight and computes with torch's linear (the sgl kernel, the other repacking path, takes bfloat16
  and int8 only, on AMX machines: `check_cpu_sgl_kernel`; this run serves float32). Setting
  `VLLM_CPU_SGL_KERNEL=0` alone would not help here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"
GLOO_ON_CPU_TWICE = "cpu:gloo,cpu:gloo"


def _no_op(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _host_memory(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


# What verl calls on `get_torch_device()`: torch.cpu's functions, and no-ops for the CUDA-only memory API.
CPU_DEVICE_MODULE = SimpleNamespace(
    **{name: getattr(torch.cpu, name) for name in dir(torch.cpu) if not name.startswith("_")},
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_device_name=lambda *_args: "CPU",  # verl's flops counter (verl/utils/flops_counter.py:80)
    empty_cache=_no_op,
    ipc_collect=_no_op,
    set_per_process_memory_fraction=_no_op,
    reset_peak_memory_stats=_no_op,
    memory_allocated=_zero,
    max_memory_allocated=_zero,
    memory_reserved=_zero,
    max_memory_reserved=_zero,
    mem_get_info=_host_memory,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
)


class CpuDeviceId(str):
    """What `current_device()` returns: verl passes it to torch as a device (`model.to(get_device_id())`,
    verl/utils/fsdp_utils.py:507), where the int 0 would mean cuda:0, and also formats it after the device
    name (`f"{get_device_name()}:{get_device_id()}"`, bucketed_weight_transfer.py:183), where it must be an
    index. So it is the string "cpu" to torch and "0" in a format string."""

    def __format__(self, spec: str) -> str:
        return format(0, spec)


CPU_DEVICE_ID = CpuDeviceId("cpu")


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl on CPU tensors with gloo, placed by Ray as if each rank had a GPU."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return CPU_DEVICE_ID

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _gloo_once(init_process_group: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init_process_group)
    def init(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == GLOO_ON_CPU_TWICE:
            kwargs["backend"] = "gloo"
        return init_process_group(*args, **kwargs)

    init.asyncrl_gloo_once = True  # type: ignore[attr-defined]
    return init


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME and not getattr(
    torch.distributed.init_process_group, "asyncrl_gloo_once", False
):
    torch.distributed.init_process_group = _gloo_once(torch.distributed.init_process_group)

if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME and "vllm" in sys.modules:
    setattr(importlib.import_module("vllm._custom_ops"), "_supports_onednn", False)  # noqa: B010
