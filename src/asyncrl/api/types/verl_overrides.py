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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

TRAINER_MODE = "colocate_async"  # the mode of verl's v1 trainer that asyncrl drives


@dataclass(frozen=True)
class RunVerlDecisions:
    """What the run decides for verl: the values of the owned keys below (the verl backend fills it)."""

    model_path: str
    tool_call_parser: str | None  # vLLM's --tool-call-parser; None: started without tool parsing
    train_batch_size: int  # groups per update
    rollout_n: int
    gpus: int  # per node
    nnodes: int  # more than 1: a KubeRay RayCluster the trainer joins as the driver
    total_steps: int | None  # None: verl's own end (the epochs) decides
    rollout_is: Literal["token", "sequence"] | None  # None: rollout correction off
    rollout_is_threshold: float
    checkpoint_dir: str
    max_prompt_length: int
    max_response_length: int


@dataclass(frozen=True)
class OwnedVerlKey:
    """A verl key the run decides: what sets it instead (shown in the error message) and its value."""

    set_by: str
    value: Callable[[RunVerlDecisions], Any]


# The one list of owned keys: loading a run refuses them in verlOverrides, the verl backend sets them. A
# leading + marks a key verl's YAML does not declare (as in verlOverrides): the backend adds it.
OWNED_VERL_KEYS: Mapping[str, OwnedVerlKey] = {
    "data.train_batch_size": OwnedVerlKey(
        "spec.trainBatchSize (groups per update)", lambda run: run.train_batch_size
    ),
    "data.max_prompt_length": OwnedVerlKey(
        "spec.data.maxPromptLength (the adapter drops rows with longer prompts)",
        lambda run: run.max_prompt_length,
    ),
    "data.max_response_length": OwnedVerlKey(
        "spec.data.maxResponseLength (the adapter cuts longer responses)", lambda run: run.max_response_length
    ),
    "data.gen_batch_size": OwnedVerlKey(
        "spec.trainBatchSize; the window decides what is generated", lambda _: 1
    ),
    "actor_rollout_ref.rollout.n": OwnedVerlKey(
        "spec.rollout.samplesPerPrompt (sibling rollouts per group)", lambda run: run.rollout_n
    ),
    "actor_rollout_ref.model.path": OwnedVerlKey("spec.model.path", lambda run: run.model_path),
    # verl passes engine_kwargs.vllm to vLLM's server as its command-line flags
    # (verl/workers/rollout/vllm_rollout/vllm_async_server.py, vLLMHttpServer.launch_server: None values are
    # dropped, True becomes a bare flag); without them vLLM answers 400 to calls with tools.
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_auto_tool_choice": OwnedVerlKey(
        "spec.model.toolCallParser", lambda run: run.tool_call_parser is not None
    ),
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser": OwnedVerlKey(
        "spec.model.toolCallParser", lambda run: run.tool_call_parser
    ),
    "trainer.n_gpus_per_node": OwnedVerlKey(
        "spec.trainer.gpus (spec.trainer.gpusPerNode when nodes > 1)", lambda run: run.gpus
    ),
    "trainer.nnodes": OwnedVerlKey("spec.trainer.nodes", lambda run: run.nnodes),
    "trainer.total_training_steps": OwnedVerlKey("spec.totalSteps", lambda run: run.total_steps),
    "trainer.total_epochs": OwnedVerlKey("spec.totalSteps", lambda _: 1),
    "trainer.use_v1": OwnedVerlKey("the backend (verl's v1 trainer)", lambda _: True),
    "trainer.v1.trainer_mode": OwnedVerlKey(
        "the backend (colocate_async, the mode asyncrl drives)", lambda _: TRAINER_MODE
    ),
    "trainer.default_local_dir": OwnedVerlKey(
        "spec.trainer.checkpoint (the trainer's --checkpoint-dir)", lambda run: run.checkpoint_dir
    ),
    "trainer.resume_mode": OwnedVerlKey(
        "the trainer (it resumes from its latest checkpoint)", lambda _: "disable"
    ),
    "algorithm.rollout_correction.rollout_is": OwnedVerlKey(
        "spec.rolloutCorrection.mode", lambda run: run.rollout_is
    ),
    "algorithm.rollout_correction.rollout_is_threshold": OwnedVerlKey(
        "spec.rolloutCorrection.threshold", lambda run: run.rollout_is_threshold
    ),
    "actor_rollout_ref.rollout.name": OwnedVerlKey(
        "the backend (vllm: the gateway needs its OpenAI server)", lambda _: "vllm"
    ),
    "actor_rollout_ref.rollout.skip_tokenizer_init": OwnedVerlKey(
        "the backend (the OpenAI server needs the tokenizer)", lambda _: False
    ),
    # vLLM's default is raw_logprobs (before temperature); rollout correction divides the actor's log-probs at
    # rollout.temperature by these, so they must be the sampled distribution's (tests/vllm measures both).
    "actor_rollout_ref.rollout.logprobs_mode": OwnedVerlKey(
        "the backend (rollout correction needs the log-probs of the sampled distribution)",
        lambda _: "processed_logprobs",
    ),
    "transfer_queue.enable": OwnedVerlKey("the backend (verl's v1 trainer needs it)", lambda _: True),
}


def owned_verl_values(run: RunVerlDecisions) -> dict[str, Any]:
    """The owned keys with the run's values (`trainer.total_training_steps` only when the run sets it)."""
    values = {key: owned.value(run) for key, owned in OWNED_VERL_KEYS.items()}
    if run.total_steps is None:
        del values["trainer.total_training_steps"]
    return values


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
        for key_spelling, by in OWNED_VERL_KEYS.items():
            owned = key_spelling.lstrip("+")
            if bare == owned or owned.startswith(bare + "."):
                errors.append(f"{key!r} is set by {by.set_by}; remove it from spec.trainer.verlOverrides")
                break
    return errors


# The one verl key the Reference backend reads (its learning rate): one manifest tunes both backends alike.
LEARNING_RATE_KEY = "actor_rollout_ref.actor.optim.lr"
REFERENCE_BACKEND_KEYS = (LEARNING_RATE_KEY,)


def learning_rate_errors(flat: Mapping[str, Any]) -> list[str]:
    """The learning rate must be a number on both backends (verl's default is a float; Reference reads it)."""
    value = flat.get(LEARNING_RATE_KEY, flat.get("+" + LEARNING_RATE_KEY))
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return []
    hint = ""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:  # PyYAML (YAML 1.1) reads 1e-6, without a dot, as a string
            hint = f"; YAML 1.1 reads {value} without a dot as text: write it as a number such as 1.0e-6"
    return [f"{LEARNING_RATE_KEY!r} must be a number (e.g. 1.0e-6), not {value!r}{hint}"]


def reference_ignored_keys(overrides: Mapping[str, Any]) -> list[str]:
    """The flat keys of `overrides` that the Reference backend does not read (all but its learning rate)."""
    return [key for key in flatten_overrides(overrides) if key.lstrip("+") not in REFERENCE_BACKEND_KEYS]
