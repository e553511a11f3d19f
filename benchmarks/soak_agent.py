"""The soak's agent (benchmarks/soak.py): records that it ran and how it ended, and runs the toy agent.

Two lines per execution, `<rollout id> <unix time> start` and `<rollout id> <unix time> exit <code>`,
appended to $SOAK_EXECUTIONS (O_APPEND: lines of concurrent agents never interleave), so the soak counts
rollouts executed twice or never, and agents that succeeded while the gateway recorded another outcome.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # where examples/ is


def record(what: str) -> None:
    line = f"{os.environ['SOAK_ROLLOUT_ID']} {time.time():.3f} {what}\n".encode()
    fd = os.open(os.environ["SOAK_EXECUTIONS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def main() -> int:
    record("start")
    sys.path.insert(0, str(ROOT))
    code = 1
    try:
        runpy.run_module("examples.toy_agent.agent", run_name="__main__")
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    finally:
        record(f"exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
