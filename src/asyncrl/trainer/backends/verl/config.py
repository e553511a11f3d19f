"""The run → verl's trainer config: verl's own defaults, then ours, then the run's overrides, then what the
run decides (batch sizes, `rollout.samplesPerPrompt`, model, GPUs, rollout correction, the trainer mode).

`verl_settings` is pure (the run's fields, checked); `compose_verl_config` loads verl's Hydra config
(`verl/trainer/config/ppo_trainer.yaml`, the one `python -m verl.trainer.main_ppo` reads) and runs verl's own
`validate_config` on the result, so a setting verl would refuse on the GPU machine is refused here, at the
trainer's start, with the key named.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.api import AsyncTrainingRun
from asyncrl.api.types.tool_call_parsers import vllm_tool_call_parser
from asyncrl.api.types.verl_layout import (
    DEFAULT_TOKEN_BUDGET,
    DYNAMIC_BATCH_KEY,
    REMOVE_PADDING_KEY,
    UPDATE_BUDGET_KEY,
)
from asyncrl.api.types.verl_overrides import RunVerlDecisions, flatten_overrides, owned_verl_values

VERL_CONFIG_NAME = "ppo_trainer"

# vLLM's context length; unset, vLLM takes the model's maximum (32,768 for Qwen2.5), not the longest row.
MAX_MODEL_LEN_KEY = "actor_rollout_ref.rollout.max_model_len"
REWARD_WORKERS_KEY = "reward.num_workers"

# Our defaults where verl's do not suit an agent run; every one may be overridden in verlOverrides.
ASYNCRL_DEFAULTS: Mapping[str, Any] = {
    # One vLLM replica per GPU: more replicas for the gateway to balance agents over.
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    # Rows differ in length and number (one per model call at transition level): token-budget micro-batches.
    DYNAMIC_BATCH_KEY: True,
    UPDATE_BUDGET_KEY: DEFAULT_TOKEN_BUDGET,
    # The trainer image has no flash-attn (verl's default attention for training; it would have to be compiled
    # against CUDA in the image build): PyTorch's SDPA. Rows are packed into one sequence (remove-padding),
    # which transformers' SDPA path masks per row from the position ids (verl passes no attention mask and
    # use_cache=False; tests/trainer/test_verl_packing.py checks the logits against unpacked rows). Padded
    # micro-batches would be rows x longest row: verl's token budget counts real tokens only, so a budget of
    # 16,384 could become 200,000 padded positions (tens of GiB of logits).
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    REMOVE_PADDING_KEY: True,
    # The actor's log-probs are compared with vLLM's (verl's rollout-vs-actor debug metrics).
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    "algorithm.adv_estimator": "grpo",
    # asyncrl logs to W&B itself; verl's own tracking and validation loop are not used.
    "trainer.logger": ["console"],
    "trainer.val_before_train": False,
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.project_name": "asyncrl",
    # Rewards come from the agents (posted to the gateway), never from verl's reward loop. verl 0.9.1's v1
    # trainer builds its RewardLoopManager in any case (trainer_base.py, _setup), which starts this many Ray
    # actors, each loading the tokenizer (reward_loop.py, _init_reward_loop_workers); 0 starts none.
    REWARD_WORKERS_KEY: 0,
}


class VerlConfigError(ValueError):
    """A run whose verl settings verl would refuse; the message names the key and the fix."""


@dataclass(frozen=True)
class VerlSettings(RunVerlDecisions):
    """What the run decides for verl, and the user's overrides (flat, checked against the owned keys)."""

    experiment_name: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    schedule_steps: int | None = (
        None  # the LR schedule's horizon in updates (schedule_horizon); None: unknown
    )

    @property
    def longest_row(self) -> int:
        """The most tokens of a training row: the adapter drops longer prompts and cuts longer responses."""
        return self.max_prompt_length + self.max_response_length

    def owned(self) -> dict[str, Any]:
        """The keys the run sets (OWNED_VERL_KEYS), with their values."""
        return owned_verl_values(self)

    def defaults(self) -> dict[str, Any]:
        """ASYNCRL_DEFAULTS plus the ones that follow from the run (one optimizer step per update)."""
        defaults = {
            **ASYNCRL_DEFAULTS,
            "actor_rollout_ref.actor.ppo_mini_batch_size": self.train_batch_size,
            "trainer.experiment_name": self.experiment_name,
            MAX_MODEL_LEN_KEY: self.longest_row,
        }
        if self.schedule_steps is not None:
            defaults.update(dict.fromkeys(SCHEDULE_HORIZON_KEYS, self.schedule_steps))
        return defaults


# verl's learning-rate schedules (warmup, cosine) run over these many optimizer steps; asyncrl's update is one
# step of each (ppo_mini_batch_size = trainBatchSize). A user may set them in verlOverrides.
SCHEDULE_HORIZON_KEYS = (
    "actor_rollout_ref.actor.optim.total_training_steps",
    "critic.optim.total_training_steps",
)


