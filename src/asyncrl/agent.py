"""What an agent needs to take part in training: its environment, a retrying model client, reward reporting.

Each agent Job (or local agent process) gets three variables: `AGL_OPENAI_BASE_URL` (its rollout's proxy
route; use it as an OpenAI base URL), `AGL_EVENT_URL` (where its events go) and `AGL_KEY` (a token valid for
this rollout only). While the trainer updates weights the gateway answers 429 with Retry-After; the clients
here wait and retry (stamina's retries, honouring Retry-After), so a pause is invisible to the agent's logic.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import stamina

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
        from asyncrl.gateway_api.tokens import agent_token

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
        from asyncrl.gateway_api.paths import events_path, proxy_base_path

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


class RetryableAnswer(httpx.HTTPStatusError):
    """The gateway answered 429 or 502-504 (paused, overloaded, restarting): worth sending again. An
    `HTTPStatusError`, so when the retries run out the caller sees the last answer as httpx would say it."""


def raise_for_retry(response: httpx.Response) -> None:
    """`RetryableAnswer` for an answer worth sending again; another error status raises `HTTPStatusError`."""
    if response.status_code in RETRYABLE_STATUS:
        raise RetryableAnswer(
            f"{response.status_code} from {response.request.url}", request=response.request, response=response
        )
    response.raise_for_status()


def retry_wait(error: BaseException) -> bool | float:
    """stamina's backoff hook for the gateway's answers: the Retry-After a refusal names (a pause says how
    long it lasts), else stamina's own jittered backoff; no connection is retried too, any other error not."""
    if isinstance(error, RetryableAnswer):
        header = error.response.headers.get("retry-after")
        try:
            seconds = float(header) if header is not None else -1.0
        except ValueError:
            seconds = -1.0
        return seconds if seconds >= 0 else True
    return isinstance(error, httpx.TransportError)


def retrying(*, deadline_seconds: float) -> Iterator[stamina.Attempt]:
    """The attempts of one call to the gateway (`for attempt in retrying(...): with attempt: ...`): retried
    as `retry_wait` says until `deadline_seconds` have passed, then the last error is raised."""
    return iter(
        stamina.retry_context(
            on=retry_wait,
            attempts=None,
            timeout=deadline_seconds,
            wait_initial=0.2,
            wait_max=5.0,
            wait_jitter=0.2,
        )
    )


def _post_with_retries(
    url: str, key: str, body: dict[str, Any], *, deadline_seconds: float
) -> httpx.Response:
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=600.0) as http:
        try:
            for attempt in retrying(deadline_seconds=deadline_seconds):
                with attempt:
                    response = http.post(url, json=body)
                    raise_for_retry(response)
                    return response
        except httpx.TransportError as error:
            raise TimeoutError(
                f"POST {url} did not succeed within {deadline_seconds:.0f}s: {error}"
            ) from error
    raise AssertionError("stamina ended its attempts without an outcome")  # never: attempts=None


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
