"""Every verl (and TransferQueue) name the verl backend calls, with the parameters it passes.

The backend's GPU path cannot run here, so a verl upgrade that renames or reshapes any of these must break
this test rather than a training run on a cluster. Most are verl's v1 trainer internals (`_balance_batch`,
`_compute_advantage`...): the very steps verl's own `_step_once` runs after sampling.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transfer_queue as tq
import verl.trainer.config as verl_config_package
from transfer_queue import KVBatchMeta
from verl.checkpoint_engine import CheckpointEngineManager
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout.llm_server import LLMServerManager

from asyncrl.trainer.backends.verl.backend import VerlBackend
from asyncrl.trainer.backends.verl.trainer import OPEN_ENDED_STEPS, WindowDrivenTrainer
from tests.trainer.backends.verl_support import verl_config


def parameters(function: Callable[..., Any]) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.mark.parametrize(
    "method",
    [
        "_balance_batch",
        "_compute_old_log_prob",
        "_compute_ref_log_prob",
        "_compute_values",
        "_compute_advantage",
        "_update_critic",
        "_update_actor",
    ],
)
def test_the_v1_pipeline_steps_take_a_batch_and_a_metrics_dict(method: str) -> None:
    assert parameters(getattr(PPOTrainer, method))[:2] == ["batch", "metrics"]


def test_the_trainer_hooks_and_setup_we_rely_on_exist() -> None:
    assert issubclass(PPOTrainerColocateAsync, PPOTrainer)
    for name in ("init", "_setup", "_init_dataloader", "on_init_end", "on_sample_end", "on_step_end"):
        assert callable(getattr(PPOTrainerColocateAsync, name)), name
    # What colocate_async does around an update is what VerlBackend does around one.
    sample_end = inspect.getsource(PPOTrainerColocateAsync.on_sample_end)
    step_end = inspect.getsource(PPOTrainerColocateAsync.on_step_end)
    assert "abort_replicas()" in sample_end
    assert "sleep_replicas()" in sample_end
    assert "update_weights(self.global_steps)" in step_end
    assert "resume_generation_replicas()" in step_end


def test_checkpoint_engine_and_replica_addresses() -> None:
    for name in ("abort_replicas", "sleep_replicas", "resume_generation_replicas"):
        assert callable(getattr(CheckpointEngineManager, name))
    assert parameters(CheckpointEngineManager.update_weights) == ["global_steps"]
    assert parameters(LLMServerManager.get_addresses) == []


def test_actor_checkpoints() -> None:
    assert parameters(ActorRolloutRefWorker.save_checkpoint)[:3] == ["local_path", "hdfs_path", "global_step"]
    assert "del_local_after_load" in parameters(ActorRolloutRefWorker.load_checkpoint)


def test_transfer_queue_calls() -> None:
    assert {"keys", "partition_id", "fields", "tags"} <= set(parameters(tq.kv_batch_put))
    assert {"keys", "partition_id"} <= set(parameters(tq.kv_clear))
    assert parameters(tq.init) == ["conf"]
    assert callable(tq.close)
    meta = KVBatchMeta(partition_id="train", keys=["g_0_0"], tags=[{"seq_len": 3}])
    assert len(meta) == 1
    assert meta.extra_info == {}


def test_verls_config_files_are_where_compose_reads_them() -> None:
    assert (Path(verl_config_package.__file__).parent / "ppo_trainer.yaml").is_file()


def test_the_window_driven_trainer_builds_on_cpu_without_a_dataset() -> None:
    """Up to its GPU setup: the constructor and the dataloader replacement run here."""
    trainer = WindowDrivenTrainer(config=verl_config(totalSteps=7))
    trainer._init_dataloader()
    assert trainer.total_training_steps == 7
    assert trainer.config.actor_rollout_ref.actor.optim.total_training_steps == 7
    assert trainer.trainer_mode == "colocate_async"
    assert trainer.train_dataloader is None
    open_ended = WindowDrivenTrainer(config=verl_config(totalSteps=None))
    open_ended._init_dataloader()
    assert open_ended.total_training_steps == OPEN_ENDED_STEPS


def test_an_unstarted_backend_says_so() -> None:
    backend = VerlBackend(verl_config())
    assert backend.serve_urls == ()
    assert backend.model_version == 0
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(backend.sleep())
    asyncio.run(backend.stop())  # idempotent: nothing to stop
