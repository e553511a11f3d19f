"""verl's reward loop starts no workers: asyncrl's rewards come from the agents, through the gateway.

verl 0.9.1's v1 trainer builds a `RewardLoopManager` in any case (trainer_base.py, `_setup`), and that starts
`reward.num_workers` Ray actors (8 by verl's default), each loading the tokenizer. asyncrl sets 0. The slow
test builds verl's own manager from the composed config on a local Ray and looks for its actors.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api import load_run
from asyncrl.trainer.backends.verl.config import compose_verl_config, verl_settings
from tests.trainer.backends.verl_support import verl_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "run-gpu.yaml"


def test_the_composed_config_starts_no_reward_workers() -> None:
    assert verl_config().reward.num_workers == 0
    example = load_run(yaml.safe_load(EXAMPLE.read_text()))
    assert compose_verl_config(verl_settings(example, checkpoint_dir=None)).reward.num_workers == 0


def test_reward_workers_stay_overridable() -> None:
    config = verl_config(trainer={"verlOverrides": {"reward.num_workers": 2}})
    assert config.reward.num_workers == 2


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_verls_reward_loop_manager_starts_no_actor_with_the_composed_config(local_ray: Any) -> None:
    from verl.experimental.reward_loop import RewardLoopManager

    manager = RewardLoopManager(config=verl_config(), rm_resource_pool=None)
    assert manager.reward_loop_workers == []
    names = [actor["name"] for actor in local_ray.util.list_named_actors(all_namespaces=True)]
    assert not [name for name in names if name.startswith("reward_loop_worker_")]
