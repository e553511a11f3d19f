"""Every name the trainer logs is verl's (where verl has the quantity) or in asyncrl's own namespaces, once.

The step loop's whole line is read from a real loop (fake gateway, a backend that trains nothing); the
update's names from a real Reference update, whose rollout-correction diagnostics come from verl's helper.
"""

from __future__ import annotations

import re
from pathlib import Path

from asyncrl import metric_names as names
from tests.trainer.backends.support import random_rows, small_backend
from tests.trainer.test_step_loop import _agents, _harness, _run, _settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_name_the_step_loop_logs_is_verls_or_in_an_own_namespace(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=2))
    harness.gateway.on_groups_created = _agents(harness)
    _run(harness)
    lines = harness.metrics()
    assert len(lines) == 2
    logged = {name for line in lines for name in line if name != "step"}
    assert {names.SCORE_MEAN, names.STEP_SECONDS, names.ACTOR_PG_LOSS, names.CARRY_OVER_ROLLOUTS} <= logged
    assert sorted(name for name in logged if not names.is_verl_or_own(name)) == []
    assert sorted(logged & set(names.READ_ALIASES)) == []  # no old name is written any more


def test_a_reference_update_logs_verls_names_and_each_quantity_once() -> None:
    rows = random_rows(groups=2, per_group=2, prompt_tokens=8, response_tokens=8)
    logged = small_backend().update_blocking(rows, step=0).as_dict()
    assert sorted(name for name in logged if not names.is_verl_or_own(name)) == []
    assert {names.ACTOR_PG_LOSS, names.ACTOR_GRAD_NORM, names.TOTAL_NUM_TOKENS} <= set(logged)
    assert "rollout_corr/rollout_is_mean" in logged  # the importance weights, under verl's name only
    assert not any("importance_weight" in name or "reward_mean" in name for name in logged)


def test_the_metrics_doc_lists_every_verl_name_and_every_old_name() -> None:
    doc = DOC.read_text()
    documented = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)+)`", doc))
    verl_spelled_out = {name for name in names.VERL_NAMES if "_length/" not in name}  # a table per stat
    assert sorted(verl_spelled_out - documented) == []
    assert sorted(set(names.READ_ALIASES) - documented) == []
    assert sorted(namespace for namespace in names.OWN_NAMESPACES if f"`{namespace}*`" not in doc) == []
