"""Every verl (and TransferQueue) name the verl backend calls, with the parameters it passes.

The backend's GPU path cannot run here, so a verl upgrade that renames or reshapes any of these must break
this test rather than a training run on a cluster. Most are verl's v1 trainer internals (`_balance_batch`,
`_compute_advantage`...): the very steps verl's own `_step_once` runs after sampling.
"""

from __future__ import annotations

import asyncio
import inspect
import types
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
from asyncrl.trainer.backends.verl.config import compose_verl_config, verl_settings
from asyncrl.trainer.backends.verl.trainer import WindowDrivenTrainer
from tests.trainer.backends.verl_support import verl_config, verl_run


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


COSINE = {
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.1,
}


def learning_rates(config: Any, updates: int) -> list[float]:
    """The LR of each update, from verl's own FSDP scheduler builder on the config's optimizer settings."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    optimizer = torch.optim.AdamW(
        [torch.nn.Parameter(torch.zeros(1))], lr=config.actor_rollout_ref.actor.optim.lr
    )
    engine = types.SimpleNamespace(
        optimizer_config=omega_conf_to_dataclass(config.actor_rollout_ref.actor.optim), rank=1
    )
    scheduler = FSDPEngine._build_lr_scheduler(engine, optimizer)
    rates = []
    for _ in range(updates):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_an_open_ended_runs_schedule_spans_one_pass_over_its_prompts() -> None:
    """Without totalSteps the run ends after one pass over the data: 100 prompts at trainBatchSize 4 are 25
    updates, and a warmup + cosine schedule runs over those 25 (with a horizon of 1,000,000 it never left
    its warmup)."""
    run = verl_run(
        totalSteps=None,
        trainBatchSize=4,
        trainer={"gpus": 1, "verlOverrides": COSINE},
        **{"async": {"enabled": True, "windowSize": 8}},
    )
    config = compose_verl_config(verl_settings(run, checkpoint_dir=None, prompt_count=100))
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 25
    trainer = WindowDrivenTrainer(config=config)
    trainer._init_dataloader()
    assert trainer.total_training_steps == 25
    rates = learning_rates(config, 25)
    peak = config.actor_rollout_ref.actor.optim.lr
    assert max(rates) == pytest.approx(peak)  # warmup done (2 of 25 updates)
    assert rates[-1] < 0.01 * peak  # and the cosine decayed by the last update


def test_the_horizon_is_totalsteps_or_what_the_user_sets() -> None:
    assert verl_config(totalSteps=7).actor_rollout_ref.actor.optim.total_training_steps == 7
    explicit = {**COSINE, "actor_rollout_ref.actor.optim.total_training_steps": 500}
    config = verl_config(totalSteps=7, trainer={"gpus": 1, "verlOverrides": explicit})
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 500
    trainer = WindowDrivenTrainer(config=config)
    trainer._init_dataloader()
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 500  # not overwritten


def test_a_run_without_a_horizon_is_refused_naming_the_settings() -> None:
    run = verl_run(totalSteps=None, data={"configMapRef": {"name": "rows", "key": "rows.jsonl"}})
    config = compose_verl_config(verl_settings(run, checkpoint_dir=None))  # prompts not counted
    with pytest.raises(ValueError, match=r"spec\.totalSteps.*total_training_steps"):
        WindowDrivenTrainer(config=config)._init_dataloader()


def test_an_unstarted_backend_says_so() -> None:
    backend = VerlBackend(verl_config())
    assert backend.serve_urls == ()
    assert backend.model_version == 0
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(backend.sleep())
    asyncio.run(backend.stop())  # idempotent: nothing to stop
