"""The verl backend's update path on CPU with the real libraries: Ray, TransferQueue and verl's driver code.

Real here: a local Ray (CPU only, two logical CPUs, a small object store), TransferQueue's controller and a
storage unit as Ray actors, verl 0.9.1's `PPOTrainer` pipeline as `WindowDrivenTrainer.train_on` runs it
(`_balance_batch` with its padding rows, `_compute_old_log_prob`, `_compute_advantage` with rollout
correction, `_update_actor`) and `VerlBackend.update`, which puts the rows in and clears them.

A stand-in replaces only verl's GPU worker group (`actor_rollout_wg`: FSDP workers on GPUs, which cannot run
here). It reads and writes TransferQueue as verl's workers do: `compute_log_prob` writes per-sequence
`log_probs`/`entropy`, `update_actor` reads the fields verl's actor reads and computes the loss with verl's
own policy-loss function, keeping the inputs it was given so the test can check them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from asyncrl.trainer.backends.verl.backend import PARTITION, VerlBackend  # noqa: E402
from asyncrl.trainer.backends.verl.batch import trajectory_keys  # noqa: E402
from asyncrl.trainer.backends.verl.trainer import WindowDrivenTrainer  # noqa: E402
from asyncrl.trainer.rows import TrainingRow  # noqa: E402
from tests.trainer.backends.test_verl_batch import agent_rows  # noqa: E402
from tests.trainer.backends.verl_support import verl_config  # noqa: E402
from tests.trainer.test_adapter import TRAJECTORY, TRANSITION  # noqa: E402

pytestmark = pytest.mark.slow

GPUS = 4  # the run's GPUs: the stand-in reports one actor rank per GPU, as verl's FSDP worker group does
THRESHOLD = 2.0
EOS = 7


def log_prob_shift(token_position: int) -> float:
    """The actor's log-prob minus vLLM's, per response position: weights 1.35, 0.61 and exp(1.5) > 2."""
    return (0.3, -0.5, 1.5)[token_position % 3]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One small local Ray and TransferQueue for the module; both shut down, whatever the tests did."""
    ray.init(
        num_cpus=2,  # TransferQueue's controller and its one storage unit take one CPU each
        object_store_memory=80 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        conf = OmegaConf.create(
            {"backend": {"SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 1000}}}
        )
        tq.init(conf)
        try:
            yield
        finally:
            tq.close()
    finally:
        ray.shutdown()


class StandInTokenizer:
    eos_token_id = EOS
    pad_token_id = EOS


class StandInActorWorkerGroup:
    """In place of verl's FSDP actor workers (GPUs): the same TransferQueue reads and writes, on CPU."""

    def __init__(self, actor_config: Any) -> None:
        self.actor_config = actor_config  # verl's ActorConfig, as its workers build it
        self._dispatch_info: dict[str, list[int]] = {"actor": list(range(GPUS))}
        self.log_prob_keys: list[list[str]] = []
        self.loss_inputs: list[dict[str, Any]] = []

    def _query_dispatch_info(self, role: str) -> list[int]:
        return self._dispatch_info[role]

    def compute_log_prob(self, batch: Any) -> Any:
        """Per-sequence log-probs, shifted one left as a causal LM's are (verl's `response_from_nested`)."""
        self.log_prob_keys.append(list(batch.keys))
        data = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["input_ids", "responses", "rollout_log_probs"],
        )
        log_probs, entropy = [], []
        for i in range(len(batch)):
            sequence = len(data["input_ids"][i])
            response = len(data["responses"][i])
            rollout = data["rollout_log_probs"][i]
            values = torch.zeros(sequence, dtype=torch.float32)
            for j in range(response):
                values[sequence - response - 1 + j] = float(rollout[j]) + log_prob_shift(j)
            log_probs.append(values)
            entropy.append(torch.full((sequence,), 0.5))
        fields = TensorDict(
            {
                "log_probs": torch.nested.as_nested_tensor(log_probs, layout=torch.jagged),
                "entropy": torch.nested.as_nested_tensor(entropy, layout=torch.jagged),
            },
            batch_size=len(batch),
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    def update_actor(self, batch: Any) -> dict[str, Any]:
        """One on-policy mini-batch through verl's vanilla PPO loss, with the weights from TransferQueue."""
        # What verl's train_mini_batch (engine_workers.py) asserts before it splits the rows over its ranks:
        # a run whose trainBatchSize x samplesPerPrompt does not divide by the GPUs fails here on a GPU.
        mini_batch_size = batch.extra_info["mini_batch_size"]
        assert mini_batch_size % GPUS == 0, f"Got {mini_batch_size=} and data-parallel size {GPUS}"
        fields = ["old_log_probs", "advantages", "response_mask", "rollout_is_weights"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        padded = data.to_padded_tensor()
        loss_fn = get_policy_loss_fn("vanilla")
        loss, _ = loss_fn(
            old_log_prob=padded["old_log_probs"],
            log_prob=padded["old_log_probs"].clone(),
            advantages=padded["advantages"],
            response_mask=padded["response_mask"],
            loss_agg_mode="token-mean",
            config=self.actor_config,
            rollout_is_weights=padded["rollout_is_weights"],
        )
        self.loss_inputs.append(
            {
                "keys": list(batch.keys),
                "tags": list(batch.tags),
                "weights": [data["rollout_is_weights"][i].tolist() for i in range(len(batch))],
                "advantages": [data["advantages"][i].tolist() for i in range(len(batch))],
                "loss": float(loss),
            }
        )
        return {"metrics": {"pg_loss": [float(loss)], "grad_norm": [1.0], "mfu": [0.0]}}


def backend_on_real_verl() -> tuple[VerlBackend, StandInActorWorkerGroup]:
    config = verl_config(
        trainer={"gpus": GPUS},
        trainBatchSize=4,  # 4 groups x 3 = 12 rows per mini-batch, 3 per rank
        rollout={"samplesPerPrompt": 3},
        rolloutCorrection={"mode": "Token", "threshold": THRESHOLD},
        **{"async": {"enabled": True, "windowSize": 8}},
    )
    trainer = WindowDrivenTrainer(config=config)
    trainer._init_dataloader()
    trainer.tokenizer = StandInTokenizer()
    workers = StandInActorWorkerGroup(omega_conf_to_dataclass(config.actor_rollout_ref.actor))
    trainer.actor_rollout_wg = workers
    backend = VerlBackend(config)
    backend._trainer = trainer  # what start() sets after verl's init() (which needs GPUs)
    return backend, workers


def stored_keys() -> list[str]:
    return sorted(tq.kv_list(partition_id=PARTITION).get(PARTITION, {}))


def expected_weight(position: int) -> float:
    return min(math.exp(log_prob_shift(position)), THRESHOLD)


def check_loss_inputs(rows: list[TrainingRow], inputs: dict[str, Any]) -> None:
    """Every real row reached the loss with its truncated importance weights; the pads with zero masks."""
    by_key = dict(zip(trajectory_keys(rows), rows, strict=True))
    real = [key for key, tag in zip(inputs["keys"], inputs["tags"], strict=True) if not tag.get("is_padding")]
    assert sorted(real) == sorted(by_key)
    for key, tag, weights in zip(inputs["keys"], inputs["tags"], inputs["weights"], strict=True):
        if tag.get("is_padding"):
            assert weights == [0.0]  # a padding row's one token is masked out
            continue
        mask = by_key[key].response_mask
        expected = [m * expected_weight(j) for j, m in enumerate(mask)]
        assert weights == pytest.approx(expected, rel=1e-5), key
    assert math.isfinite(inputs["loss"])


def test_updates_through_verl_and_transfer_queue_leave_nothing_behind(local_ray: None) -> None:
    backend, workers = backend_on_real_verl()
    steps = [
        agent_rows(TRAJECTORY),  # 6 rows: verl pads them to 12 (4 ranks, mini-batches of 4 groups x 3)
        agent_rows(TRANSITION),  # 12 rows: no padding
        agent_rows(TRAJECTORY),  # padded again
    ]
    for step, rows in enumerate(steps):
        metrics = asyncio.run(backend.update(rows, step=step))
        assert stored_keys() == [], f"TransferQueue still holds records after step {step}"
        assert metrics.rows == len(rows)
        assert backend.model_version == step + 1
        assert math.isfinite(metrics.loss)
        assert metrics.importance_weight_max == pytest.approx(THRESHOLD)
        inputs = workers.loss_inputs[step]
        check_loss_inputs(rows, inputs)
        padding = sum(bool(tag.get("is_padding")) for tag in inputs["tags"])
        assert (len(rows) + padding) % 12 == 0
    assert [len(keys) for keys in workers.log_prob_keys] == [12, 12, 12]
    assert sum(bool(tag.get("is_padding")) for tag in workers.loss_inputs[0]["tags"]) == 6
