"""The staleness-correction benchmark (benchmarks/staleness_correction.py): a tiny run end to end, and its
figures on made-up curves.

The tiny run (4 updates, 1 seed, ages 0 and 2, Disabled and Token) checks what would make the benchmark's
table a lie: that age k really trains on rows sampled by the policy k updates old, that the correction
settings reach the update (no weights when Disabled, weights when Token), that every (setting, age) has its
row, and that runs already recorded are not run again.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("staleness_correction")


@pytest.fixture(scope="module")
def stats() -> ModuleType:
    return load_benchmark("staleness_correction_stats")


TINY = ["--steps", "4", "--seeds", "0", "--ages", "0", "2", "--settings", "disabled", "token"]


@pytest.fixture(scope="module")
def tiny(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    records = tmp_path_factory.mktemp("staleness") / "records.jsonl"
    runs = bench.main([*TINY, "--eval-samples", "1", "--records", str(records)])
    return records, runs


@pytest.mark.slow
def test_age_k_trains_on_rows_sampled_by_the_policy_k_updates_old(tiny: tuple[Path, list[Any]]) -> None:
    _records, runs = tiny
    by_age = {(r.setting, r.age): r.behaviour_versions for r in runs}
    for setting in ("disabled", "token"):
        assert by_age[(setting, 0)] == (0, 1, 2, 3)
        assert by_age[(setting, 2)] == (0, 0, 0, 1)  # max(0, step - 2): the initial policy until step 2


@pytest.mark.slow
def test_disabled_trains_without_weights_and_token_with_capped_ones(tiny: tuple[Path, list[Any]]) -> None:
    _records, runs = tiny
    disabled = next(r for r in runs if r.setting == "disabled" and r.age == 2)
    token = next(r for r in runs if r.setting == "token" and r.age == 2)
    assert disabled.weight_means == (None,) * 4
    assert all(w is not None for w in token.weight_means)
    # Stale rows (steps 1-3 train on an older policy's samples) move the weights off 1, capped at 2.
    assert any(abs(w - 1.0) > 1e-3 for w in token.weight_means[1:])
    assert max(token.weight_maxes) <= 2.0 + 1e-5
    assert all(len(r.eval_rewards) == 5 for r in runs)


@pytest.mark.slow
def test_every_setting_and_age_has_its_row_and_recorded_runs_are_not_run_again(
    bench: ModuleType, tiny: tuple[Path, list[Any]]
) -> None:
    records, runs = tiny
    again = bench.main([*TINY, "--eval-samples", "1", "--records", str(records)])
    assert again == runs
    assert len(records.read_text().splitlines()) == 4
    text = bench.report(runs, last=4, thresholds=[0.3], ages=[0, 2])
    for setting in ("disabled", "token"):
        assert [line.split()[:2] for line in text.splitlines() if line.startswith(setting + " ")] == [
            [setting, "0"],
            [setting, "2"],
        ]
        assert f"target {setting} age 2 within 10 % of sync" in text


def test_the_last_steps_mean_leaves_out_the_reward_before_training(stats: ModuleType) -> None:
    assert stats.last_mean([0.9, 0.1, 0.2, 0.3, 0.4, 0.5], last=4) == pytest.approx(0.35)
    assert stats.first_step_reaching([0.0, 0.2, 0.35, 0.3], threshold=0.3) == 2
    assert stats.first_step_reaching([0.0, 0.2], threshold=0.3) is None


def test_each_age_is_compared_with_the_same_setting_at_age_0(stats: ModuleType) -> None:
    def curve(setting: str, age: int, seed: int, rewards: list[float]) -> object:
        n = len(rewards) - 1
        return stats.RunCurve(
            setting=setting,
            age=age,
            seed=seed,
            eval_rewards=tuple(rewards),
            behaviour_versions=tuple(range(n)),
            weight_means=(None,) * n,
            weight_maxes=(None,) * n,
            masked_fractions=(None,) * n,
            seconds=1.0,
        )

    runs = [
        curve("a", 0, 0, [0.0, 0.4, 0.8]),
        curve("a", 0, 1, [0.0, 0.2, 0.6]),
        curve("a", 2, 0, [0.0, 0.1, 0.4]),
        curve("a", 2, 1, [0.0, 0.1, 0.2]),
        curve("b", 0, 0, [0.0, 0.1, 0.1]),
    ]
    rows = stats.summarise_all(runs, last=1, thresholds=[0.3])
    assert [(r.setting, r.age) for r in rows] == [("a", 0), ("a", 2), ("b", 0)]
    assert stats.ratio_to_sync(rows, setting="a", age=2) == pytest.approx(0.3 / 0.7)
    assert rows[0].to_threshold[0.3].median == 1.5  # steps 1 and 2
    assert rows[1].to_threshold[0.3].median is None  # one seed of two: not most of them
    assert stats.ratio_to_sync(rows, setting="b", age=2) is None
