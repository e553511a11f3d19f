"""A toy multi-turn agent: two model calls around a slow "tool", and a reward the tiny model can learn.

Turn 1 asks the model to start an answer; a tool then takes a variable time (log-normal, so some rollouts
are much slower than others and carry-over really happens) and its output is appended; turn 2 asks the
model to finish. The reward is the share of the final answer made of the letters in the row's `target`
(e.g. "ab"), so a model that learns to write them more often is rewarded more: with the quickstart's
from-scratch reference model the mean reward rises within a few minutes on 2 CPU cores.

It uses only `asyncrl.agent`: the AGL_* variables, a client that waits out pauses, and report_reward.
"""

from __future__ import annotations

import json
import os
import random
import time

from asyncrl.agent import AgentEnvironment, chat, report_reward

# A row: {"prompt": "write", "target": "ab", "tool_seconds": 0.5} (the tool's median latency).


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
    rng = random.Random(os.environ.get("AGL_KEY"))
    messages = [{"role": "user", "content": f"{prompt} using {target}"}]
    first = chat(messages, env, max_tokens=12, temperature=1.0)["choices"][0]["message"]["content"]
    median = float(row.get("tool_seconds", 0.5))
    time.sleep(
        min(16 * median, median * rng.lognormvariate(0.0, 0.9))
    )  # the tool: usually fast, sometimes slow
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "tool: ok. finish"}]
    second = chat(messages, env, max_tokens=12, temperature=1.0)["choices"][0]["message"]["content"]
    report_reward(reward_of(first + second, target), env)


if __name__ == "__main__":
    main()
