"""What a run's reconciler, dispatcher and gateway link share: the run as last read, its spec, how the gateway
is reached and the agent template."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.operator.kube import JSON


@dataclass
class RunContext:
    run: JSON  # the AsyncTrainingRun as read from the API
    spec: AsyncTrainingRunSpec
    gateway_url: str  # how the operator reaches the gateway
    agent_gateway_url: str  # what agents are given
    gateway_key: str
    template_source: str
    # An agent pod that cannot start (image, configuration) fails its rollout after this; the run fails when
    # none of its agent pods has started by then (`asyncrl operator --agent-start-timeout-seconds`).
    agent_start_timeout_seconds: float = 300.0

    @property
    def namespace(self) -> str:
        return str(self.run["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.run["metadata"]["name"])
