"""`asyncrl gateway`: read the run's settings and the flags, the key (file or env, never logged), and serve
with uvicorn.

Local mode and the operator start the gateway with `--config run.yaml`, the run's manifest the trainer reads
too: what the run decides (the model, pauses, capture, sampling) comes from it (`run_settings.py`). Those
settings are flags too, only for a gateway run by hand without `--config`; their defaults are the API's, read
from the same place, and a flag beside `--config` is refused rather than silently winning or losing.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import resource
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr, ValidationError

from asyncrl.api import AsyncTrainingRun, InvalidRunError, load_run
from asyncrl.capturing import CaptureMode
from asyncrl.gateway.app import build_gateway
from asyncrl.gateway.budgets import AgentBudget
from asyncrl.gateway.config import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    MAX_JSON_DEPTH_CEILING,
    GatewayConfig,
)
from asyncrl.gateway.connections import ConnectionLimits, connection_cap, guarded_protocol
from asyncrl.gateway.run_settings import GatewayRunSettings, run_settings, standalone_defaults
from asyncrl.gateway_api.tokens import KEY_ENV_VAR
from asyncrl.pause_modes import PauseMode
from asyncrl.rollout_sampling import SamplingParamsPolicy

logger = logging.getLogger(__name__)

_AGENT = AgentBudget()
_CONNECTIONS = ConnectionLimits()
_BODY_TIMEOUT = GatewayConfig.model_fields["body_timeout_seconds"].default
_UPSTREAM_TIMEOUT = GatewayConfig.model_fields["upstream_timeout_seconds"].default
_RUN = standalone_defaults(model="-")  # what a gateway run by hand gets: only read for the help texts here

# The run's settings as flags, for a gateway run by hand: flag dest -> GatewayRunSettings field (a dotted name
# inside rollout_sampling). Each defaults to None in the parser; `run_settings_of` fills the rest from
# `standalone_defaults`, so no default of a run's setting is written in this file.
RUN_FLAGS: dict[str, str] = {
    "model": "model",
    "retry_after_seconds": "retry_after_seconds",
    "pause_mode": "pause_mode",
    "hold_timeout_seconds": "hold_timeout_seconds",
    "max_held_calls": "max_held_calls",
    "capture": "capture",
    "max_capture_bytes_per_rollout": "max_capture_bytes_per_rollout",
    "max_capture_bytes": "max_capture_bytes",
    "sampling_params": "sampling_params",
    "rollout_temperature": "rollout_sampling.temperature",
    "rollout_top_p": "rollout_sampling.top_p",
    "rollout_top_k": "rollout_sampling.top_k",
}
_FROM_FLAG = {
    "pause_mode": PauseMode.from_flag,
    "capture": CaptureMode.from_flag,
    "sampling_params": SamplingParamsPolicy.from_flag,
}
# Idle keep-alive connections that have shown a credential are closed after this: longer than every client's
# pool keeps one (httpx 5 s, aiohttp 15 s); uvicorn's default, 5 s, closed them as httpx reused them.
KEEP_ALIVE_SECONDS = math.ceil(_CONNECTIONS.idle_timeout_seconds)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`asyncrl gateway`'s flags. `--help` lists the ungrouped ones in the order they are added here, then
    each group in turn."""
    _add_serving_arguments(parser)
    _add_run_arguments(parser)
    _add_pause_arguments(parser)
    parser.add_argument(
        "--upstream-timeout-seconds",
        type=float,
        default=_UPSTREAM_TIMEOUT,
        help=f"per model call (default {_UPSTREAM_TIMEOUT:g})",
    )
    _add_admission_limit_arguments(parser)
    _add_agent_budget_arguments(parser)
    _add_connection_arguments(parser)
    _add_capture_arguments(parser)
    _add_sampling_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the gateway listens, where model calls go, and its key."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8090, help="port to listen on (default 8090)")
    parser.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="OpenAI-compatible server; repeatable. Optional: without it, model calls get 503 until the "
        "trainer registers the servers with PUT /api/upstreams",
    )
    parser.add_argument("--key-file", type=Path, help=f"file holding the gateway key (or set {KEY_ENV_VAR})")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The run whose settings the gateway takes: a manifest, or the flags marked 'run'."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="RUN.yaml",
        help="the AsyncTrainingRun manifest whose settings the gateway takes (the model, spec.gateway's "
        "pauses, capture and sampling, the rollout sampling), as the trainer does: how local mode and the "
        "operator start it. Without it, the flags marked 'run' below, defaulting to a run's defaults",
    )
    parser.add_argument("--model", help="run: model name forwarded upstream (required without --config)")
    parser.add_argument(
        "--retry-after-seconds",
        type=float,
        help="run: Retry-After (fractions allowed, also sent as retry-after-ms) when a call is refused while "
        f"paused or while no upstream is registered (default {_RUN.retry_after_seconds:g})",
    )


