"""The loop's settings are built from the run's spec in one step (`LoopSettings.of_run`): every field the spec
decides reaches the loop, and the window takes the spec's defaults."""

from __future__ import annotations

from pathlib import Path

from asyncrl.api import load_run
from asyncrl.pause_modes import DrainPolicy
from asyncrl.trainer.adapter import AdapterConfig
from asyncrl.trainer.loop import LoopSettings
from tests.api.conftest import load_example


def test_every_setting_the_spec_decides_reaches_the_loop() -> None:
    manifest = load_example("run-minimal.yaml")
    # Each value differs from the LoopSettings and AdapterConfig defaults, so a field left out is seen.
    manifest["spec"].update(
        rolloutTimeoutSeconds=123,
        totalSteps=7,
        maxFailedSteps=9,
        gateway={"retryAfterSeconds": 2.5, "drainPolicy": "Wait"},
        data={**manifest["spec"]["data"], "maxPromptLength": 300, "maxResponseLength": 200},
    )
    manifest["spec"]["rollout"]["dropUniformGroups"] = True
    manifest["spec"]["trainer"].update(
        checkpoint={"everySteps": 3}, sampleLevel="Transition", failedRolloutReward=-1.0
    )
    spec = load_run(manifest).spec

    settings = LoopSettings.of_run(spec, checkpoint_dir=Path("/ckpt"))

    assert settings.window == spec.window_config()
    assert settings.window.refills  # the spec's default (refillDuringCollection: true), as a manifest gets it
    assert settings.adapter == AdapterConfig(
        sample_level=spec.trainer.sample_level,
        failed_rollout_reward=-1.0,
        max_prompt_tokens=300,
        max_response_tokens=200,
    )
    assert (
        settings.rollout_timeout_seconds,
        settings.total_steps,
        settings.checkpoint_dir,
        settings.checkpoint_every_steps,
        settings.retry_after_seconds,
        settings.drain_policy,
        settings.max_failed_steps,
        settings.drop_uniform_groups,
    ) == (123, 7, Path("/ckpt"), 3, 2.5, DrainPolicy.WAIT, 9, True)
