"""The verl backend: verl 0.9's collocated async machinery (FSDP actor + vLLM replicas on the same GPUs).

Start: Ray and TransferQueue in this process, then `WindowDrivenTrainer.init()` (verl builds the actor
worker group, launches one vLLM OpenAI server per replica and syncs the initial weights into them). The
replicas' HTTP addresses are this backend's `serve_urls`; the step loop registers them with the gateway, with
the model name vLLM serves (read from its `/v1/models`).

One step, as the step loop calls it (the gateway is paused and drained first, so no agent call is in flight):
`sleep()` = verl's `abort_replicas()` (a safety net: nothing should be running) + `sleep_replicas()` (vLLM
frees weights and KV cache); `update(rows)` = the rows into TransferQueue, verl's PPO pipeline, the records
cleared; `wake()` = verl's `update_weights()` (the new weights into vLLM, which wakes it) +
`resume_generation_replicas()`. These are the calls verl's own colocate_async trainer makes in
`on_sample_end` and `on_step_end`.

verl's calls block (Ray); each runs in a worker thread so that the trainer's event loop keeps answering.
Nothing here runs without a GPU: the CPU tests cover the config, the batch and the verl API this module uses.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import stamina

from asyncrl.trainer.backends import TrainerBackend, UpdateMetrics
from asyncrl.trainer.backends.staging import read_checkpoint_meta, staged_directory, write_checkpoint_meta
from asyncrl.trainer.backends.verl.batch import build_trajectory_batch
from asyncrl.trainer.backends.verl.cluster import ray_connection
from asyncrl.trainer.backends.verl.resources import plan_ray_cpus, storage_units_of
from asyncrl.trainer.rows import TrainingRow

logger = logging.getLogger(__name__)

PARTITION = "train"
FORMAT = "asyncrl-verl-checkpoint/1"
ACTOR_DIR = "actor"


class VerlBackend:
    def __init__(self, config: Any) -> None:
        """`config`: verl's trainer config, from `compose_verl_config` (checked there)."""
        self.config = config
        self._trainer: Any = None
        self._serve_urls: tuple[str, ...] = ()
        self._served_model = ""
        self._version = 0

    @property
    def serve_urls(self) -> tuple[str, ...]:
        return self._serve_urls

    @property
    def served_model(self) -> str:
        return self._served_model

    @property
    def model_version(self) -> int:
        return self._version

    async def start(self) -> None:
        await asyncio.to_thread(self._start_blocking)
        self._served_model = await served_model_name(self._serve_urls[0])
        logger.info("vLLM replicas %s serve %r", ", ".join(self._serve_urls), self._served_model)

    async def stop(self) -> None:
        if self._trainer is None:
            return
        self._trainer = None
        await asyncio.to_thread(_shutdown)

    async def sleep(self) -> None:
        await asyncio.to_thread(self._sleep_blocking)

    async def wake(self) -> None:
        await asyncio.to_thread(self._wake_blocking)

    async def update(self, rows: Sequence[TrainingRow], *, step: int) -> UpdateMetrics:
        return await asyncio.to_thread(self._update_blocking, list(rows), step)

    async def save_checkpoint(self, path: Path, *, step: int) -> None:
        await asyncio.to_thread(self._save_blocking, Path(path), step)

    async def load_checkpoint(self, path: Path) -> int:
        return await asyncio.to_thread(self._load_blocking, Path(path))

    # -- blocking parts (worker threads) -------------------------------------------------------------------

    def _start_blocking(self) -> None:
        import ray
        import transfer_queue as tq
        from omegaconf import OmegaConf

        from asyncrl.trainer.backends.verl.trainer import WindowDrivenTrainer

        if not ray.is_initialized():
            connection = ray_connection(nnodes=int(self.config.trainer.nnodes), env=os.environ)
            init_kwargs = dict(connection.init_kwargs)
            if connection.needs_cpu_plan:
                # Sized to the pod, not the node, or verl's placement groups wait forever (resources.py).
                plan = plan_ray_cpus(
                    gpus=int(self.config.trainer.n_gpus_per_node), storage_units=storage_units_of(self.config)
                )
                logger.info("starting Ray: %s", plan.describe())
                init_kwargs["num_cpus"] = plan.available
            logger.info("Ray: %s", connection.describe())
            runtime_env = _ray_runtime_env(self.config)
            runtime_env.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
            ray.init(runtime_env=runtime_env, **init_kwargs)
        OmegaConf.resolve(self.config)
        tq.init(self.config.transfer_queue)
        trainer: Any = WindowDrivenTrainer(config=self.config)
        trainer.init()  # workers, vLLM replicas, checkpoint engine; ends with the initial weights served
        self._trainer = trainer
        addresses = trainer.llm_server_manager.get_addresses()
        self._serve_urls = tuple(f"http://{address}" for address in addresses)
        if not self._serve_urls:
            raise RuntimeError("verl started no vLLM replica; check trainer.gpus and the rollout settings")

    def _sleep_blocking(self) -> None:
        manager = self._started().checkpoint_manager
        manager.abort_replicas()
        manager.sleep_replicas()

    def _wake_blocking(self) -> None:
        manager = self._started().checkpoint_manager
        manager.update_weights(self._version)
        manager.resume_generation_replicas()

    def _update_blocking(self, rows: list[TrainingRow], step: int) -> UpdateMetrics:
        import transfer_queue as tq
        from transfer_queue import KVBatchMeta

        trainer = self._started()
        started = time.perf_counter()
        batch = build_trajectory_batch(rows, step=step)
        tq.kv_batch_put(keys=batch.keys, partition_id=PARTITION, fields=batch.fields(), tags=batch.tags)
        meta = KVBatchMeta(partition_id=PARTITION, keys=list(batch.keys), tags=list(batch.tags))
        try:
            verl_metrics = trainer.train_on(meta, step=step)
        finally:
            clear_partition(meta.keys)
        self._version = step + 1
        seconds = time.perf_counter() - started
        return update_metrics(rows, verl_metrics, step=step, seconds=seconds)

    def _save_blocking(self, path: Path, step: int) -> None:
        """Saved with vLLM asleep, as verl's own trainer saves (the gateway is still paused then): gathering
        the actor's full state must not compete with vLLM's weights and KV cache for GPU memory."""
        trainer = self._started()
        self._sleep_blocking()
        try:
            with staged_directory(path) as staging:
                trainer.actor_rollout_wg.save_checkpoint(str(staging / ACTOR_DIR), None, step)
                write_checkpoint_meta(staging, format=FORMAT, step=step)
        finally:
            self._wake_blocking()

    def _load_blocking(self, path: Path) -> int:
        trainer = self._started()
        step = int(read_checkpoint_meta(path, format=FORMAT)["step"])
        self._sleep_blocking()
        try:
            trainer.actor_rollout_wg.load_checkpoint(str(path / ACTOR_DIR), del_local_after_load=False)
            self._version = step
        finally:
            self._wake_blocking()  # the loaded weights into vLLM (or, on error, the ones it had)
        return step

    def _started(self) -> Any:
        if self._trainer is None:
            raise RuntimeError("the verl backend is not started")
        return self._trainer