def _add_pause_arguments(parser: argparse.ArgumentParser) -> None:
    """What a model call that arrives during a weight update gets."""
    pauses = parser.add_argument_group(
        "pauses (see docs/tuning-the-window.md)",
        "What a model call that arrives during a weight update (or before any upstream) gets.",
    )
    pauses.add_argument(
        "--pause-mode",
        choices=[mode.value.lower() for mode in PauseMode],
        help="run: hold: the call waits in the gateway and is forwarded at the resume (the agent sees one "
        "slow answer); reject: 429 + Retry-After + X-Agl-Paused at once, Agent Lightning's contract "
        f"(default {_RUN.pause_mode.value.lower()})",
    )
    pauses.add_argument(
        "--hold-timeout-seconds",
        type=float,
        metavar="S",
        help="run: a call held this long gets the 429 it would have had "
        f"(default {_RUN.hold_timeout_seconds:g})",
    )
    pauses.add_argument(
        "--max-held-calls",
        type=int,
        metavar="N",
        help=f"run: calls held at once; more get 429 (default {_RUN.max_held_calls})",
    )


def _add_admission_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The limits every request meets at admission, after its credential."""
    limits = parser.add_argument_group(
        "limits at admission (what one agent can send; see docs/security.md)",
        "Every request is authenticated before any body byte is read; then these apply.",
    )
    limits.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help="request body limit, counted while it arrives (chunked bodies too); more gets 413 "
        f"(default {DEFAULT_MAX_BODY_BYTES}, at least 1024)",
    )
    limits.add_argument(
        "--max-json-depth",
        type=int,
        default=DEFAULT_MAX_JSON_DEPTH,
        metavar="N",
        help="nesting limit of request JSON on every route and model call; deeper gets 422 naming the "
        f"field (default {DEFAULT_MAX_JSON_DEPTH}, at most {MAX_JSON_DEPTH_CEILING})",
    )
    limits.add_argument(
        "--max-event-bytes",
        type=int,
        default=DEFAULT_MAX_EVENT_BYTES,
        metavar="N",
        help="event data (JSON bytes) one rollout may store in all; more gets 413 "
        f"(default {DEFAULT_MAX_EVENT_BYTES})",
    )
    limits.add_argument(
        "--body-timeout-seconds",
        type=float,
        default=_BODY_TIMEOUT,
        metavar="S",
        help=f"a body not all received this long after its headers gets 408 (default {_BODY_TIMEOUT:g})",
    )


def _add_agent_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """What one agent token may take of the gateway."""
    budget = parser.add_argument_group(
        "each agent token's budget (see docs/security.md)",
        "So one agent cannot take the event loop from the others; past it, 429 + Retry-After. The gateway "
        "key and the pool token have none.",
    )
    budget.add_argument(
        "--agent-max-requests",
        type=int,
        default=_AGENT.max_requests,
        metavar="N",
        help=f"requests one agent token may have in flight, held calls too (default {_AGENT.max_requests})",
    )
    budget.add_argument(
        "--agent-bytes-per-second",
        type=int,
        default=_AGENT.bytes_per_second,
        metavar="N",
        help=f"body bytes per second one agent token may send on average (default {_AGENT.bytes_per_second})",
    )
    budget.add_argument(
        "--agent-burst-bytes",
        type=int,
        default=_AGENT.burst_bytes,
        metavar="N",
        help="body bytes one agent token may send at once, at least --max-body-bytes "
        f"(default {_AGENT.burst_bytes})",
    )


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Header and idle timeouts, and the cap on open connections."""
    connections = parser.add_argument_group(
        "connections (see docs/security.md)",
        "Header and idle timeouts, and a cap that closes the least proven idle connection to make room; the "
        "gateway key's connections are never closed for room.",
    )
    connections.add_argument(
        "--header-timeout-seconds",
        type=float,
        default=_CONNECTIONS.header_timeout_seconds,
        metavar="S",
        help="a connection whose request headers are not complete this long after it opened (or after the "
        f"request's first byte) is closed (default {_CONNECTIONS.header_timeout_seconds:g})",
    )
    connections.add_argument(
        "--idle-timeout-seconds",
        type=float,
        default=_CONNECTIONS.idle_timeout_seconds,
        metavar="S",
        help="an idle connection that has shown a credential is closed after this; keep it longer than the "
        f"clients' pools keep connections (default {_CONNECTIONS.idle_timeout_seconds:g})",
    )
    connections.add_argument(
        "--unproven-idle-timeout-seconds",
        type=float,
        default=_CONNECTIONS.unproven_idle_timeout_seconds,
        metavar="S",
        help="an idle connection that has shown no credential is closed after this "
        f"(default {_CONNECTIONS.unproven_idle_timeout_seconds:g})",
    )
    connections.add_argument(
        "--max-connections",
        type=int,
        default=_CONNECTIONS.max_connections,
        metavar="N",
        help="connections open at once, lowered to half the file-descriptor limit when that is smaller "
        f"(default {_CONNECTIONS.max_connections})",
    )


