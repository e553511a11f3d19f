"""Does the actor's resident state plus vLLM's reservation fit one GPU when vLLM wakes? A pure estimate.

The trainer and vLLM share each GPU. vLLM sleeps during the update and wakes for rollouts; on waking it maps
back `gpu_memory_utilization` x the GPU's memory (its weights and KV cache). What the trainer keeps on the GPU
meanwhile (verl 0.9.1, `engine_workers.update_weights` and the FSDP engine's train-mode context):
- the actor's FSDP parameters in `fsdp_config.model_dtype` (fp32 by default), sharded over the FSDP group
  (the world size, or `fsdp_size`), unless `param_offload` moves them to CPU before vLLM wakes;
- AdamW's two moments in the same dtype, sharded alike, unless `optimizer_offload`;
- no gradients: the train-mode context zeroes them (set to None) when the update ends;
- the reference policy's parameters when a KL term needs it (`use_kl_loss`, `use_kl_in_reward`).
During the update vLLM is asleep and the train-mode context loads everything offloaded back, so weights,
gradients and optimizer are all on the GPU then (activations, which depend on the token budget, are not
counted). `offload_policy` (FSDP2's CPU offload) keeps all three on CPU in both phases.

`model_shape` reads a dense decoder's config.json (Llama, Qwen2, Qwen3, Mistral...); `memory_settings` reads
the run's verlOverrides over verl's defaults; `estimate` is arithmetic. `asyncrl validate` and the trainer's
preflight both use it, with a default GPU and the real one respectively.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.api import AsyncTrainingRun
from asyncrl.api.types.verl_overrides import flatten_overrides

GIB = 1 << 30
# The GPU assumed when none is known (`asyncrl validate`): an H100 SXM, 80 GiB.
DEFAULT_GPU_BYTES = 80 * GIB
# The node label NVIDIA's GPU feature discovery sets (MiB); a nodeSelector naming it says the GPU's memory.
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
# The trainer process's CUDA context, NCCL buffers and allocator slack: a rough floor, not a measurement.
RUNTIME_OVERHEAD_BYTES = 1 * GIB
# Less free memory than this share of the GPU at wake is a warning: fragmentation and activations left over
# from the update can take that much.
TIGHT_HEADROOM = 0.10
MAX_SUGGESTED_GPUS = 256

DTYPE_BYTES: Mapping[str, int] = {
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
}
ADAM_MOMENTS = 2  # AdamW's exp_avg and exp_avg_sq, in the parameters' dtype

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
PARAM_OFFLOAD_KEY = f"{ACTOR}.fsdp_config.param_offload"
OPTIMIZER_OFFLOAD_KEY = f"{ACTOR}.fsdp_config.optimizer_offload"
UTILIZATION_KEY = f"{ROLLOUT}.gpu_memory_utilization"
# verl 0.9.1's defaults (trainer/config/_generated_ppo_trainer.yaml); tensor parallelism is asyncrl's default.
VERL_DEFAULTS: Mapping[str, Any] = {
    PARAM_OFFLOAD_KEY: False,
    OPTIMIZER_OFFLOAD_KEY: False,
    f"{ACTOR}.fsdp_config.offload_policy": False,
    f"{ACTOR}.fsdp_config.model_dtype": "fp32",
    f"{ACTOR}.fsdp_config.fsdp_size": -1,
    f"{ACTOR}.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
    f"{REF}.fsdp_config.param_offload": False,
    f"{REF}.fsdp_config.model_dtype": "fp32",
    UTILIZATION_KEY: 0.5,
    f"{ROLLOUT}.dtype": "bfloat16",
    f"{ROLLOUT}.tensor_model_parallel_size": 1,
}


class UnsupportedModel(ValueError):
    """A config.json this estimate cannot count (not a dense decoder, a field missing)."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes of a dense decoder-only transformer with a gated (SwiGLU) MLP, as in its config.json."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    attention_bias: bool  # biases on q, k and v (Qwen2 has them, Llama does not)
    qk_norm: bool  # a norm of head_dim on q and on k (Qwen3)

    @property
    def parameter_count(self) -> int:
        hidden, heads, kv_heads, head = (
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
        )
        attention = hidden * heads * head + 2 * hidden * kv_heads * head + heads * head * hidden
        if self.attention_bias:
            attention += heads * head + 2 * kv_heads * head
        if self.qk_norm:
            attention += 2 * head
        mlp = 3 * hidden * self.intermediate_size
        layer = attention + mlp + 2 * hidden  # two RMSNorms
        embeddings = self.vocab_size * hidden * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + hidden  # the final norm


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """The shape of a Hugging Face config.json (its `text_config` for a model that nests one)."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in config:
        config = text
    moe = [key for key in ("num_experts", "num_local_experts", "n_routed_experts") if config.get(key)]
    if moe:
        raise UnsupportedModel(
            f"a mixture-of-experts model ({moe[0]}: {config[moe[0]]}); only dense decoders"
        )
    required = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads")
    missing = [key for key in required if not isinstance(config.get(key), int)]
    if missing:
        raise UnsupportedModel(f"config.json has no integer {', '.join(missing)}")
    heads = config["num_attention_heads"]
    model_type = str(config.get("model_type", ""))
    head_dim = config.get("head_dim")
    return ModelShape(
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim) if isinstance(head_dim, int) else config["hidden_size"] // heads,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", model_type in ("qwen2", "qwen2_vl"))),
        qk_norm=model_type.startswith("qwen3"),
    )


@dataclass(frozen=True, kw_only=True)
class MemorySettings:
    """The verl settings that decide what sits on a GPU (verl's defaults unless verlOverrides sets them)."""

    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    model_dtype_bytes: int = 4
    fsdp_size: int = -1  # -1: shard over the whole world
    uses_reference: bool = False
    reference_param_offload: bool = False
    reference_dtype_bytes: int = 4
    gpu_memory_utilization: float = 0.5
    rollout_dtype_bytes: int = 2
    rollout_tensor_parallel: int = 1

    def shards(self, world_size: int) -> int:
        """The ranks one FSDP group shards the parameters over."""
        return world_size if self.fsdp_size <= 0 or self.fsdp_size > world_size else self.fsdp_size


def memory_settings(run: AsyncTrainingRun) -> MemorySettings:
    """The run's settings: its verlOverrides (nested or dotted) over verl's defaults."""
    values = {**VERL_DEFAULTS, **flatten_overrides(run.spec.trainer.verl_overrides or {})}
    return MemorySettings(
        param_offload=bool(values[PARAM_OFFLOAD_KEY]),
        optimizer_offload=bool(values[OPTIMIZER_OFFLOAD_KEY]),
        offload_policy=bool(values[f"{ACTOR}.fsdp_config.offload_policy"]),
        model_dtype_bytes=_dtype_bytes(values[f"{ACTOR}.fsdp_config.model_dtype"]),
        fsdp_size=int(values[f"{ACTOR}.fsdp_config.fsdp_size"]),
        uses_reference=bool(values[f"{ACTOR}.use_kl_loss"] or values["algorithm.use_kl_in_reward"]),
        reference_param_offload=bool(values[f"{REF}.fsdp_config.param_offload"]),
        reference_dtype_bytes=_dtype_bytes(values[f"{REF}.fsdp_config.model_dtype"]),
        gpu_memory_utilization=float(values[UTILIZATION_KEY]),
        rollout_dtype_bytes=_dtype_bytes(values[f"{ROLLOUT}.dtype"]),
        rollout_tensor_parallel=max(int(values[f"{ROLLOUT}.tensor_model_parallel_size"]), 1),
    )


def _dtype_bytes(name: Any) -> int:
    return DTYPE_BYTES.get(str(name).removeprefix("torch.").lower(), 4)


def gpu_bytes_from_node_selector(node_selector: Mapping[str, str] | None) -> int | None:
    """The GPU memory a nodeSelector on `nvidia.com/gpu.memory` (MiB, as GPU feature discovery labels
    nodes) asks for; None without one."""
    value = (node_selector or {}).get(GPU_MEMORY_LABEL, "")
    return int(value) << 20 if value.isdigit() and int(value) > 0 else None


class Verdict(enum.StrEnum):
    FITS = "fits"
    TIGHT = "tight"  # fits with less than TIGHT_HEADROOM of the GPU free: a warning
    REFUSE = "does not fit"


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes on one GPU. `at_wake`: what the trainer keeps plus vLLM's reservation; `at_update`: vLLM
    asleep, the update's weights, gradients and optimizer (activations not counted)."""

    parameter_count: int
    world_size: int
    shards: int
    capacity: int
    weights: int  # the actor's parameter shard
    grads: int  # during the update only
    optimizer: int
    reference: int
    vllm_reservation: int
    vllm_weights: int  # vLLM's copy of the model, inside its reservation
    overhead: int
    resident_weights: int  # the parts of weights/optimizer still on the GPU when vLLM wakes
    resident_optimizer: int
    resident_reference: int

    @property
    def at_wake(self) -> int:
        return (
            self.resident_weights
            + self.resident_optimizer
            + self.resident_reference
            + self.vllm_reservation
            + self.overhead
        )

    @property
    def at_update(self) -> int:
        return self.weights + self.grads + self.optimizer + self.reference + self.overhead

    @property
    def verdict(self) -> Verdict:
        if max(self.at_wake, self.at_update) > self.capacity or self.vllm_weights >= self.vllm_reservation:
            return Verdict.REFUSE
        if self.capacity - self.at_wake < TIGHT_HEADROOM * self.capacity:
            return Verdict.TIGHT
        return Verdict.FITS

    def breakdown(self) -> str:
        """The figures in GiB, one line: each phase's parts, then its total against the GPU."""
        reference = [f"reference {_gib(self.resident_reference)}"] if self.reference else []
        wake = [
            f"weights {_gib(self.resident_weights)}",
            "grads 0 (freed after the update)",
            f"optimizer {_gib(self.resident_optimizer)}",
            *reference,
            f"vLLM's reservation {_gib(self.vllm_reservation)} (its weights {_gib(self.vllm_weights)})",
            f"runtime {_gib(self.overhead)}",
        ]
        update = [
            f"weights {_gib(self.weights)}",
            f"grads {_gib(self.grads)}",
            f"optimizer {_gib(self.optimizer)}",
            *([f"reference {_gib(self.reference)}"] if self.reference else []),
            f"runtime {_gib(self.overhead)}",
        ]
        return (
            f"{self.parameter_count / 1e9:.2f}B parameters, FSDP shards over {self.shards} of "
            f"{self.world_size} GPU(s); per GPU when vLLM wakes: {' + '.join(wake)} = {_gib(self.at_wake)} "
            f"of {_gib(self.capacity)}; during the update (vLLM asleep): {' + '.join(update)} = "
            f"{_gib(self.at_update)} before activations"
        )


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def estimate(
    shape: ModelShape, settings: MemorySettings, *, gpu_bytes: int, world_size: int
) -> MemoryEstimate:
    """One GPU's memory for a run of `world_size` GPUs (nodes x GPUs per node) with this model."""
    count = shape.parameter_count
    shards = settings.shards(max(world_size, 1))
    on_gpu = 0 if settings.offload_policy else 1
    weights = on_gpu * math.ceil(count * settings.model_dtype_bytes / shards)
    optimizer = on_gpu * ADAM_MOMENTS * weights
    reference = 0
    if settings.uses_reference:
        reference = math.ceil(count * settings.reference_dtype_bytes / shards)
    return MemoryEstimate(
        parameter_count=count,
        world_size=world_size,
        shards=shards,
        capacity=gpu_bytes,
        weights=weights,
        grads=weights,
        optimizer=optimizer,
        reference=reference,
        vllm_reservation=int(settings.gpu_memory_utilization * gpu_bytes),
        vllm_weights=math.ceil(count * settings.rollout_dtype_bytes / settings.rollout_tensor_parallel),
        overhead=RUNTIME_OVERHEAD_BYTES,
        resident_weights=0 if settings.param_offload else weights,
        resident_optimizer=0 if settings.optimizer_offload else optimizer,
        resident_reference=0 if settings.reference_param_offload else reference,
    )


def fixes(shape: ModelShape, settings: MemorySettings, *, gpu_bytes: int, world_size: int) -> list[str]:
    """What would make a refused estimate fit, each with its figure."""
    found = estimate(shape, settings, gpu_bytes=gpu_bytes, world_size=world_size)
    suggestions = []
    if found.vllm_weights >= found.vllm_reservation:
        suggestions.append(
            f"raise {UTILIZATION_KEY} (now {settings.gpu_memory_utilization}): vLLM's weights "
            f"({_gib(found.vllm_weights)}) leave nothing of its {_gib(found.vllm_reservation)} for the KV "
            f"cache; or raise {ROLLOUT}.tensor_model_parallel_size"
        )
    # Offload and a smaller reservation help at wake only: the update loads everything back.
    wake_fixes_help = found.at_wake > gpu_bytes >= found.at_update
    room = gpu_bytes - (found.at_wake - found.vllm_reservation)
    utilization = math.floor(100 * (room - TIGHT_HEADROOM * gpu_bytes) / gpu_bytes) / 100
    if wake_fixes_help and found.vllm_weights < utilization * gpu_bytes:
        suggestions.append(f"lower {UTILIZATION_KEY} from {settings.gpu_memory_utilization} to {utilization}")
    if wake_fixes_help and not settings.param_offload and found.resident_weights:
        suggestions.append(f"set {PARAM_OFFLOAD_KEY}: true (frees {_gib(found.resident_weights)} at wake)")
    if wake_fixes_help and not settings.optimizer_offload and found.resident_optimizer:
        suggestions.append(
            f"set {OPTIMIZER_OFFLOAD_KEY}: true (frees {_gib(found.resident_optimizer)} at wake)"
        )
    enough = _gpus_that_fit(shape, settings, gpu_bytes=gpu_bytes, world_size=world_size)
    if enough is not None:
        suggestions.append(f"more GPUs: {enough} would fit (FSDP shards the actor over them)")
    suggestions.append("or a smaller model")
    return suggestions


def _gpus_that_fit(
    shape: ModelShape, settings: MemorySettings, *, gpu_bytes: int, world_size: int
) -> int | None:
    gpus = max(world_size, 1) * 2
    while gpus <= MAX_SUGGESTED_GPUS:
        if estimate(shape, settings, gpu_bytes=gpu_bytes, world_size=gpus).verdict is not Verdict.REFUSE:
            return gpus
        gpus *= 2
    return None


def judgement(
    shape: ModelShape, settings: MemorySettings, *, gpu_bytes: int, world_size: int
) -> tuple[Verdict, str]:
    """The verdict and its message: the breakdown, and for a refusal the fixes."""
    found = estimate(shape, settings, gpu_bytes=gpu_bytes, world_size=world_size)
    verdict = found.verdict
    text = f"{verdict}: {found.breakdown()}"
    if verdict is Verdict.TIGHT:
        text += f" (less than {TIGHT_HEADROOM:.0%} free at wake; consider the fixes of a refusal)"
    if verdict is Verdict.REFUSE:
        text += "; fix: " + "; ".join(fixes(shape, settings, gpu_bytes=gpu_bytes, world_size=world_size))
    return verdict, text