def update_metrics(
    rows: Sequence[TrainingRow], verl_metrics: dict[str, Any], *, step: int, seconds: float
) -> UpdateMetrics:
    """asyncrl's update metrics from the rows and verl's (kept verbatim, under their names, in `extra`)."""
    rewards = [row.reward for row in rows]
    total_tokens = sum(len(row.prompt_token_ids) + len(row.response_token_ids) for row in rows)
    extra = {name: float(value) for name, value in verl_metrics.items() if _is_number(value)}
    return UpdateMetrics(
        step=step,
        model_version=step + 1,
        loss=extra.get("actor/pg_loss", float("nan")),
        grad_norm=extra.get("actor/grad_norm", float("nan")),
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        rows=len(rows),
        trained_tokens=sum(sum(row.response_mask) for row in rows),
        total_tokens=total_tokens,
        seconds=seconds,
        tokens_per_second=total_tokens / seconds if seconds > 0 else 0.0,
        clip_fraction=extra.get("actor/pg_clipfrac", 0.0),
        ppo_kl=extra.get("actor/ppo_kl", 0.0),
        importance_weight_mean=extra.get("rollout_corr/rollout_is_mean"),
        importance_weight_max=extra.get("rollout_corr/rollout_is_max"),
        importance_weight_min=extra.get("rollout_corr/rollout_is_min"),
        extra=extra,
    )


class NoModelYet(ValueError):
    """The server answered `/v1/models` but listed no model yet."""


NOT_SERVING_YET = (httpx.HTTPError, ValueError, KeyError, TypeError)  # a starting server's answers


async def served_model_name(url: str, *, attempts: int = 60, poll_seconds: float = 1.0) -> str:
    """The model id an OpenAI server serves (`GET /v1/models`), asked every `poll_seconds` (stamina, a
    fixed wait: the server is starting, not overloaded) up to `attempts` times."""
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        try:
            async for attempt in stamina.retry_context(
                on=NOT_SERVING_YET,
                attempts=attempts,
                timeout=None,
                wait_initial=poll_seconds,
                wait_max=poll_seconds,
                wait_jitter=0.0,
                wait_exp_base=1.0,
            ):
                with attempt:
                    try:
                        return await _first_model(client)
                    except NOT_SERVING_YET as error:
                        logger.info("waiting for %s/v1/models (%d): %s", url, attempt.num, error)
                        raise
        except NOT_SERVING_YET as error:
            raise RuntimeError(f"{url}/v1/models named no model after {attempts} tries: {error}") from error
    raise AssertionError("stamina ended its attempts without an outcome")


async def _first_model(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise NoModelYet("no model listed yet")
    return str(models[0]["id"])


def clear_partition(keys: Sequence[str]) -> None:
    """Clear an update's records: its rows, and the padding rows verl's `_balance_batch` added to them.

    `_balance_batch` pads the batch to a multiple of `trainBatchSize x n` (and of the data-parallel size)
    and returns a new meta whose keys include the pads; a failure can happen after they were written. The
    partition belongs to this backend and holds nothing between updates, so whatever it still holds is
    cleared with the rows (verl's own `fit` clears the padded batch's keys).
    """
    import transfer_queue as tq

    listed = tq.kv_list(partition_id=PARTITION).get(PARTITION, {})
    leftover = list(dict.fromkeys([*keys, *listed]))
    if leftover:
        tq.kv_clear(keys=leftover, partition_id=PARTITION)


def _ray_runtime_env(config: Any) -> dict[str, Any]:
    """verl's Ray runtime environment for its workers (tokenizer, NCCL and vLLM settings)."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    runtime_env: dict[str, Any] = get_ppo_ray_runtime_env(config)  # type: ignore[no-untyped-call]
    return runtime_env


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _shutdown() -> None:
    import ray
    import transfer_queue as tq

    try:
        tq.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()


if TYPE_CHECKING:  # mypy proves the protocol is implemented
    _conforms: TrainerBackend = VerlBackend(None)
