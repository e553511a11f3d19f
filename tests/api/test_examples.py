"""Every example manifest is valid (except the one that shows the async-window error), locally and on the
real API server, and the agent template of each renders an agent Job for its first row."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.agent_templates.render import render_job, template_variables
from asyncrl.api import InvalidRunError, load_run
from tests.api.conftest import EXAMPLES

VALID = sorted(path.name for path in EXAMPLES.glob("*.yaml") if "invalid" not in path.name)


def _manifest(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return loaded


@pytest.mark.parametrize("name", VALID)
def test_example_is_valid_and_its_template_renders_a_job(name: str) -> None:
    run = load_run(_manifest(name))
    template = run.spec.agents.template.inline
    assert template is not None
    # A run reading its rows from a ConfigMap (run-gpu.yaml) renders with a row of the same shape.
    row = run.spec.data.inline[0] if run.spec.data.inline else {"question": "What is 2 + 3?"}
    job = render_job(
        template,
        template_variables(
            row, rollout={"id": "r1"}, job_name="example-r-1", run={"name": "x", "namespace": "y"}
        ),
    )
    assert job["kind"] == "Job"


def test_the_invalid_example_is_rejected_with_the_advice() -> None:
    with pytest.raises(InvalidRunError, match="windowSize"):
        load_run(_manifest("run-invalid-async.yaml"))


@pytest.mark.controlplane
@pytest.mark.parametrize("name", VALID)
def test_example_is_accepted_by_the_api_server(
    name: str, kubectl: list[str], namespace: str, installed_crd: Path
) -> None:
    result = subprocess.run(
        [*kubectl, "apply", "--dry-run=server", "-n", namespace, "-f", str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