def schedule_horizon(run: AsyncTrainingRun, *, prompt_count: int | None) -> tuple[int | None, str]:
    """The updates the LR schedule spans, and why: totalSteps, else one pass over the prompts."""
    spec = run.spec
    if spec.total_steps is not None:
        return spec.total_steps, f"spec.totalSteps = {spec.total_steps}"
    if prompt_count is None and spec.data.inline is not None:
        prompt_count = len(spec.data.inline)
    if not prompt_count:
        return None, "unknown (no totalSteps, prompts not counted)"
    steps = math.ceil(prompt_count / spec.train_batch_size)
    return steps, (
        f"one pass over the data: {prompt_count} prompts / trainBatchSize {spec.train_batch_size}, "
        "as spec.totalSteps is unset"
    )


def verl_settings(
    run: AsyncTrainingRun, *, checkpoint_dir: Path | None, prompt_count: int | None = None
) -> VerlSettings:
    """`prompt_count`: the rows of the run's data, which set the LR schedule's horizon without totalSteps."""
    spec = run.spec
    if spec.trainer.nodes > 1 and spec.trainer.node_gpus < 1:
        raise VerlConfigError(
            "spec.trainer.gpusPerNode is 0 (or unset with spec.trainer.gpus: 0), and the verl backend trains "
            "and serves on GPUs: set spec.trainer.gpusPerNode to the GPUs of each node (1 or more)"
        )
    if spec.trainer.gpus < 1 and spec.trainer.nodes == 1:
        raise VerlConfigError(
            "spec.trainer.gpus is 0, and the verl backend trains and serves on GPUs: set spec.trainer.gpus "
            "to the GPUs of the trainer pod (1 or more), or use spec.trainer.backend: Reference on CPU"
        )
    # Owned keys in verlOverrides cannot reach here: loading the run refused them (TrainerSpec's validator).
    settings = VerlSettings(
        model_path=spec.model.path,
        tool_call_parser=vllm_tool_call_parser(spec.model.tool_call_parser),
        train_batch_size=spec.train_batch_size,
        rollout_n=spec.rollout.samples_per_prompt,
        gpus=spec.trainer.node_gpus,
        nnodes=spec.trainer.nodes,
        total_steps=spec.total_steps,
        rollout_is=spec.rollout_correction.rollout_is,
        rollout_is_threshold=spec.rollout_correction.threshold,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else "checkpoints",
        max_prompt_length=spec.data.max_prompt_length,
        max_response_length=spec.data.max_response_length,
        experiment_name=run.name or "asyncrl-run",
        overrides=flatten_overrides(spec.trainer.verl_overrides or {}),
        schedule_steps=schedule_horizon(run, prompt_count=prompt_count)[0],
    )
    check_max_model_len(settings)
    return settings


def check_max_model_len(settings: VerlSettings) -> None:
    """A `max_model_len` in verlOverrides shorter than the longest row is refused: vLLM would stop or refuse
    the calls of conversations the adapter still trains on. Null is allowed (vLLM's own: the model's)."""
    value = settings.overrides.get(MAX_MODEL_LEN_KEY, settings.overrides.get("+" + MAX_MODEL_LEN_KEY))
    if not isinstance(value, int) or isinstance(value, bool) or value >= settings.longest_row:
        return  # unset, null, or a value of the wrong type (refused with verl's type when composed)
    raise VerlConfigError(
        f"spec.trainer.verlOverrides: {MAX_MODEL_LEN_KEY!r} = {value} is shorter than the longest training "
        f"row, spec.data.maxPromptLength + spec.data.maxResponseLength = {settings.max_prompt_length} + "
        f"{settings.max_response_length} = {settings.longest_row} tokens, so vLLM would cut or refuse model "
        f"calls the adapter trains on: remove it (asyncrl sets {settings.longest_row}), raise it to at least "
        f"{settings.longest_row}, or lower the two lengths"
    )


def served_context(run: AsyncTrainingRun) -> int | None:
    """vLLM's max_model_len for this run: verlOverrides' value, else the longest row; None: vLLM's own."""
    spec = run.spec
    overrides = flatten_overrides(spec.trainer.verl_overrides or {})
    for key in (MAX_MODEL_LEN_KEY, "+" + MAX_MODEL_LEN_KEY):
        if key in overrides:
            value = overrides[key]
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return int(spec.data.max_prompt_length + spec.data.max_response_length)


def context_length_error(model_config: Mapping[str, Any], run: AsyncTrainingRun) -> str | None:
    """Why vLLM would refuse this run's context for the model (verl raises at the server's start, minutes
    into the run: vllm_async_server.py, "max_model_len ... max_position_embeddings"), or None."""
    context, positions = served_context(run), model_config.get("max_position_embeddings")
    if context is None or not isinstance(positions, int) or context <= positions:
        return None
    return (
        f"vLLM's context would be {context} tokens (spec.data.maxPromptLength + maxResponseLength, or "
        f"{MAX_MODEL_LEN_KEY} in verlOverrides) but the model has {positions} positions "
        f"(max_position_embeddings in its config.json)"
    )


