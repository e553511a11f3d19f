"""verl's trainer config as our backend composes it for a tiny run, with the changes a CPU-only run needs.

Each change names why; docs/gpu-backend.md lists them as the CPU run's deviations from the GPU configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from tests.trainer.backends.verl_support import verl_config

TRAIN_BATCH_SIZE = 2  # prompts per update
SAMPLES_PER_PROMPT = 2
TOTAL_STEPS = 3
LEARNING_RATE = 1e-3
FLOAT32_EVERYWHERE = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def cpu_verl_config(model_dir: Path, *, gpus: int, checkpoint_dir: Path | None = None) -> Any:
    config = verl_config(
        model={"name": "tiny", "path": str(model_dir)},
        trainBatchSize=TRAIN_BATCH_SIZE,
        rollout={"samplesPerPrompt": SAMPLES_PER_PROMPT},
        totalSteps=TOTAL_STEPS,
        **{"async": {"enabled": True, "windowSize": 2 * TRAIN_BATCH_SIZE}},
        trainer={"gpus": gpus},
    )
    actor_rollout_ref = config.actor_rollout_ref
    rollout = actor_rollout_ref.rollout
    with open_dict(config):
        # vLLM's CPU build refuses sleep mode ("Sleep mode is not supported on current platform",
        # vllm/config/model.py:520-521); verl's sleep and wake calls still run and do nothing on CPU.
        rollout.enable_sleep_mode = False
        rollout.free_cache_engine = False
        # No inductor compilation of the model on two cores (vllm/platforms/cpu.py:180-193).
        rollout.enforce_eager = True
        # The tiny model is float32; vLLM and the actor compute in the same dtype, so that their log-probs
        # can be compared tightly.
        rollout.dtype = "float32"
        for role in (actor_rollout_ref.actor, actor_rollout_ref.ref):
            # FSDP1 refuses CPU parameters with sync_module_states; FSDP2 takes them.
            role.strategy = "fsdp2"
            role.fsdp_config.strategy = "fsdp2"
            role.fsdp_config.dtype = "float32"
            # verl's FSDP engine computes in bfloat16 unless told (transformer_impl.py:391-397): measured
            # here, that alone puts the actor's log-probs up to 0.025 from vLLM's float32 ones (IS weights
            # 0.975-1.024). float32 on both sides makes the comparison check the wiring, not rounding.
            role.fsdp_config.mixed_precision = FLOAT32_EVERYWHERE
            role.fsdp_config.use_torch_compile = False
        # verl's default (1e-6) barely moves a random tiny model in a few steps; the test checks it moved.
        actor_rollout_ref.actor.optim.lr = LEARNING_RATE
        # TransferQueue's 8 storage units would each hold a Ray CPU (resources.py): one is enough here.
        config.transfer_queue.backend.SimpleStorage.num_data_storage_units = 1
        if checkpoint_dir is not None:
            config.trainer.default_local_dir = str(checkpoint_dir)
    return config


def save_cpu_verl_config(path: Path, model_dir: Path, *, gpus: int) -> Path:
    OmegaConf.save(cpu_verl_config(model_dir, gpus=gpus), path, resolve=True)
    return path
