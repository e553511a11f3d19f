"""The `asyncrl` console script is installed and answers."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from asyncrl import __version__
from asyncrl.cli import main


def test_console_script_reports_its_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"asyncrl {__version__}"


def test_no_subcommand_prints_help_and_fails() -> None:
    assert main([]) == 2


def test_import_operator_is_still_the_standard_library() -> None:
    # The repository has a top-level operator/ folder (the operator image); it must not shadow the stdlib.
    import operator

    assert Path(operator.__file__ or "").parent == Path(sysconfig.get_paths()["stdlib"])
