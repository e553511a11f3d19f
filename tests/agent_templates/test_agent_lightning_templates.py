"""An Agent Lightning v1.0 Job template renders unchanged here (docs/migrating-from-agent-lightning.md).

Agent Lightning's templates are whole `batch/v1` Jobs with `metadata: {}` that quote each row value with
`| yaml_escape`. Without that filter the render fails (`No filter named 'yaml_escape'`), so every rollout of a
migrated run would fail.
"""

from __future__ import annotations

import json

from tests.agent_templates.shaping import shaped_agent_container

# The shape of Agent Lightning v1.0's documented template fragment, as a whole Job.
AGENT_LIGHTNING_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
metadata: {}
spec:
  template:
    spec:
      containers:
        - name: agent
          image: {{ (input.image_name ~ ":latest") | yaml_escape }}
          command: ["python", "/app/agent.py"]
          env:
            - name: QUESTION
              value: {{ input.question | yaml_escape }}
            - name: RESULT
              value: {{ input.result | yaml_escape }}
            - name: ROW
              value: {{ input | yaml_escape }}
"""
ROW = {"image_name": "calc-agent", "question": 'What is "2: 3"?\n- list?', "result": 5}


def test_agent_lightning_template_renders_with_yaml_escape() -> None:
    container, env = shaped_agent_container(AGENT_LIGHTNING_TEMPLATE, ROW, run="calc")
    assert container["image"] == "calc-agent:latest"
    assert env["QUESTION"] == ROW["question"]  # text with quotes, ': ' and a newline stays one string
    assert env["RESULT"] == "5"  # a number becomes a string, as a Kubernetes env value must be
    assert json.loads(env["ROW"]) == ROW
    assert env["AGL_KEY"] == "k"
