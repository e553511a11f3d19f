"""`spec.data.maxPromptLength` / `maxResponseLength` reach every place that bounds a row, as the trainer runs.

The trainer reads the run file the operator mounts (`load_manifest`), builds verl's config
(`build_verl_backend`) and the loop's adapter settings (`LoopSettings.of_run`) from it. The same two numbers
must arrive at verl's data and rollout lengths, vLLM's context (`rollout.max_model_len`: their sum) and the
adapter, which drops longer prompts and cuts longer responses. The input is examples/run-gpu.yaml as shipped
(2048 + 2048, not the defaults) and as a user edits it (1000 + 3000: a swapped pair shows too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api.types.verl_layout import DEFAULT_MAX_PROMPT_LENGTH, DEFAULT_MAX_RESPONSE_LENGTH
from asyncrl.trainer.adapter import adapt_rollout
from asyncrl.trainer.backends.verl.batch import build_trajectory_batch
from asyncrl.trainer.backends.verl.config import MAX_MODEL_LEN_KEY, context_length_error, context_length_fix
from asyncrl.trainer.loop import LoopSettings
from asyncrl.trainer.main import build_verl_backend, load_manifest
from asyncrl.trainer.preflight import check_context_length
from tests.trainer.test_adapter import call, document

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "run-gpu.yaml"


def example_run_file(
    tmp_path: Path, *, lengths: tuple[int, int] | None = None, overrides: dict[str, Any] | None = None
) -> tuple[Path, dict[str, Any]]:
    """examples/run-gpu.yaml written where the trainer reads it, with the user's edits; and its manifest."""
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    if lengths is not None:
        manifest["spec"]["data"]["maxPromptLength"], manifest["spec"]["data"]["maxResponseLength"] = lengths
    manifest["spec"]["trainer"]["verlOverrides"].update(overrides or {})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path, manifest


def verl_config_of(path: Path) -> Any:
    backend = build_verl_backend(load_manifest(path), checkpoint_dir=None, prompt_count=16)
    return backend.config  # type: ignore[attr-defined]


def longest_and_overlong_rollout(*, prompt: int, response: int) -> dict[str, Any]:
    """Two conversations: one at the prompt limit whose response runs 3 tokens over, one whose prompt is a
    token over (distinct token ids: neither extends the other)."""
    return document(
        call([1] * prompt, [2] * (response + 3), started_at=1.0),
        call([3] * (prompt + 1), [4], started_at=2.0),
    )


@pytest.mark.parametrize("lengths", [None, (1000, 3000)], ids=["as-shipped", "edited"])
def test_the_lengths_of_the_gpu_example_reach_verl_vllm_and_the_adapter(
    tmp_path: Path, lengths: tuple[int, int] | None
) -> None:
    path, manifest = example_run_file(tmp_path, lengths=lengths)
    prompt, response = (
        manifest["spec"]["data"]["maxPromptLength"],
        manifest["spec"]["data"]["maxResponseLength"],
    )
    # Not the defaults: a length dropped on the way would fall back to them and be seen.
    assert prompt != DEFAULT_MAX_PROMPT_LENGTH
    assert response != DEFAULT_MAX_RESPONSE_LENGTH

    config = verl_config_of(path)
    assert (config.data.max_prompt_length, config.data.max_response_length) == (prompt, response)
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.prompt_length, rollout.response_length) == (prompt, response)
    assert rollout.max_model_len == prompt + response

    adapter = LoopSettings.of_run(load_manifest(path).spec, checkpoint_dir=None).adapter
    assert (adapter.max_prompt_tokens, adapter.max_response_tokens) == (prompt, response)
    result = adapt_rollout(
        longest_and_overlong_rollout(prompt=prompt, response=response), group_id="g1", config=adapter
    )
    (row,) = result.rows
    assert (len(row.prompt_token_ids), len(row.response_token_ids)) == (prompt, response)
    assert row.truncated
    assert (result.counts.truncated_rows, result.counts.dropped_long_prompt) == (1, 1)
    # The longest row the adapter emits is exactly vLLM's context, as verl's records carry it.
    (record,) = build_trajectory_batch(result.rows, step=0).records
    assert len(record["input_ids"]) == rollout.max_model_len


def test_a_max_model_len_in_verl_overrides_replaces_the_longest_row(tmp_path: Path) -> None:
    path, _ = example_run_file(tmp_path, overrides={MAX_MODEL_LEN_KEY: 8192})
    assert verl_config_of(path).actor_rollout_ref.rollout.max_model_len == 8192


def test_a_null_max_model_len_leaves_vllm_the_models_maximum(tmp_path: Path) -> None:
    path, _ = example_run_file(
        tmp_path, overrides={"actor_rollout_ref": {"rollout": {"max_model_len": None}}}
    )
    assert verl_config_of(path).actor_rollout_ref.rollout.max_model_len is None


def test_a_max_model_len_shorter_than_the_longest_row_is_refused_with_the_numbers(tmp_path: Path) -> None:
    path, _ = example_run_file(tmp_path, overrides={MAX_MODEL_LEN_KEY: 4000})
    with pytest.raises(SystemExit) as raised:
        verl_config_of(path)
    message = str(raised.value)
    assert f"{MAX_MODEL_LEN_KEY!r} = 4000 is shorter than the longest training row" in message
    assert "spec.data.maxPromptLength + spec.data.maxResponseLength = 2048 + 2048 = 4096" in message
    assert "remove it" in message


@pytest.mark.parametrize(
    ("overrides", "positions", "refused"),
    [
        ({}, 4096, False),  # the example's 2048 + 2048: exactly the model's positions
        ({}, 4095, True),
        ({MAX_MODEL_LEN_KEY: 8192}, 32768, False),
        ({MAX_MODEL_LEN_KEY: 8192}, 4096, True),  # the override, not the longest row, is what vLLM gets
        ({"actor_rollout_ref": {"rollout": {"max_model_len": None}}}, 1024, False),  # vLLM takes the model's
    ],
)
def test_a_context_longer_than_the_models_positions_is_refused_before_vllm_starts(
    tmp_path: Path, overrides: dict[str, Any], positions: int, refused: bool
) -> None:
    """verl raises it at the rollout server's start, minutes into a GPU run; preflight and validate say it
    first, from the model's config.json."""
    path, _ = example_run_file(tmp_path, overrides=overrides)
    run = load_manifest(path)
    model_config = {"max_position_embeddings": positions}
    error = context_length_error(model_config, run)
    assert (error is not None) == refused, error
    if refused:
        assert f"the model has {positions} positions (max_position_embeddings in its config.json)" in error
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(model_config))
        run.spec.model.path = str(model)
        check = check_context_length(run)
        assert not check.ok
        assert check.fix == context_length_fix(model_config)
        assert f"add up to at most {positions}" in check.fix
