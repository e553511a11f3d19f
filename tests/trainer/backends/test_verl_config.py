"""The run → verl's trainer config, composed from verl's own Hydra files and checked by verl, on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.api import InvalidRunError, load_run
from asyncrl.api.types.verl_overrides import OWNED_VERL_KEYS, flatten_overrides
from asyncrl.trainer.backends.verl.config import VerlConfigError, compose_verl_config, verl_settings
from tests.trainer.backends.verl_support import verl_config, verl_manifest, verl_run


def test_the_run_decides_batch_sizes_n_model_gpus_correction_and_the_colocate_async_mode() -> None:
    config = verl_config(
        trainBatchSize=3,
        rollout={"samplesPerPrompt": 4},  # 12 rows per update over 2 GPUs
        **{"async": {"enabled": True, "windowSize": 6}},
        totalSteps=9,
        model={"name": "policy", "path": "/models/qwen"},
        trainer={"gpus": 2},
        rolloutCorrection={"mode": "Sequence", "threshold": 3.5},
    )
    assert config.data.train_batch_size == 3
    assert config.actor_rollout_ref.rollout.n == 4
    assert config.actor_rollout_ref.model.path == "/models/qwen"
    assert config.trainer.n_gpus_per_node == 2
    assert config.trainer.nnodes == 1
    assert config.trainer.total_training_steps == 9
    assert config.trainer.use_v1 is True
    assert config.trainer.v1.trainer_mode == "colocate_async"
    assert config.actor_rollout_ref.rollout.name == "vllm"
    assert config.actor_rollout_ref.rollout.skip_tokenizer_init is False  # the OpenAI server needs it
    # vLLM's own default, raw_logprobs, ignores the temperature: the importance weights would be biased.
    assert config.actor_rollout_ref.rollout.logprobs_mode == "processed_logprobs"
    assert config.transfer_queue.enable is True
    assert config.algorithm.rollout_correction.rollout_is == "sequence"
    assert config.algorithm.rollout_correction.rollout_is_threshold == 3.5
    # verl's own rollout-correction keys that the run does not set keep verl's defaults.
    assert config.algorithm.rollout_correction.rollout_rs is None
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 3  # one optimizer step per update


def test_rollout_correction_off_is_verls_null() -> None:
    config = verl_config(rolloutCorrection={"mode": "Disabled"})
    assert config.algorithm.rollout_correction.rollout_is is None


def test_overrides_flat_or_nested_reach_verl_and_may_replace_asyncrls_defaults() -> None:
    flat = verl_config(
        trainer={
            "verlOverrides": {
                "actor_rollout_ref.actor.optim.lr": 3e-6,
                "actor_rollout_ref.rollout.gpu_memory_utilization": 0.7,
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 20000,
                "algorithm.rollout_correction.rollout_rs": "token_k1",
            }
        }
    )
    nested = verl_config(
        trainer={
            "verlOverrides": {
                "actor_rollout_ref": {
                    "actor": {"optim": {"lr": 3e-6}},
                    "rollout": {"gpu_memory_utilization": 0.7},
                },
                "actor_rollout_ref.actor": {"ppo_max_token_len_per_gpu": 20000},
                "algorithm.rollout_correction": {"rollout_rs": "token_k1"},
            }
        }
    )
    for config in (flat, nested):
        assert config.actor_rollout_ref.actor.optim.lr == 3e-6
        assert config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.7
        assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 20000  # asyncrl's default is 16384
        assert config.algorithm.rollout_correction.rollout_rs == "token_k1"


def test_a_plus_adds_a_key_verl_does_not_declare() -> None:
    added = "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space"
    config = verl_config(trainer={"verlOverrides": {added: 4}})
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 4


@pytest.mark.parametrize(
    ("parser", "engine_kwargs"),
    [
        (None, {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}),  # the default
        ("llama3_json", {"enable_auto_tool_choice": True, "tool_call_parser": "llama3_json"}),
        # verl drops None and writes no flag for False: vLLM starts without tool parsing.
        ("Disabled", {"enable_auto_tool_choice": False, "tool_call_parser": None}),
    ],
)
def test_the_tool_call_parser_is_in_the_engine_kwargs_verl_turns_into_vllms_flags(
    parser: str | None, engine_kwargs: dict
) -> None:
    """verl 0.9.1's vLLMHttpServer.launch_server passes rollout.engine_kwargs.vllm to vLLM's server as its
    command-line flags; without --enable-auto-tool-choice and --tool-call-parser, calls with tools get 400."""
    model = {"name": "policy", "path": "/models/qwen"} | ({"toolCallParser": parser} if parser else {})
    added = "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space"  # the user's own engine flags stay
    config = verl_config(model=model, trainer={"verlOverrides": {added: 4}})
    vllm = config.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert dict(vllm) == {"swap_space": 4, **engine_kwargs}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"data.train_batch_size": 8}, "spec.trainBatchSize"),
        ({"actor_rollout_ref.rollout.n": 8}, "spec.rollout.samplesPerPrompt"),
        ({"actor_rollout_ref": {"rollout": {"n": 8}}}, "spec.rollout.samplesPerPrompt"),
        ({"+data.gen_batch_size": 2}, "spec.trainBatchSize"),
        ({"trainer.v1.trainer_mode": "sync"}, "colocate_async"),
        ({"algorithm.rollout_correction.rollout_is": "token"}, "spec.rolloutCorrection.mode"),
        ({"trainer.n_gpus_per_node": 8}, "spec.trainer.gpus"),
        ({"actor_rollout_ref.rollout.logprobs_mode": "raw_logprobs"}, "the sampled distribution"),
        ({"data.max_prompt_length": 2048}, "spec.data.maxPromptLength"),
        ({"data": {"max_response_length": 2048}}, "spec.data.maxResponseLength"),
        (
            {"+actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser": "llama3_json"},
            "spec.model.toolCallParser",
        ),
        (
            {
                "actor_rollout_ref": {
                    "rollout": {"engine_kwargs": {"vllm": {"enable_auto_tool_choice": False}}}
                }
            },
            "spec.model.toolCallParser",
        ),
    ],
)
def test_keys_the_run_owns_are_rejected_when_the_manifest_is_loaded(overrides: dict, named: str) -> None:
    manifest = verl_manifest(trainer={"verlOverrides": overrides})
    with pytest.raises(InvalidRunError) as raised:
        load_run(manifest)
    message = str(raised.value)
    assert "spec.trainer.verlOverrides" in message
    assert named in message
    assert "remove it" in message


def test_every_owned_key_is_one_the_backend_actually_sets() -> None:
    settings = verl_settings(verl_run(totalSteps=3), checkpoint_dir=Path("/ckpt"))
    assert set(OWNED_VERL_KEYS) == set(settings.owned())
    config = compose_verl_config(settings)
    assert config.trainer.default_local_dir == "/ckpt"


def test_flatten_keeps_the_plus_on_the_whole_key() -> None:
    assert flatten_overrides({"+a": {"b": 1, "c": {"d": 2}}, "e.f": 3}) == {"+a.b": 1, "+a.c.d": 2, "e.f": 3}


def test_an_unknown_key_is_named_with_the_nearest_verl_key() -> None:
    with pytest.raises(VerlConfigError) as raised:
        verl_config(trainer={"verlOverrides": {"actor_rollout_ref.rollout.gpu_memory_utilisation": 0.8}})
    message = str(raised.value)
    assert "'actor_rollout_ref.rollout.gpu_memory_utilisation' is not a verl setting" in message
    assert "Did you mean 'actor_rollout_ref.rollout.gpu_memory_utilization'?" in message
    assert "'+actor_rollout_ref.rollout.gpu_memory_utilisation'" in message  # how to add it on purpose


def test_a_value_of_the_wrong_type_is_refused_before_any_gpu_work() -> None:
    # (The learning rate's type is refused earlier, when the run is loaded: tests/api/test_types.py.)
    key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    with pytest.raises(VerlConfigError, match=rf"'{key}' takes a number"):
        verl_config(trainer={"verlOverrides": {key: "half"}})


@pytest.mark.parametrize(
    ("key", "value", "nearest"),
    [
        ("algorithm.adv_estimator", "grpoo", "grpo"),
        ("algorithm.adv_estimator", "GRPO", "grpo"),
        ("algorithm.adv_estimator", None, None),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "vanila", "vanilla"),
    ],
)
def test_a_name_verl_looks_up_only_at_the_first_update_is_refused_with_the_nearest(
    key: str, value: str | None, nearest: str | None
) -> None:
    with pytest.raises(VerlConfigError) as raised:
        verl_config(trainer={"verlOverrides": {key: value}})
    assert f"{key!r} = {value!r} is not one of verl's" in str(raised.value)
    if nearest is not None:
        assert f"did you mean {nearest!r}?" in str(raised.value)


def test_verls_own_validation_runs_and_its_reason_is_shown() -> None:
    # Static micro-batches without a micro-batch size: verl's ActorConfig refuses it.
    with pytest.raises(VerlConfigError) as raised:
        verl_config(trainer={"verlOverrides": {"actor_rollout_ref.actor.use_dynamic_bsz": False}})
    assert "verl refuses this configuration" in str(raised.value)
    assert "ppo_micro_batch_size" in str(raised.value)


def test_zero_gpus_is_a_clear_error() -> None:
    run = verl_run(trainer={"gpus": 0})
    with pytest.raises(VerlConfigError, match=r"spec.trainer.gpus is 0.*backend: Reference"):
        verl_settings(run, checkpoint_dir=None)


def test_the_trainer_command_refuses_a_bad_verl_setting_at_once(tmp_path: Path) -> None:
    """The user's path: the trainer container's command with the run file the operator mounts."""
    manifest = verl_manifest(trainer={"verlOverrides": {"actor_rollout_ref.actor.optim.lrr": 1e-6}})
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(manifest))
    env = {**os.environ, "ASYNCRL_GATEWAY_KEY": "k" * 32, "WANDB_MODE": "disabled"}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "trainer",
            f"--config={run_file}",
            "--gateway-url=http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert completed.returncode != 0
    assert "'actor_rollout_ref.actor.optim.lrr' is not a verl setting" in completed.stderr
    assert "Did you mean 'actor_rollout_ref.actor.optim.lr'?" in completed.stderr


def test_training_packs_rows_with_sdpa_for_an_image_without_flash_attn_and_can_be_switched() -> None:
    default = verl_config()
    assert default.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    # Packed rows (remove-padding): a micro-batch is its real tokens, never rows x longest row.
    assert default.actor_rollout_ref.model.use_remove_padding is True
    assert default.actor_rollout_ref.actor.use_remove_padding is True  # verl's actor reads the model's
    fast = verl_config(
        trainer={
            "verlOverrides": {
                "actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2",
            }
        }
    )
    assert fast.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
    assert fast.actor_rollout_ref.model.use_remove_padding is True


def test_the_gpu_example_is_a_valid_run_that_verl_accepts() -> None:
    manifest = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples" / "run-gpu.yaml").read_text())
    run = load_run(manifest)
    config = compose_verl_config(verl_settings(run, checkpoint_dir=Path("/var/lib/asyncrl/checkpoints")))
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.data.train_batch_size == 8
    assert config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5
