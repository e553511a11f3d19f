"""The `asyncrl` command line: one entry point whose subcommands start each component."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl import __version__

Handler = Callable[[argparse.Namespace], int]


def _gateway(args: argparse.Namespace) -> int:
    from asyncrl.gateway.server import run

    return run(args)


def _operator(args: argparse.Namespace) -> int:
    from asyncrl.operator.main import run

    return run(args)


def _trainer(args: argparse.Namespace) -> int:
    from asyncrl.trainer.main import run

    return run(args)


def _local_run(args: argparse.Namespace) -> int:
    from asyncrl.local.run import run

    return run(args)


def _validate(args: argparse.Namespace) -> int:
    from asyncrl.manifest.validate import run

    return run(args)


def _render_agent_job(args: argparse.Namespace) -> int:
    from asyncrl.manifest.agent_job import run

    return run(args)


def _agent_pool(args: argparse.Namespace) -> int:
    from asyncrl.agent_pool import run

    return run(args)


def _crd(args: argparse.Namespace) -> int:
    from asyncrl.api.crd import run

    return run(args)


def _plot(args: argparse.Namespace) -> int:
    from asyncrl.plot import run

    return run(args)


def add_plot_command(commands: Any) -> None:
    """`asyncrl plot METRICS.jsonl`: reward, carry-over and step time per step, as a PNG."""
    from asyncrl.plot import add_arguments as plot_arguments

    plot = commands.add_parser(
        "plot", help="draw a run's metrics file (reward, carry-over, step time) as a PNG"
    )
    plot_arguments(plot)
    plot.set_defaults(handler=_plot)


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

    from asyncrl.operator.main import add_arguments as operator_arguments

    operator_parser = commands.add_parser("operator", help="run the operator (kopf) for AsyncTrainingRuns")
    operator_arguments(operator_parser)
    operator_parser.set_defaults(handler=_operator)

    from asyncrl.trainer.main import add_arguments as trainer_arguments

    trainer = commands.add_parser("trainer", help="run the trainer: the async window, updates, checkpoints")
    trainer_arguments(trainer)
    trainer.set_defaults(handler=_trainer)

    from asyncrl.local.run import add_arguments as local_run_arguments

    local = commands.add_parser("local", help="run a manifest on this machine, without Kubernetes")
    local_commands = local.add_subparsers(dest="local_command", metavar="COMMAND", required=True)
    local_run = local_commands.add_parser("run", help="run gateway, trainer and agents as local processes")
    local_run_arguments(local_run)
    local_run.set_defaults(handler=_local_run)

    from asyncrl.manifest.validate import add_arguments as validate_arguments

    validate = commands.add_parser(
        "validate",
        help="check manifests as kubectl apply and the operator would (fields, rules, agent template); "
        "one line per problem, exit 1 if any",
    )
    validate_arguments(validate)
    validate.set_defaults(handler=_validate)

    from asyncrl.manifest.agent_job import add_arguments as render_arguments

    render = commands.add_parser(
        "render-agent-job",
        help="print the agent Job the operator would create for a row of the run's data (YAML)",
    )
    render_arguments(render)
    render.set_defaults(handler=_render_agent_job)

    from asyncrl.agent_pool import add_arguments as agent_pool_arguments

    agent_pool = commands.add_parser(
        "agent-pool",
        help="run one agent pool pod (agents.mode: Pool): take rollouts from the gateway, one after another",
    )
    agent_pool_arguments(agent_pool)
    agent_pool.set_defaults(handler=_agent_pool)

    crd = commands.add_parser(
        "crd", help="print, --write or --check the CRD (and its reference docs) generated from the API types"
    )
    from asyncrl.api.crd import add_arguments as crd_arguments

    crd_arguments(crd)
    crd.set_defaults(handler=_crd)
    add_plot_command(commands)
    from asyncrl.cluster_cli import add_commands as add_cluster_commands

    add_cluster_commands(commands)  # `asyncrl runs summary|logs|port-forward`
    lowercase_choices(parser)
    return parser


def lowercase_choices(parser: argparse.ArgumentParser) -> None:
    """One convention for every command's choice flags: lowercase words (`--sampling-params enforce`, as
    `--pause-mode hold`, `--log-level info`), read in any case (`Enforce`, the manifest's spelling, too).

    Manifests keep Kubernetes' CamelCase enum values (`samplingParams: Enforce`); a flag's value is the
    same word in lowercase, and each command maps it back (`PauseMode.from_flag` and its siblings)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):
                lowercase_choices(subparser)
        elif action.choices is not None and all(isinstance(choice, str) for choice in action.choices):
            action.choices = [str(choice).lower() for choice in action.choices]
            action.type = _lowered(action.type)
            if isinstance(action.default, str):
                action.default = action.default.lower()


def _lowered(convert: Any) -> Any:
    def lowered(text: str) -> Any:
        return (convert or str)(text.lower())

    return lowered


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
