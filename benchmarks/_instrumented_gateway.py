"""Run `asyncrl gateway` with measurement hooks, imports and start-up left out of what is measured.

    python benchmarks/_instrumented_gateway.py profile OUT.prof gateway --port ...   (under cProfile)
    python benchmarks/_instrumented_gateway.py gc OUT.json gateway --port ...        (garbage-collector time)

It imports the CLI, the gateway and the modules uvicorn loads first, then runs `asyncrl gateway` itself with
the hook on. Stop it with SIGINT: uvicorn shuts down cleanly and OUT is written. (`python -m cProfile -o OUT
-m asyncrl.cli gateway ...` works too, but then about a second of imports is part of the profile.) The gc mode
adds no profiler, so its shares are undistorted: it books the thread CPU time of every collection.
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import json
import sys
import time
from typing import Any

from asyncrl import cli

for module in (
    "asyncrl.gateway.server",
    "uvicorn",
    "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.auto",
    "uvloop",
):
    importlib.import_module(module)


class GcClock:
    """Thread CPU time spent in each generation's collections (gc.callbacks)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.thread_time()
            return
        generation = int(info["generation"])
        self.seconds[generation] += time.thread_time() - self.started
        self.collections[generation] += 1


def main() -> int:
    mode, out_path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode not in {"profile", "gc"}:
        raise SystemExit(f"mode must be profile or gc, not {mode!r}")
    args = cli.build_parser().parse_args(argv)
    profile = cProfile.Profile() if mode == "profile" else None
    clock = GcClock()
    cpu_started = time.process_time()
    if profile is not None:
        profile.enable()
    else:
        gc.callbacks.append(clock)
    try:
        code: int = args.handler(args)
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(out_path)
        else:
            gc.callbacks.remove(clock)
            stats = {
                "gc_seconds_by_generation": clock.seconds,
                "collections_by_generation": clock.collections,
                "cpu_seconds": time.process_time() - cpu_started,
                "gc_threshold": gc.get_threshold(),
                "tracked_objects": len(gc.get_objects()),
            }
            with open(out_path, "w") as file:
                json.dump(stats, file)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
