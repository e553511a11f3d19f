"""Fixtures of the chart tests: the provisioned helm binary, with its own cache and configuration folders."""

from __future__ import annotations

import os

import pytest

from asyncrl.testing.controlplane import default_bin_dir


@pytest.fixture(scope="module")
def helm() -> list[str]:
    binary = default_bin_dir() / "helm"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"helm is not provisioned ({binary}); run scripts/provision-k8s.sh first", pytrace=False)
    return [str(binary)]


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
