"""The `asyncrl` command line: one entry point whose subcommands start each component."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from asyncrl import __version__

Handler = Callable[[argparse.Namespace], int]


def _gateway(args: argparse.Namespace) -> int:
    from asyncrl.gateway.server import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl",
        description="Collocated asynchronous RL training of LLM agents on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"asyncrl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    from asyncrl.gateway.server import add_arguments as gateway_arguments

    gateway = commands.add_parser(
        "gateway", help="run the gateway: model-call proxy with pause/drain, rollout store, events"
    )
    gateway_arguments(gateway)
    gateway.set_defaults(handler=_gateway)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