def _add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """What the store keeps of each model call, and its bounds."""
    capture = parser.add_argument_group(
        "capture (what the store keeps of each model call; see docs/tuning-the-window.md)",
        "A call past a limit is refused before it is forwarded (413 for its rollout, 507 for the store).",
    )
    capture.add_argument(
        "--capture",
        choices=[mode.value.lower() for mode in CaptureMode],
        help="run: compact: token ids and log-probs as arrays, the request and response JSON dropped; full: "
        "both JSON bodies kept too, shown in the events document (debugging; several times the memory) "
        f"(default {_RUN.capture.value.lower()})",
    )
    capture.add_argument(
        "--max-capture-bytes-per-rollout",
        type=int,
        metavar="N",
        help=f"run: captured bytes one rollout may hold (default {_RUN.max_capture_bytes_per_rollout})",
    )
    capture.add_argument(
        "--max-capture-bytes",
        type=int,
        metavar="N",
        help=f"run: captured bytes the whole store may hold (default {_RUN.max_capture_bytes})",
    )


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The agents' sampling parameters on train-mode calls."""
    parser.add_argument(
        "--sampling-params",
        choices=[policy.value.lower() for policy in SamplingParamsPolicy],
        help="run: the agents' temperature/top_p/top_k on train-mode calls: enforce the run's, reject calls "
        "that differ, or allow them (any case: Enforce too) "
        f"(default {_RUN.sampling_params.value.lower()})",
    )
    sampling = _RUN.rollout_sampling
    parser.add_argument("--rollout-temperature", type=float, help=f"run (default {sampling.temperature})")
    parser.add_argument("--rollout-top-p", type=float, help=f"run (default {sampling.top_p})")
    parser.add_argument("--rollout-top-k", type=int, help=f"run (default {sampling.top_k}: off)")


def read_key(key_file: Path | None) -> str:
    """The gateway key from --key-file, else from the environment; a clear error when neither gives one."""
    if key_file is not None:
        try:
            key = key_file.read_text().strip()
        except OSError as error:
            raise SystemExit(
                f"asyncrl gateway: cannot read --key-file {key_file}: {error.strerror}"
            ) from error
        if not key:
            raise SystemExit(f"asyncrl gateway: --key-file {key_file} is empty")
        return key
    key = os.environ.get(KEY_ENV_VAR, "").strip()
    if not key:
        raise SystemExit(f"asyncrl gateway: no key; pass --key-file PATH or set {KEY_ENV_VAR}")
    return key


