"""verl on a Ray cluster: the settings a multi-node run gives verl, and how the backend joins the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.trainer.backends.verl.cluster import DEFAULT_CLUSTER_ADDRESS, ray_connection
from asyncrl.trainer.backends.verl.config import VerlConfigError, compose_verl_config, verl_settings
from tests.trainer.backends.verl_support import verl_run

TWO_NODES = {"nodes": 2, "gpusPerNode": 4, "checkpoint": {"claimName": "shared"}}


def test_a_two_node_run_gives_verl_nnodes_2_and_the_gpus_of_each_node() -> None:
    run = verl_run(trainer=TWO_NODES, trainBatchSize=4, **{"async": {"enabled": True, "windowSize": 8}})
    settings = verl_settings(run, checkpoint_dir=Path("/ckpt"))
    owned = settings.owned()
    assert owned["trainer.nnodes"] == 2
    assert owned["trainer.n_gpus_per_node"] == 4
    config = compose_verl_config(settings)  # verl's own validate_config accepts it
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (2, 4)


def test_a_one_node_run_keeps_nnodes_1_and_trainer_gpus() -> None:
    owned = verl_settings(verl_run(trainer={"gpus": 2}), checkpoint_dir=None).owned()
    assert (owned["trainer.nnodes"], owned["trainer.n_gpus_per_node"]) == (1, 2)


def test_zero_gpus_per_node_is_refused_naming_gpus_per_node() -> None:
    with pytest.raises(VerlConfigError, match=r"spec\.trainer\.gpusPerNode"):
        verl_settings(verl_run(trainer={**TWO_NODES, "gpusPerNode": 0}), checkpoint_dir=None)


def test_one_node_starts_a_private_ray_sized_to_the_pod() -> None:
    connection = ray_connection(nnodes=1, env={"RAY_ADDRESS": "ignored:1"})
    assert connection.address is None
    assert connection.needs_cpu_plan
    assert "address" not in connection.init_kwargs


def test_more_nodes_join_the_cluster_at_ray_address_and_size_nothing() -> None:
    connection = ray_connection(nnodes=2, env={"RAY_ADDRESS": "127.0.0.1:6379"})
    assert connection.init_kwargs == {"address": "127.0.0.1:6379"}
    assert not connection.needs_cpu_plan
    assert ray_connection(nnodes=3, env={}).address == DEFAULT_CLUSTER_ADDRESS
