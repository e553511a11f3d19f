"""The shipped agent Job templates render a valid agent Job for a sample row, as the operator would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agent_templates.shaping import shaped_agent_container

TEMPLATES = Path(__file__).resolve().parents[2] / "agent_job_templates"
ROW = {"prompt": 'say "hi"\nnow', "target": "ab", "tool_seconds": 0.5}


@pytest.mark.parametrize("name", sorted(path.name for path in TEMPLATES.glob("*.yaml.j2")))
def test_template_renders_an_agent_job_for_a_sample_row(name: str) -> None:
    container, env = shaped_agent_container((TEMPLATES / name).read_text(), ROW, run="demo")
    assert json.loads(env["ROW"]) == ROW
    assert env["AGL_KEY"] == "k"
    assert all(isinstance(value, str) for value in env.values())  # Kubernetes env values are strings
    assert container["command"][:2] == ["python", "-m"]