def read_run(path: Path) -> AsyncTrainingRun:
    """The run of `--config`, validated as the API server and the trainer validate it; a clear error else."""
    try:
        manifest = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SystemExit(f"asyncrl gateway: cannot read --config {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise SystemExit(f"asyncrl gateway: --config {path} is not valid YAML: {error}") from error
    try:
        return load_run(manifest)
    except InvalidRunError as error:
        raise SystemExit(f"asyncrl gateway: {path}: {error}") from error


def run_settings_of(args: argparse.Namespace) -> GatewayRunSettings:
    """The run's settings: from --config (and no run flag beside it), else the standalone defaults with the
    run flags given."""
    given = {dest: getattr(args, dest) for dest in RUN_FLAGS if getattr(args, dest) is not None}
    if args.config is not None:
        if given:
            flags = ", ".join("--" + dest.replace("_", "-") for dest in given)
            raise SystemExit(
                f"asyncrl gateway: {flags}: set by the run given with --config {args.config}; change it in "
                "the run (spec.gateway, spec.model) or run the gateway without --config"
            )
        return run_settings(read_run(args.config).spec)
    if "model" not in given:
        raise SystemExit("asyncrl gateway: give --config RUN.yaml (the run's settings) or --model")
    settings: dict[str, Any] = standalone_defaults(model=given["model"]).model_dump()
    for dest, value in given.items():
        *parents, field = RUN_FLAGS[dest].split(".")
        target = settings
        for parent in parents:
            target = target[parent]
        target[field] = _FROM_FLAG[dest](value) if dest in _FROM_FLAG else value
    try:
        return GatewayRunSettings.model_validate(settings)
    except ValidationError as error:
        raise SystemExit(f"asyncrl gateway: invalid configuration: {_problems(error)}") from error


def gateway_config(args: argparse.Namespace, *, key: str) -> GatewayConfig:
    """The gateway's configuration from its parsed command line (and the run file it names)."""
    settings = run_settings_of(args)
    try:
        return GatewayConfig(
            upstreams=tuple(args.upstream or ()),
            run=settings,
            key=SecretStr(key),
            upstream_timeout_seconds=args.upstream_timeout_seconds,
            max_body_bytes=args.max_body_bytes,
            max_json_depth=args.max_json_depth,
            max_event_bytes=args.max_event_bytes,
            body_timeout_seconds=args.body_timeout_seconds,
            agent_budget=AgentBudget(
                max_requests=args.agent_max_requests,
                bytes_per_second=args.agent_bytes_per_second,
                burst_bytes=args.agent_burst_bytes,
            ),
            connections=ConnectionLimits(
                header_timeout_seconds=args.header_timeout_seconds,
                idle_timeout_seconds=args.idle_timeout_seconds,
                unproven_idle_timeout_seconds=args.unproven_idle_timeout_seconds,
                max_connections=args.max_connections,
            ),
        )
    except ValidationError as error:
        raise SystemExit(f"asyncrl gateway: invalid configuration: {_problems(error)}") from error


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from asyncrl.gateway.stopping import StoppingServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = gateway_config(args, key=read_key(args.key_file))
    gateway = build_gateway(config)
    # Start-up objects never die; freezing them and collecting less often took the collector from 15-18 %
    # of the gateway's CPU to about 1 % and halved the proxy's p99 at 64 clients (benchmarks/README.md).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 10)
    max_connections = connection_cap(config.connections.max_connections, _file_descriptor_limit())
    if max_connections < config.connections.max_connections:
        logger.warning(
            "gateway: --max-connections lowered from %d to %d, half the file-descriptor limit (ulimit -n)",
            config.connections.max_connections,
            max_connections,
        )
    if config.run.max_held_calls > max_connections:
        logger.info(
            "gateway: up to %d calls may be held through a pause but %d connections are open at once; "
            "past the connection cap agents get 429 with Retry-After (the gateway key is always served)",
            config.run.max_held_calls,
            max_connections,
        )
    protocol = guarded_protocol(
        config.connections,
        max_connections=max_connections,
        on_close=lambda reason: gateway.metrics.connections_closed.labels(reason.value).inc(),
    )
    upstreams = ", ".join(config.upstreams) or "no upstream yet (register with PUT /api/upstreams)"
    logger.info(
        "gateway on %s:%d → %s (model %s, pause mode %s)",
        args.host,
        args.port,
        upstreams,
        config.run.model,
        config.run.pause_mode.value,
    )
    server = StoppingServer(
        uvicorn.Config(
            gateway.asgi,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,
            lifespan="on",
            interface="asgi3",
            proxy_headers=False,
            # The protocol closes idle connections itself (75 s for callers with a credential, longer than
            # every client's pool keeps one: a client never sends on a connection the gateway is closing).
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            loop="auto",
            http=protocol,
        ),
        held=gateway.proxy.held,
    )
    server.run()
    return 0


def _file_descriptor_limit() -> int:
    """The soft limit on open files, raised to the hard limit first (a server's usual start-up step)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _problems(error: ValidationError) -> str:
    return "; ".join(f"{_flag_of(e['loc'])}: {e['msg']}" for e in error.errors())


def _flag_of(loc: tuple[int | str, ...]) -> str:
    """The flag that set a configuration field (`max_json_depth` → `--max-json-depth`)."""
    field = str(loc[0])
    if field == "rollout_sampling" and len(loc) > 1:
        field, loc = f"rollout_{loc[1]}", loc[1:]
    if field == "key":
        return f"the key (--key-file or {KEY_ENV_VAR})"
    if field == "agent_budget" and len(loc) > 1:
        field, loc = f"agent_{loc[1]}", loc[1:]
    elif field == "connections" and len(loc) > 1:
        field, loc = str(loc[1]), loc[1:]
    flag = "--upstream" if field == "upstreams" else "--" + field.replace("_", "-")
    return " ".join([flag, *map(str, loc[1:])])
