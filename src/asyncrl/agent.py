"""What an agent needs to take part in training: its environment, a retrying model client, reward reporting.

Each agent Job (or local agent process) gets three variables: `AGL_OPENAI_BASE_URL` (its rollout's proxy
route; use it as an OpenAI base URL), `AGL_EVENT_URL` (where its events go) and `AGL_KEY` (a token valid for
this rollout only). While the trainer updates weights the gateway answers 429 with Retry-After; the clients
here wait and retry, so a pause is invisible to the agent's logic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import openai

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
# A pause lasts one weight update; with the default Retry-After of 5 s this allows about 10 minutes.
DEFAULT_MAX_RETRIES = 120


ENV_OPENAI_BASE_URL = "AGL_OPENAI_BASE_URL"
ENV_EVENT_URL = "AGL_EVENT_URL"
ENV_KEY = "AGL_KEY"


class AgentEnvironmentError(RuntimeError):
    """The agent was started without the AGL_* variables the operator injects."""


@dataclass(frozen=True)
class AgentEnvironment:
    openai_base_url: str
    event_url: str
    key: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentEnvironment:
        environ = os.environ if environ is None else environ
        names = (ENV_OPENAI_BASE_URL, ENV_EVENT_URL, ENV_KEY)
        missing = [name for name in names if not environ.get(name)]
        if missing:
            raise AgentEnvironmentError(
                f"missing {', '.join(missing)}: the operator (or `asyncrl local run`) sets these for each "
                "rollout; to run an agent by hand, export them from a rollout created in the gateway"
            )
        return cls(environ[ENV_OPENAI_BASE_URL].rstrip("/"), environ[ENV_EVENT_URL], environ[ENV_KEY])

    @classmethod
    def for_rollout(
        cls, *, gateway_url: str, gateway_key: str, rollout_id: str, attempt_id: str, mode: str = "train"
    ) -> AgentEnvironment:
        """What the operator and local mode give the agent of one rollout attempt."""
        from asyncrl.gateway.auth import agent_token

        return cls.with_token(
            gateway_url=gateway_url,
            token=agent_token(gateway_key, rollout_id),
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            mode=mode,
        )

    @classmethod
    def with_token(
        cls, *, gateway_url: str, token: str, rollout_id: str, attempt_id: str, mode: str = "train"
    ) -> AgentEnvironment:
        """The same, from the rollout's agent token (a pool pod is handed it and never holds the key)."""
        from asyncrl.gateway.paths import events_path, proxy_base_path

        base = gateway_url.rstrip("/")
        rollout = base + proxy_base_path(rollout_id=rollout_id, attempt_id=attempt_id, mode=mode)
        events = base + events_path(rollout_id=rollout_id, attempt_id=attempt_id)
        return cls(rollout, events, token)

    def as_env(self) -> dict[str, str]:
        return {
            ENV_OPENAI_BASE_URL: self.openai_base_url,
            ENV_EVENT_URL: self.event_url,
            ENV_KEY: self.key,
        }


def openai_client(
    env: AgentEnvironment | None = None, *, max_retries: int = DEFAULT_MAX_RETRIES, timeout: float = 600.0
) -> openai.OpenAI:
    """An `openai.OpenAI` client for this rollout that retries 429s honouring Retry-After (needs openai)."""
    import openai

    env = env or AgentEnvironment.from_env()
    return openai.OpenAI(
        base_url=env.openai_base_url, api_key=env.key, max_retries=max_retries, timeout=timeout
    )


def async_openai_client(
    env: AgentEnvironment | None = None, *, max_retries: int = DEFAULT_MAX_RETRIES, timeout: float = 600.0
) -> openai.AsyncOpenAI:
    import openai

    env = env or AgentEnvironment.from_env()
    return openai.AsyncOpenAI(
        base_url=env.openai_base_url, api_key=env.key, max_retries=max_retries, timeout=timeout
    )


def _retry_delay(response: httpx.Response | None, attempt: int) -> float:
    if response is not None:
        header = response.headers.get("retry-after")
        if header is not None:
            try:
                seconds = float(header)
            except ValueError:
                seconds = -1.0
            if seconds >= 0:
                return seconds
    return min(5.0, 0.2 * 2.0**attempt)


def _post_with_retries(
    url: str, key: str, body: dict[str, Any], *, deadline_seconds: float
) -> httpx.Response:
    deadline = time.monotonic() + deadline_seconds
    attempt = 0
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=600.0) as http:
        while True:
            response: httpx.Response | None = None
            try:
                response = http.post(url, json=body)
                if response.status_code not in RETRYABLE_STATUS:
                    response.raise_for_status()
                    return response
            except httpx.TransportError:
                response = None
            delay = _retry_delay(response, attempt)
            if time.monotonic() + delay > deadline:
                if response is not None:
                    response.raise_for_status()
                raise TimeoutError(f"POST {url} did not succeed within {deadline_seconds:.0f}s")
            time.sleep(delay)
            attempt += 1


def chat(
    messages: list[dict[str, Any]],
    env: AgentEnvironment | None = None,
    *,
    deadline_seconds: float = 1800.0,
    **params: Any,
) -> dict[str, Any]:
    """One chat completion without the `openai` package; waits out pauses (429 + Retry-After)."""
    env = env or AgentEnvironment.from_env()
    body = {"model": params.pop("model", "policy"), "messages": messages, **params}
    response = _post_with_retries(
        f"{env.openai_base_url}/chat/completions", env.key, body, deadline_seconds=deadline_seconds
    )
    result: dict[str, Any] = response.json()
    return result


def report_reward(
    value: float, env: AgentEnvironment | None = None, *, deadline_seconds: float = 300.0
) -> None:
    """Post this rollout's reward (`{"event_type": "reward", "data": {"value": ...}}`)."""
    env = env or AgentEnvironment.from_env()
    event = {"event_type": "reward", "data": {"value": float(value)}}
    _post_with_retries(env.event_url, env.key, event, deadline_seconds=deadline_seconds)
