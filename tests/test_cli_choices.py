"""One case convention for every command's choice flags (issue 26): lowercase words, read in any case.

Before, `--pause-mode hold` and `--capture compact` were lowercase while `--sampling-params` took only
`Enforce`; a user writing either spelling got `invalid choice`. Every choice flag of every command is
checked here, with the real parser, in lowercase, in the manifest's CamelCase and in capitals."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from asyncrl.capturing import CaptureMode
from asyncrl.cli import build_parser
from asyncrl.pause_modes import PauseMode
from asyncrl.rollout_sampling import SamplingParamsPolicy


def choice_flags(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str, list[str]]]:
    """(the command's words, the flag, its choices) for every choice flag under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from choice_flags(subparser, (*path, name))
        elif action.choices is not None and action.option_strings:
            yield path, action.option_strings[-1], [str(choice) for choice in action.choices]


FLAGS = sorted(choice_flags(build_parser()))


def test_the_flags_are_found() -> None:
    named = {(path, flag) for path, flag, _ in FLAGS}
    assert (("gateway",), "--sampling-params") in named
    assert (("gateway",), "--pause-mode") in named
    assert (("gateway",), "--capture") in named


@pytest.mark.parametrize(("path", "flag", "choices"), FLAGS, ids=[f"{' '.join(p)} {f}" for p, f, _ in FLAGS])
def test_every_choice_flag_is_lowercase_and_read_in_any_case(
    path: tuple[str, ...], flag: str, choices: list[str]
) -> None:
    subcommand = build_parser()._subparsers._group_actions[0].choices[path[0]]  # type: ignore[union-attr]
    for word in path[1:]:
        subcommand = subcommand._subparsers._group_actions[0].choices[word]  # type: ignore[union-attr]
    assert choices == [choice.lower() for choice in choices]
    action = next(action for action in subcommand._actions if flag in action.option_strings)
    for choice in choices:
        for spelling in (choice, choice.capitalize(), choice.upper()):
            assert action.type is not None
            assert action.type(spelling) == choice


def test_the_gateway_reads_each_spelling_of_its_modes() -> None:
    for spelling in ("enforce", "Enforce", "ENFORCE"):
        assert SamplingParamsPolicy.from_flag(spelling) is SamplingParamsPolicy.ENFORCE
    assert PauseMode.from_flag("Hold") is PauseMode.HOLD
    assert CaptureMode.from_flag("FULL") is CaptureMode.FULL


def test_a_wrong_word_still_lists_the_lowercase_choices() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "gateway", "--model", "m", "--sampling-params", "strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "invalid choice: 'strict' (choose from 'enforce', 'reject', 'allow')" in result.stderr
