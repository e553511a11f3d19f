"""A toy multi-turn agent: two model calls around a slow "tool", and a reward the tiny model can learn.

Turn 1 asks the model to start an answer; a tool then takes a variable time (log-normal, so some rollouts
are much slower than others and carry-over really happens) and its output is appended; turn 2 asks the
model to finish. The reward is the share of the final answer made of the letters in the row's `target`
(e.g. "ab"), so a model that learns to write them more often is rewarded more: with the quickstart's
from-scratch reference model the mean reward rises within a few minutes on 2 CPU cores.

It uses only `asyncrl.agent`: the AGL_* variables, a client that waits out pauses, and report_reward.
With `"stream": true` in the row (or TOY_AGENT_STREAM=1) it streams both model calls (`stream: true`,
server-sent events read chunk by chunk with httpx-sse, as an agent UI would, retried as `asyncrl.agent`
retries its own calls): the gateway captures them for training
exactly like plain calls. TOY_AGENT_SEED, when set, seeds the tool's latency draw (otherwise each rollout
draws from its own AGL_KEY, so no two runs draw alike).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, connect_sse

from asyncrl.agent import AgentEnvironment, chat, raise_for_retry, report_reward, retrying

# A row: {"prompt": "write", "target": "ab", "tool_seconds": 0.5} (the tool's median latency);
# add "stream": true to stream the model calls.


def stream_chat(messages: list[dict[str, Any]], env: AgentEnvironment, **params: Any) -> str:
    """A streamed chat completion's text, read event by event; waits out 429s (Reject mode) and retries."""
    body = {"model": "policy", "messages": messages, "stream": True, **params}
    url = f"{env.openai_base_url}/chat/completions"
    with httpx.Client(headers={"authorization": f"Bearer {env.key}"}, timeout=600.0) as http:
        for attempt in retrying(deadline_seconds=1800):
            with attempt, connect_sse(http, "POST", url, json=body) as events:
                if events.response.status_code != 200:
                    events.response.read()
                    raise_for_retry(events.response)
                return "".join(_contents(events.iter_sse()))
    raise AssertionError("the retries ended without an outcome")  # never: retrying() has no attempt limit


def _contents(events: Iterator[ServerSentEvent]) -> list[str]:
    pieces = []
    for event in events:
        if event.data == "[DONE]":
            continue
        chunk = json.loads(event.data)
        if "error" in chunk:
            raise RuntimeError(f"the model call failed mid-stream: {chunk['error']}")
        for choice in chunk.get("choices") or []:
            pieces.append(choice.get("delta", {}).get("content") or "")
    return pieces


def reward_of(text: str, target: str) -> float:
    letters = [char for char in text if not char.isspace()]
    if not letters:
        return 0.0
    return sum(char in target for char in letters) / len(letters)


def main() -> None:
    env = AgentEnvironment.from_env()
    row = json.loads(os.environ.get("ROW", "{}"))
    target = str(row.get("target", "ab"))
    prompt = str(row.get("prompt", "write"))
    # TOY_AGENT_SEED fixes the tool's latency draw (benchmarks give each rollout its own); unset, every
    # rollout draws from its own token.
    rng = random.Random(os.environ.get("TOY_AGENT_SEED") or os.environ.get("AGL_KEY"))
    streaming = bool(row.get("stream")) or os.environ.get("TOY_AGENT_STREAM") == "1"

    def ask(messages: list[dict[str, Any]]) -> str:
        if streaming:
            return stream_chat(messages, env, max_tokens=12, temperature=1.0)
        return str(chat(messages, env, max_tokens=12, temperature=1.0)["choices"][0]["message"]["content"])

    messages = [{"role": "user", "content": f"{prompt} using {target}"}]
    first = ask(messages)
    median = float(row.get("tool_seconds", 0.5))
    time.sleep(
        min(16 * median, median * rng.lognormvariate(0.0, 0.9))
    )  # the tool: usually fast, sometimes slow
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "tool: ok. finish"}]
    second = ask(messages)
    report_reward(reward_of(first + second, target), env)


if __name__ == "__main__":
    main()
