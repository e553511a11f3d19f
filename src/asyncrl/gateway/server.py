"""`asyncrl gateway`: parse flags, read the key (file or env, never logged) and serve with uvicorn."""

from __future__ import annotations

import argparse
import gc
import logging
import os
from pathlib import Path

from asyncrl.capturing import DEFAULT_MAX_CAPTURE_BYTES, DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT, CaptureMode
from asyncrl.gateway.app import build_gateway
from asyncrl.gateway.config import (
    DEFAULT_HOLD_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_HELD_CALLS,
    DEFAULT_MAX_JSON_DEPTH,
    KEY_ENV_VAR,
    MAX_JSON_DEPTH_CEILING,
    GatewayConfig,
)
from asyncrl.pausing import PauseMode
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy

logger = logging.getLogger(__name__)

# Idle keep-alive connections are closed after this; see the uvicorn.Config below for why it is not 5 s.
KEEP_ALIVE_SECONDS = 75


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8090, help="port to listen on (default 8090)")
    parser.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="OpenAI-compatible server; repeatable. Optional: without it, model calls get 503 until the "
        "trainer registers the servers with PUT /api/upstreams",
    )
    parser.add_argument("--model", required=True, help="model name forwarded upstream")
    parser.add_argument("--key-file", type=Path, help=f"file holding the gateway key (or set {KEY_ENV_VAR})")
    parser.add_argument(
        "--retry-after-seconds",
        type=float,
        default=5,
        help="Retry-After (fractions allowed, also sent as retry-after-ms) when a call is refused while "
        "paused or while no upstream is registered (default 5)",
    )
    pauses = parser.add_argument_group(
        "pauses (see docs/tuning-the-window.md)",
        "What a model call that arrives during a weight update (or before any upstream) gets.",
    )
    pauses.add_argument(
        "--pause-mode",
        choices=["hold", "reject"],
        default="hold",
        help="hold: the call waits in the gateway and is forwarded at the resume (the agent sees one slow "
        "answer); reject: 429 + Retry-After + X-Agl-Paused at once, Agent Lightning's contract "
        "(default hold)",
    )
    pauses.add_argument(
        "--hold-timeout-seconds",
        type=float,
        default=DEFAULT_HOLD_TIMEOUT_SECONDS,
        metavar="S",
        help="a call held this long gets the 429 it would have had "
        f"(default {DEFAULT_HOLD_TIMEOUT_SECONDS:g})",
    )
    pauses.add_argument(
        "--max-held-calls",
        type=int,
        default=DEFAULT_MAX_HELD_CALLS,
        metavar="N",
        help=f"calls held at once; more get 429 (default {DEFAULT_MAX_HELD_CALLS})",
    )
    parser.add_argument(
        "--upstream-timeout-seconds", type=float, default=600.0, help="per model call (default 600)"
    )
    limits = parser.add_argument_group(
        "limits at the door (what one agent can send; see docs/security.md)",
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
    capture = parser.add_argument_group(
        "capture (what the store keeps of each model call; see docs/tuning-the-window.md)",
        "A call past a limit is refused before it is forwarded (413 for its rollout, 507 for the store).",
    )
    capture.add_argument(
        "--capture",
        choices=["compact", "full"],
        default="compact",
        help="compact: token ids and log-probs as arrays, the request and response JSON dropped; full: both "
        "JSON bodies kept too, shown in the events document (debugging; several times the memory) "
        "(default compact)",
    )
    capture.add_argument(
        "--max-capture-bytes-per-rollout",
        type=int,
        default=DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT,
        metavar="N",
        help=f"captured bytes one rollout may hold (default {DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT})",
    )
    capture.add_argument(
        "--max-capture-bytes",
        type=int,
        default=DEFAULT_MAX_CAPTURE_BYTES,
        metavar="N",
        help=f"captured bytes the whole store may hold (default {DEFAULT_MAX_CAPTURE_BYTES})",
    )
    parser.add_argument(
        "--sampling-params",
        choices=[policy.value for policy in SamplingParamsPolicy],
        default=SamplingParamsPolicy.ENFORCE.value,
        help="the agents' temperature/top_p/top_k on train-mode calls: Enforce the run's (default), Reject "
        "calls that differ, or Allow them",
    )
    parser.add_argument("--rollout-temperature", type=float, default=1.0, help="the run's (default 1.0)")
    parser.add_argument("--rollout-top-p", type=float, default=1.0, help="the run's (default 1.0)")
    parser.add_argument("--rollout-top-k", type=int, default=-1, help="the run's (default -1: off)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


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


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import SecretStr, ValidationError

    from asyncrl.gateway.stopping import StoppingServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = GatewayConfig(
            upstreams=tuple(args.upstream or ()),
            model=args.model,
            key=SecretStr(read_key(args.key_file)),
            retry_after_seconds=args.retry_after_seconds,
            pause_mode=PauseMode.from_flag(args.pause_mode),
            hold_timeout_seconds=args.hold_timeout_seconds,
            max_held_calls=args.max_held_calls,
            upstream_timeout_seconds=args.upstream_timeout_seconds,
            max_body_bytes=args.max_body_bytes,
            max_json_depth=args.max_json_depth,
            max_event_bytes=args.max_event_bytes,
            capture=CaptureMode.from_flag(args.capture),
            max_capture_bytes_per_rollout=args.max_capture_bytes_per_rollout,
            max_capture_bytes=args.max_capture_bytes,
            sampling_params=SamplingParamsPolicy(args.sampling_params),
            rollout_sampling=RolloutSampling(
                temperature=args.rollout_temperature, top_p=args.rollout_top_p, top_k=args.rollout_top_k
            ),
        )
    except ValidationError as error:
        problems = "; ".join(f"{_flag_of(e['loc'])}: {e['msg']}" for e in error.errors())
        raise SystemExit(f"asyncrl gateway: invalid configuration: {problems}") from error
    gateway = build_gateway(config)
    # Start-up objects never die; freezing them and collecting less often took the collector from 15-18 %
    # of the gateway's CPU to about 1 % and halved the proxy's p99 at 64 clients (benchmarks/README.md).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 10)
    upstreams = ", ".join(config.upstreams) or "no upstream yet (register with PUT /api/upstreams)"
    logger.info(
        "gateway on %s:%d → %s (model %s, pause mode %s)",
        args.host,
        args.port,
        upstreams,
        config.model,
        config.pause_mode.value,
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
            # Longer than every client's pool keeps an idle connection (httpx 5 s, aiohttp 15 s): a client
            # then never sends on a connection the gateway is closing (uvicorn's default, 5 s, raced httpx).
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            loop="auto",
            http="auto",
        ),
        held=gateway.proxy.held,
    )
    server.run()
    return 0


def _flag_of(loc: tuple[int | str, ...]) -> str:
    """The flag that set a configuration field (`max_json_depth` → `--max-json-depth`)."""
    field = str(loc[0])
    if field == "key":
        return f"the key (--key-file or {KEY_ENV_VAR})"
    flag = "--upstream" if field == "upstreams" else "--" + field.replace("_", "-")
    return " ".join([flag, *map(str, loc[1:])])
