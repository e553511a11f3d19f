"""A run's own top_p/top_k are refused (issue 36, item 3a): vLLM's captured log-probs are those after its
top-k/top-p filter, the trainer's recomputed ones are not, so the importance weights would be biased.
`load_run` is what `asyncrl validate`, local mode and the operator all call, so each refuses alike."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.api import InvalidRunError, load_run
from asyncrl.rollout_sampling import RolloutSampling, rollout_sampling_of

from .conftest import load_example

FIELD = "spec.trainer.verlOverrides"


def run_with(overrides: dict[str, Any], *, backend: str = "Verl") -> dict[str, Any]:
    manifest = copy.deepcopy(load_example("run-minimal.yaml"))
    gpus = 1 if backend == "Verl" else 0
    manifest["spec"]["trainer"] = {"backend": backend, "gpus": gpus, "verlOverrides": overrides}
    return manifest


def refusal(overrides: dict[str, Any], *, backend: str = "Verl") -> str:
    with pytest.raises(InvalidRunError) as raised:
        load_run(run_with(overrides, backend=backend))
    (error,) = raised.value.errors
    assert error.path == FIELD
    return error.message


@pytest.mark.parametrize(
    ("overrides", "key", "shown", "fix"),
    [
        ({"actor_rollout_ref.rollout.top_p": 0.5}, "top_p", "0.5", "set it to 1.0"),
        ({"actor_rollout_ref": {"rollout": {"top_p": 0.95}}}, "top_p", "0.95", "set it to 1.0"),
        ({"+actor_rollout_ref.rollout.top_p": 0.9}, "top_p", "0.9", "set it to 1.0"),
        ({"actor_rollout_ref.rollout.top_k": 5}, "top_k", "5", "set it to -1 (or 0)"),
        ({"actor_rollout_ref": {"rollout": {"top_k": 40}}}, "top_k", "40", "set it to -1 (or 0)"),
        ({"+actor_rollout_ref": {"rollout": {"top_k": 1}}}, "top_k", "1", "set it to -1 (or 0)"),
    ],
)
@pytest.mark.parametrize("backend", ["Verl", "Reference"])
def test_a_top_p_or_top_k_filter_is_refused_naming_the_key_the_value_why_and_the_fix(
    overrides: dict[str, Any], key: str, shown: str, fix: str, backend: str
) -> None:
    message = refusal(overrides, backend=backend)
    assert message.startswith(f"actor_rollout_ref.rollout.{key} is {shown}, but training needs {key} off")
    assert "log-prob after the" in message
    assert "the trainer recomputes it without any filter" in message
    assert "importance weight would be biased" in message
    assert f"remove actor_rollout_ref.rollout.{key} from spec.trainer.verlOverrides or {fix}" in message


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"actor_rollout_ref.rollout.top_p": 1},
        {"actor_rollout_ref.rollout.top_p": 1.0, "actor_rollout_ref.rollout.top_k": -1},
        {"actor_rollout_ref": {"rollout": {"top_k": 0, "temperature": 0.6}}},
    ],
)
def test_no_filter_is_accepted_at_any_temperature(overrides: dict[str, Any]) -> None:
    run = load_run(run_with(overrides))
    assert run.spec.trainer.rollout_sampling().top_p == 1.0
    assert run.spec.trainer.rollout_sampling().top_k in (-1, 0)


def test_the_plus_spelling_sets_the_runs_temperature_as_it_sets_verls() -> None:
    """verl's config takes `+key` as the key itself (force-added over the declared one): the gateway must
    enforce that same temperature, or it samples at one and the trainer recomputes at another."""
    run = load_run(run_with({"+actor_rollout_ref.rollout.temperature": 0.7}))
    assert run.spec.trainer.rollout_sampling() == RolloutSampling(temperature=0.7)
    message = refusal(
        {"actor_rollout_ref.rollout.temperature": 0.7, "+actor_rollout_ref.rollout.temperature": 0.9}
    )
    assert "set twice" in message


@pytest.mark.parametrize("top_k", [-2, -100])
def test_a_top_k_below_minus_one_is_refused(top_k: int) -> None:
    assert "top_k must be -1 or 0 (off)" in refusal({"actor_rollout_ref.rollout.top_k": top_k})


@given(top_p=st.floats(allow_nan=True, allow_infinity=True).filter(lambda value: value != 1))
def test_every_top_p_but_one_is_refused(top_p: float) -> None:
    with pytest.raises(ValueError, match="top_p"):
        rollout_sampling_of({"actor_rollout_ref.rollout.top_p": top_p})


@given(top_k=st.integers(min_value=1))
def test_every_positive_top_k_is_refused(top_k: int) -> None:
    with pytest.raises(ValueError, match="importance weight would be biased"):
        rollout_sampling_of({"actor_rollout_ref.rollout.top_k": top_k})


@given(temperature=st.floats(min_value=1e-3, max_value=10.0))
def test_any_positive_temperature_without_a_filter_is_the_runs(temperature: float) -> None:
    sampling = rollout_sampling_of(
        {"actor_rollout_ref.rollout.temperature": temperature, "actor_rollout_ref.rollout.top_k": 0}
    )
    assert math.isclose(sampling.temperature, temperature)
    assert (sampling.top_p, sampling.top_k) == (1.0, 0)
