"""One GPU's memory when vLLM wakes, estimated from the model's config.json, against hand-computed figures.

The configs are Qwen2.5-0.5B/1.5B/7B-Instruct's (their config.json's sizes); the parameter counts below are
worked out by hand and equal the published ones. The trainer's preflight uses the same estimate with the real
GPU's memory (torch.cuda.get_device_properties): that probe needs a GPU, so its decision is tested here with a
fake probe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api import load_run
from asyncrl.trainer.backends.verl import memory_budget
from asyncrl.trainer.backends.verl.memory_budget import (
    DEFAULT_GPU_BYTES,
    GIB,
    MemorySettings,
    UnsupportedModel,
    Verdict,
    estimate,
    fixes,
    gpu_bytes_from_node_selector,
    memory_settings,
    model_shape,
)
from asyncrl.trainer.preflight import GPU_STACK_PINS, Probes, check_gpu_memory, memory_check, run_checks
from tests.trainer.backends.verl_support import verl_manifest

QWEN_05B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
QWEN_15B: dict[str, Any] = {
    **QWEN_05B,
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "intermediate_size": 8960,
    "num_attention_heads": 12,
}
QWEN_7B: dict[str, Any] = {
    **QWEN_05B,
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
# 0.5B: head_dim 64; per layer q 896*896+896, k and v 896*128+128 each, o 896*896, MLP 3*896*4864, two norms
# 2*896 = 14,912,384; x24 = 357,897,216; embeddings (tied) 151936*896 = 136,134,656; final norm 896.
QWEN_05B_PARAMETERS = 357_897_216 + 136_134_656 + 896  # 494,032,768
# 1.5B: head_dim 128; per layer 1536*1536+1536 + 2*(1536*256+256) + 1536*1536 + 3*1536*8960 + 2*1536
# = 46,797,824; x28 = 1,310,339,072; embeddings (tied) 151936*1536 = 233,373,696; final norm 1536.
QWEN_15B_PARAMETERS = 1_310_339_072 + 233_373_696 + 1536  # 1,543,714,304
# 7B: head_dim 128; per layer 3584*3584+3584 + 2*(3584*512+512) + 3584*3584 + 3*3584*18944 + 2*3584
# = 233,057,792; x28 = 6,525,618,176; embeddings and lm_head (untied) 2*152064*3584 = 1,089,994,752.
QWEN_7B_PARAMETERS = 6_525_618_176 + 1_089_994_752 + 3584  # 7,615,616,512


@pytest.mark.parametrize(
    ("config", "parameters"),
    [(QWEN_05B, QWEN_05B_PARAMETERS), (QWEN_15B, QWEN_15B_PARAMETERS), (QWEN_7B, QWEN_7B_PARAMETERS)],
)
def test_the_parameter_count_is_the_hand_computed_one(config: dict[str, Any], parameters: int) -> None:
    assert model_shape(config).parameter_count == parameters


def test_a_15b_model_on_one_80_gib_gpu_fits_with_each_part_as_computed() -> None:
    found = estimate(model_shape(QWEN_15B), MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=1)
    assert found.weights == QWEN_15B_PARAMETERS * 4  # fp32 master weights: 5.75 GiB
    assert found.optimizer == QWEN_15B_PARAMETERS * 8  # AdamW's two fp32 moments: 11.50 GiB
    assert found.vllm_reservation == 40 * GIB  # gpu_memory_utilization 0.5 of 80 GiB
    assert found.vllm_weights == QWEN_15B_PARAMETERS * 2  # bf16: 2.88 GiB
    assert found.at_wake == QWEN_15B_PARAMETERS * 12 + 40 * GIB + 1 * GIB  # 58.25 GiB
    assert found.verdict is Verdict.FITS
    text = found.breakdown()
    assert "weights 5.8 GiB + grads 0 (freed after the update) + optimizer 11.5 GiB" in text
    assert (
        "vLLM's reservation 40.0 GiB (its weights 2.9 GiB) + runtime 1.0 GiB = 58.3 GiB of 80.0 GiB" in text
    )
    assert "weights 5.8 GiB + grads 5.8 GiB + optimizer 11.5 GiB + runtime 1.0 GiB = 24.0 GiB" in text


def test_a_05b_model_fits_a_24_gib_gpu() -> None:
    found = estimate(model_shape(QWEN_05B), MemorySettings(), gpu_bytes=24 * GIB, world_size=1)
    assert found.at_wake == QWEN_05B_PARAMETERS * 12 + 12 * GIB + 1 * GIB  # 18.5 GiB
    assert found.verdict is Verdict.FITS


def test_a_7b_model_on_one_gpu_is_refused_and_more_gpus_are_the_fix() -> None:
    shape = model_shape(QWEN_7B)
    found = estimate(shape, MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=1)
    assert found.at_wake == QWEN_7B_PARAMETERS * 12 + 41 * GIB  # 126.1 GiB
    assert found.at_update == QWEN_7B_PARAMETERS * 16 + 1 * GIB  # 114.5 GiB: offload cannot help
    assert found.verdict is Verdict.REFUSE
    suggested = fixes(shape, MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=1)
    assert suggested == ["more GPUs: 4 would fit (FSDP shards the actor over them)", "or a smaller model"]


def test_a_7b_model_sharded_over_four_gpus_fits() -> None:
    found = estimate(model_shape(QWEN_7B), MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=4)
    assert found.weights == QWEN_7B_PARAMETERS  # 4 bytes over 4 ranks
    assert found.at_wake == QWEN_7B_PARAMETERS * 3 + 41 * GIB  # 62.3 GiB
    assert found.verdict is Verdict.FITS


def test_on_two_gpus_a_7b_model_fits_only_with_the_optimizer_offloaded_or_a_smaller_reservation() -> None:
    shape = model_shape(QWEN_7B)
    found = estimate(shape, MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=2)
    assert found.at_wake == QWEN_7B_PARAMETERS * 6 + 41 * GIB  # 83.6 GiB of 80
    assert found.verdict is Verdict.REFUSE
    assert fixes(shape, MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=2) == [
        "lower actor_rollout_ref.rollout.gpu_memory_utilization from 0.5 to 0.35",
        "set actor_rollout_ref.actor.fsdp_config.param_offload: true (frees 14.2 GiB at wake)",
        "set actor_rollout_ref.actor.fsdp_config.optimizer_offload: true (frees 28.4 GiB at wake)",
        "more GPUs: 4 would fit (FSDP shards the actor over them)",
        "or a smaller model",
    ]
    offloaded = estimate(
        shape, MemorySettings(optimizer_offload=True), gpu_bytes=DEFAULT_GPU_BYTES, world_size=2
    )
    assert offloaded.at_wake == QWEN_7B_PARAMETERS * 2 + 41 * GIB  # 55.2 GiB
    assert offloaded.verdict is Verdict.FITS
    smaller = MemorySettings(gpu_memory_utilization=0.35)
    assert estimate(shape, smaller, gpu_bytes=DEFAULT_GPU_BYTES, world_size=2).verdict is Verdict.FITS


def test_less_than_a_tenth_of_the_gpu_free_at_wake_is_tight() -> None:
    settings = MemorySettings(gpu_memory_utilization=0.7)  # 5.75 + 11.5 + 56 + 1 = 74.25 GiB of 80
    found = estimate(model_shape(QWEN_15B), settings, gpu_bytes=DEFAULT_GPU_BYTES, world_size=1)
    assert found.verdict is Verdict.TIGHT


def test_a_reservation_smaller_than_vllms_weights_is_refused_naming_the_utilization() -> None:
    settings = MemorySettings(gpu_memory_utilization=0.15)  # 12 GiB for 14.2 GiB of bf16 weights
    shape = model_shape(QWEN_7B)
    found = estimate(shape, settings, gpu_bytes=DEFAULT_GPU_BYTES, world_size=8)
    assert found.verdict is Verdict.REFUSE
    (first, *_) = fixes(shape, settings, gpu_bytes=DEFAULT_GPU_BYTES, world_size=8)
    assert first.startswith("raise actor_rollout_ref.rollout.gpu_memory_utilization (now 0.15)")


def test_fsdp_cpu_offload_keeps_the_actor_off_the_gpu_and_a_kl_term_adds_the_reference() -> None:
    shape = model_shape(QWEN_7B)
    cpu = estimate(shape, MemorySettings(offload_policy=True), gpu_bytes=DEFAULT_GPU_BYTES, world_size=1)
    assert cpu.at_wake == 41 * GIB
    assert cpu.verdict is Verdict.FITS
    kl = estimate(shape, MemorySettings(uses_reference=True), gpu_bytes=DEFAULT_GPU_BYTES, world_size=4)
    assert kl.reference == QWEN_7B_PARAMETERS  # fp32 over 4 ranks
    assert kl.at_wake == QWEN_7B_PARAMETERS * 4 + 41 * GIB


def test_a_mixture_of_experts_or_a_config_without_sizes_is_not_estimated() -> None:
    with pytest.raises(UnsupportedModel, match="mixture-of-experts"):
        model_shape({**QWEN_7B, "num_experts": 64})
    with pytest.raises(UnsupportedModel, match="intermediate_size"):
        model_shape({key: value for key, value in QWEN_7B.items() if key != "intermediate_size"})


def test_the_runs_overrides_nested_or_dotted_set_the_memory_settings() -> None:
    overrides = {
        "actor_rollout_ref": {"actor": {"fsdp_config": {"param_offload": True}}},
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
        "actor_rollout_ref.actor.use_kl_loss": True,
    }
    run = load_run(verl_manifest(trainer={"verlOverrides": overrides}))
    assert memory_settings(run) == MemorySettings(
        param_offload=True, gpu_memory_utilization=0.4, uses_reference=True
    )
    assert memory_settings(load_run(verl_manifest())) == MemorySettings()


def test_the_defaults_are_verls_own() -> None:
    import verl

    generated = Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    config = yaml.safe_load(generated.read_text())
    for key, value in memory_budget.VERL_DEFAULTS.items():
        if key == "actor_rollout_ref.rollout.tensor_model_parallel_size":
            continue  # asyncrl's default (config.py's ASYNCRL_DEFAULTS), not verl's
        node: Any = config
        for part in key.split("."):
            node = node[part]
        assert node == value, key


def test_a_gpu_memory_node_selector_gives_the_gpus_memory() -> None:
    assert gpu_bytes_from_node_selector({"nvidia.com/gpu.memory": "81559"}) == 81559 << 20
    assert gpu_bytes_from_node_selector({"nvidia.com/gpu.product": "NVIDIA-H100"}) is None
    assert gpu_bytes_from_node_selector(None) is None


# -- the trainer's preflight: the pure decision, and the check with a fake GPU probe ------------------------


def test_the_preflight_refuses_with_the_figures_and_the_fixes() -> None:
    check = memory_check(QWEN_7B, MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=1)
    assert not check.ok
    line = check.line()
    assert line.startswith("FAIL  gpu memory: does not fit: 7.62B parameters, FSDP shards over 1 of 1 GPU(s)")
    assert "= 126.1 GiB of 80.0 GiB" in line
    assert line.endswith("fix: more GPUs: 4 would fit (FSDP shards the actor over them); or a smaller model")
    assert memory_check(QWEN_15B, MemorySettings(), gpu_bytes=DEFAULT_GPU_BYTES, world_size=1).ok
    unknown = memory_check({"model_type": "mamba"}, MemorySettings(), gpu_bytes=GIB, world_size=1)
    assert unknown.ok
    assert "not estimated" in unknown.detail


def model_run(tmp_path: Path, config: dict[str, Any]):  # type: ignore[no-untyped-def]
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    manifest = verl_manifest()
    manifest["spec"]["model"]["path"] = str(directory)
    return load_run(manifest)


def probes_with(gpu_bytes: int | None) -> Probes:
    return Probes(
        version=GPU_STACK_PINS.get,
        cuda=lambda: (True, 1, "CUDA 13.0"),
        shm_bytes=lambda: 16 * GIB,
        node_cpus=64,
        gpu_memory_bytes=lambda: gpu_bytes,
    )


def test_the_preflight_checks_the_model_against_the_gpu_it_finds(tmp_path: Path) -> None:
    run = model_run(tmp_path, {**QWEN_15B})
    assert check_gpu_memory(run, probes_with(80 * GIB)).ok
    small = check_gpu_memory(run, probes_with(24 * GIB))  # 5.75 + 11.5 + 12 + 1 = 30.3 GiB of 24
    assert not small.ok
    assert "30.3 GiB of 24.0 GiB" in small.detail
    assert "more GPUs: 2 would fit" in small.fix
    checks = run_checks(run, checkpoint_dir=None, probes=probes_with(24 * GIB))
    assert "gpu memory" in {check.name for check in checks if not check.ok}
    without_gpu = check_gpu_memory(run, probes_with(None))
    assert without_gpu.ok
    assert without_gpu.detail == "not estimated: the GPU's memory is unknown here"