def context_length_fix(model_config: Mapping[str, Any]) -> str:
    positions = model_config.get("max_position_embeddings")
    return f"lower spec.data.maxPromptLength and maxResponseLength so that they add up to at most {positions}"


def compose_verl_config(settings: VerlSettings) -> Any:
    """verl's trainer config (an OmegaConf DictConfig) for this run, checked by verl's `validate_config`."""
    import verl.trainer.config as verl_config_package
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = os.path.dirname(os.path.abspath(verl_config_package.__file__))
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name=VERL_CONFIG_NAME)
    OmegaConf.set_struct(config, True)
    for key, value in settings.defaults().items():
        _set(config, key, value, source="asyncrl's defaults")
    for key, value in settings.overrides.items():
        _set(config, key, value, source="spec.trainer.verlOverrides")
    for key, value in settings.owned().items():
        _set(config, key, value, source="the run")
    check_registered_names(config)
    validate(config)
    return config


# verl settings whose value names an entry of one of verl's registries: verl looks it up only at the first
# update (an unknown name raises there, on the GPU machine), so it is checked here against the registry.
REGISTERED_NAME_KEYS = {
    "algorithm.adv_estimator": ("ADV_ESTIMATOR_REGISTRY", "advantage estimators"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("POLICY_LOSS_REGISTRY", "policy losses"),
}


def check_registered_names(config: Any) -> None:
    """`algorithm.adv_estimator: grpoo` is refused naming the nearest of verl's names."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    absent = object()  # a verl without the key: nothing to check (a null value is checked: verl fails on it)
    for key, (registry_name, what) in REGISTERED_NAME_KEYS.items():
        value = OmegaConf.select(config, key, default=absent)
        registry = getattr(core_algos, registry_name)
        if value is absent or str(value) in registry:
            continue
        known = sorted(registry)
        folded = {name.lower(): name for name in known}
        close = difflib.get_close_matches(str(value), known, n=1) or (
            [folded[str(value).lower()]] if str(value).lower() in folded else []
        )
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise VerlConfigError(
            f"spec.trainer.verlOverrides: {key!r} = {value!r} is not one of verl's {what}{hint} "
            f"(verl has: {', '.join(known)})"
        )


def validate(config: Any) -> None:
    """verl's own check of the whole config (batch-size divisibility, micro-batches, parallelism...)."""
    from hydra.errors import InstantiationException
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
    except (AssertionError, ValueError, TypeError, InstantiationException) as error:
        reason = error.__cause__ if isinstance(error, InstantiationException) and error.__cause__ else error
        raise VerlConfigError(
            f"verl refuses this configuration: {reason} (set by the run, asyncrl's defaults or "
            "spec.trainer.verlOverrides)"
        ) from error


def _set(config: Any, key: str, value: Any, *, source: str) -> None:
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    adds = key.startswith("+")
    bare = key.lstrip("+")
    if not adds:
        _check_type(config, bare, value, source=source)
    try:
        if adds:
            with open_dict(config):
                OmegaConf.update(config, bare, value, merge=True, force_add=True)
        else:
            OmegaConf.update(config, bare, value, merge=True)
    except (ConfigAttributeError, ConfigKeyError) as error:
        known = sorted(_leaf_keys(config))
        close = difflib.get_close_matches(bare, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise VerlConfigError(
            f"{source}: {bare!r} is not a verl setting.{hint} To add a key verl does not declare, write "
            f"'+{bare}'."
        ) from error
    except ValidationError as error:
        raise VerlConfigError(
            f"{source}: {bare!r} = {value!r} is refused by verl's config: {error.msg}"
        ) from error


def _check_type(config: Any, key: str, value: Any, *, source: str) -> None:
    """verl's YAML nodes are untyped: compare with the default's type (`lr: abc` fails here, not on a GPU)."""
    from omegaconf import OmegaConf

    current = OmegaConf.select(config, key, default=None, throw_on_missing=False)
    if current is None or value is None or OmegaConf.is_config(current):
        return
    expected = _kind(current)
    if expected != _kind(value) and not (expected == "number" and _kind(value) == "integer"):
        article = "an" if expected[0] in "aeiou" else "a"
        raise VerlConfigError(
            f"{source}: {key!r} takes {article} {expected} (verl's default is {current!r}), not {value!r}"
        )


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple) or (hasattr(value, "__len__") and not isinstance(value, Mapping)):
        return "list"
    return type(value).__name__


def _leaf_keys(config: Any, prefix: str = "") -> Iterator[str]:
    from omegaconf import DictConfig

    for key in config:
        name = f"{prefix}{key}"
        try:
            child = config._get_node(key)
        except Exception:  # pragma: no cover - a node OmegaConf cannot hand out is simply not suggested
            continue
        if isinstance(child, DictConfig):
            yield from _leaf_keys(child, prefix=name + ".")
        else:
            yield name
