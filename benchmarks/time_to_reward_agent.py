"""The time-to-reward benchmark's agent (benchmarks/time_to_reward.py): the toy agent with a seeded tool.

Each agent process takes the next number from a counter shared by the run's agents ($TIME_TO_REWARD_COUNTER,
under an exclusive lock) and runs the toy agent with TOY_AGENT_SEED=<run seed>:<number>. So the k-th agent
started in a run draws the k-th tool latency of its seed's stream, whatever the configuration: runs of one
seed see the same latencies in the same order, where rollout ids (random) would give each run its own.
"""

from __future__ import annotations

import fcntl
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # where examples/ is


def next_number(counter: Path) -> int:
    with counter.open("a+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        taken = int(file.read().strip() or 0)
        file.seek(0)
        file.truncate()
        file.write(str(taken + 1))
        return taken


def main() -> None:
    number = next_number(Path(os.environ["TIME_TO_REWARD_COUNTER"]))
    os.environ["TOY_AGENT_SEED"] = f"{os.environ['TIME_TO_REWARD_SEED']}:{number}"
    sys.path.insert(0, str(ROOT))
    runpy.run_module("examples.toy_agent.agent", run_name="__main__")


if __name__ == "__main__":
    main()
