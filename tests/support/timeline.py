"""Where the suite's wall-clock goes: each test's phases, by xdist worker, and a summary of them.

`make pytest` sets ASYNCRL_TEST_TIMELINE to a file; each worker appends one JSON line per phase (setup, call,
teardown) of each test, with its start and stop (epoch seconds). `python -m tests.support.timeline FILE`
prints each worker's busy time and idle tail (the suite ends when its last worker does) and the files that
cost the most. The CI budget is kept by reading this, not by timing tests.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ENV = "ASYNCRL_TEST_TIMELINE"


def record(report: Any) -> None:
    """Appends a test phase's line to the timeline file, when one is set (called by the conftest's hook)."""
    path = os.environ.get(ENV)
    if not path or getattr(report, "node", None) is not None:  # an xdist controller: its workers write
        return
    line = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "test": report.nodeid,
        "when": report.when,
        "start": report.start,
        "stop": report.stop,
        "outcome": report.outcome,
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def summary(lines: list[dict[str, Any]], *, top: int = 25) -> str:
    if not lines:
        return "no test phases recorded"
    begin = min(line["start"] for line in lines)
    end = max(line["stop"] for line in lines)
    out = [f"suite: {end - begin:.0f}s wall, {len({line['test'] for line in lines})} tests"]
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_file: dict[str, float] = defaultdict(float)
    for line in lines:
        by_worker[line["worker"]].append(line)
        by_file[line["test"].split("::")[0]] += line["stop"] - line["start"]
    for worker, phases in sorted(by_worker.items()):
        busy = sum(p["stop"] - p["start"] for p in phases)
        last = max(p["stop"] for p in phases)
        done, idle = last - begin, end - last
        out.append(f"{worker}: busy {busy:.0f}s, done {done:.0f}s in, idle at the end {idle:.0f}s")
    out.append(f"the {top} costliest files (seconds of test time, all phases):")
    for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:top]:
        out.append(f"{seconds:8.0f}  {name}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else None
    if path is None or not path.is_file():
        print(f"usage: python -m tests.support.timeline FILE (no such file: {path})", file=sys.stderr)
        return 2
    lines = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines() if text.strip()]
    print(summary(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
