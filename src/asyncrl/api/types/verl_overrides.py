"""`spec.trainer.verlOverrides`: verl settings given in the run, and the ones the run itself decides.

The overrides are verl Hydra keys (`actor_rollout_ref.actor.optim.lr: 1e-6`), written flat with dots or as
nested mappings (`actor_rollout_ref: {actor: {optim: {lr: 1e-6}}}`); both read the same. A leading `+` adds
a key that verl's config does not declare, as on Hydra's command line.

Some verl keys are set from the run's own fields (batch sizes, `rollout.samplesPerPrompt`, the model, the
GPUs, rollout correction) or by the backend (the trainer mode, checkpoint places): giving them here would make
the two disagree, so they are rejected, and the message says which field of the run sets each one.

No verl import here: the operator and the API validation read this module without the trainer's libraries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# verl key -> what sets it instead (shown in the error message).
OWNED_VERL_KEYS: Mapping[str, str] = {
    "data.train_batch_size": "spec.trainBatchSize (groups per update)",
    "data.gen_batch_size": "spec.trainBatchSize; the window decides what is generated",
    "actor_rollout_ref.rollout.n": "spec.rollout.samplesPerPrompt (sibling rollouts per group)",
    "actor_rollout_ref.model.path": "spec.model.path",
    "trainer.n_gpus_per_node": "spec.trainer.gpus (spec.trainer.gpusPerNode when nodes > 1)",
    "trainer.nnodes": "spec.trainer.nodes",
    "trainer.total_training_steps": "spec.totalSteps",
    "trainer.total_epochs": "spec.totalSteps",
    "trainer.use_v1": "the backend (verl's v1 trainer)",
    "trainer.v1.trainer_mode": "the backend (colocate_async, the mode asyncrl drives)",
    "trainer.default_local_dir": "spec.trainer.checkpoint (the trainer's --checkpoint-dir)",
    "trainer.resume_mode": "the trainer (it resumes from its latest checkpoint)",
    "algorithm.rollout_correction.rollout_is": "spec.rolloutCorrection.mode",
    "algorithm.rollout_correction.rollout_is_threshold": "spec.rolloutCorrection.threshold",
    "actor_rollout_ref.rollout.name": "the backend (vllm: the gateway needs its OpenAI server)",
    "actor_rollout_ref.rollout.skip_tokenizer_init": "the backend (the OpenAI server needs the tokenizer)",
    "transfer_queue.enable": "the backend (verl's v1 trainer needs it)",
}


def flatten_overrides(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become dotted keys; a `+` (add a new key) stays at the front of the whole key."""
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        name = str(key)
        adds = name.startswith("+") or prefix.startswith("+")
        bare = prefix.lstrip("+") + name.lstrip("+")
        dotted = ("+" if adds else "") + bare
        if isinstance(value, Mapping) and value:
            flat.update(flatten_overrides(value, prefix=dotted + "."))
        else:
            flat[dotted] = value
    return flat


def owned_key_errors(overrides: Mapping[str, Any]) -> list[str]:
    """One message per override that sets a key the run decides (an empty list when there is none)."""
    errors = []
    for key in flatten_overrides(overrides):
        bare = key.lstrip("+")
        for owned, instead in OWNED_VERL_KEYS.items():
            if bare == owned or owned.startswith(bare + "."):
                errors.append(f"{key!r} is set by {instead}; remove it from spec.trainer.verlOverrides")
                break
    return errors
