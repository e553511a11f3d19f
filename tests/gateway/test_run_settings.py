"""The gateway takes its run's settings from the run's manifest, as the trainer does, with one default each.

Local mode and the operator start it with `--config run.yaml`; a gateway run by hand takes the same settings
as flags, whose defaults are those of a run that sets nothing (the API's `GatewaySpec`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from asyncrl.api import load_run
from asyncrl.capturing import CaptureMode
from asyncrl.cli import build_parser
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.held_calls import HeldCalls
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause_policy import pause_policy
from asyncrl.gateway.run_settings import GatewayRunSettings, run_settings, standalone_defaults
from asyncrl.gateway.server import RUN_FLAGS, gateway_config
from asyncrl.launch.podspec import map_paths
from asyncrl.launch.processes import free_port
from asyncrl.local.run import gateway_command
from asyncrl.pause_modes import DrainPolicy, PauseMode
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy
from asyncrl.testing.processes import start_server
from asyncrl.workloads import children
from tests.gateway.conftest import KEY
from tests.support.kube import run_manifest

NOT_THE_DEFAULTS: dict[str, Any] = {
    "pauseMode": "Reject",
    "drainPolicy": "Wait",
    "retryAfterSeconds": 2.5,
    "holdTimeoutSeconds": 30,
    "maxHeldCalls": 7,
    "capture": "Full",
    "maxCaptureBytes": 8192,
    "maxCaptureBytesPerRollout": 4096,
    "samplingParams": "Reject",
}


def _run_manifest() -> dict[str, Any]:
    manifest = run_manifest("settings")
    manifest["metadata"].update(namespace="team", uid="uid-1")
    manifest["spec"]["gateway"].update(NOT_THE_DEFAULTS)
    return manifest


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _assert_the_runs(config: GatewayConfig, manifest: dict[str, Any]) -> None:
    spec = load_run(manifest).spec
    assert config.run == run_settings(spec)
    assert config.run.model == "tiny"
    assert config.run.pause_mode is PauseMode.REJECT
    assert (config.run.retry_after_seconds, config.run.hold_timeout_seconds) == (2.5, 30)
    assert (config.run.capture, config.run.sampling_params) == (CaptureMode.FULL, SamplingParamsPolicy.REJECT)


def test_the_gateway_local_mode_starts_serves_with_the_runs_settings(tmp_path: Path) -> None:
    manifest = _run_manifest()
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(manifest))
    port = free_port()
    command = gateway_command(run_file, port=port)
    assert command[:4] == [sys.executable, "-m", "asyncrl.cli", "gateway"]
    _assert_the_runs(gateway_config(_parse(command[3:]), key=KEY), manifest)

    env = {**os.environ, "ASYNCRL_GATEWAY_KEY": KEY}
    url = f"http://127.0.0.1:{port}"
    process = start_server(command, ready_url=f"{url}/readyz", log_path=tmp_path / "gateway.log", env=env)
    try:
        state = httpx.get(f"{url}/proxy/state", headers={"authorization": f"Bearer {KEY}"}).json()
    finally:
        process.stop()
    assert state["retry_after_seconds"] == 2.5  # the run's, not the default 5
    assert "pause_mode" not in state  # Reject mode: Agent Lightning's state, no held calls
    assert "held" not in state


def test_the_gateway_of_the_operators_pod_reads_the_run_the_trainer_reads(tmp_path: Path) -> None:
    manifest = _run_manifest()
    spec = load_run(manifest).spec
    config_map = children.config_map(manifest, None)
    (tmp_path / children.RUN_FILE).write_text(config_map["data"][children.RUN_FILE])
    pod = children.trainer_job(manifest, spec)["spec"]["template"]["spec"]
    (gateway,) = pod["initContainers"]
    (trainer,) = pod["containers"]
    run_file = f"--config={children.CONFIG_DIR}/{children.RUN_FILE}"
    assert run_file in gateway["args"]
    assert run_file in trainer["args"]  # one file: the trainer's drain policy comes from it too
    mount = {"name": "config", "mountPath": children.CONFIG_DIR, "readOnly": True}
    for container in (gateway, trainer):
        assert mount in container["volumeMounts"]
    args = [map_paths(arg, {children.CONFIG_DIR: str(tmp_path)}) for arg in gateway["args"]]
    _assert_the_runs(gateway_config(_parse([*gateway["command"][1:], *args]), key=KEY), manifest)
    read_by_both = load_run(yaml.safe_load(config_map["data"][children.RUN_FILE])).spec
    assert read_by_both.gateway.drain_policy is DrainPolicy.WAIT


def test_a_gateway_run_by_hand_gets_what_a_run_that_sets_nothing_gets() -> None:
    manifest = run_manifest("plain")
    config = gateway_config(_parse(["gateway", "--model", "tiny"]), key=KEY)
    assert config.run == run_settings(load_run(manifest).spec)


def test_each_run_setting_has_one_default_the_apis() -> None:
    """No default of a run's setting but `GatewaySpec`'s: the settings model has none, the configuration does
    not repeat the fields, and the gateway's flags for them default to nothing (filled after parsing)."""
    assert all(field.is_required() for field in GatewayRunSettings.model_fields.values())
    assert not set(GatewayRunSettings.model_fields) & set(GatewayConfig.model_fields)
    parsed = vars(_parse(["gateway"]))
    assert {dest: parsed[dest] for dest in RUN_FLAGS} == dict.fromkeys(RUN_FLAGS)
    flagged = {name.split(".")[0] for name in RUN_FLAGS.values()}
    assert flagged == set(GatewayRunSettings.model_fields)  # a gateway run by hand can set every one


def test_flags_set_a_gateway_run_by_hand() -> None:
    args = _parse(
        ["gateway", "--model", "m", "--pause-mode", "Reject", "--capture=full", "--rollout-top-k=5"]
    )
    settings = gateway_config(args, key=KEY).run
    assert (settings.pause_mode, settings.capture) == (PauseMode.REJECT, CaptureMode.FULL)
    assert settings.rollout_sampling == RolloutSampling(top_k=5)
    assert settings.max_held_calls == standalone_defaults(model="m").max_held_calls


def test_a_run_setting_given_beside_the_run_file_is_refused(tmp_path: Path) -> None:
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(_run_manifest()))
    args = _parse(["gateway", f"--config={run_file}", "--pause-mode=hold"])
    with pytest.raises(SystemExit, match=r"--pause-mode: set by the run given with --config"):
        gateway_config(args, key=KEY)
    with pytest.raises(SystemExit, match=r"give --config RUN.yaml .* or --model"):
        gateway_config(_parse(["gateway"]), key=KEY)


def test_a_pause_policy_is_chosen_for_every_mode() -> None:
    held = HeldCalls(capacity=1, timeout_seconds=1)
    for mode in PauseMode:
        assert pause_policy(mode, held=held, metrics=GatewayMetrics()).mode is mode
    reject = pause_policy(PauseMode.REJECT, held=held, metrics=GatewayMetrics())
    assert reject.state_fields() == {}  # Reject mode's state stays Agent Lightning's
