"""`asyncrl validate`'s check of `spec.trainer.verlOverrides` against what the run's backend reads.

Verl backend: the trainer's own composition (`compose_verl_config`: verl's Hydra config, asyncrl's defaults,
the overrides, the run's values, verl's registries and `validate_config`) runs here, so a key verl does not
declare, a value of the wrong type or an unknown advantage estimator is refused before apply, in the words the
trainer would use at its start. It needs verl (the `trainer` extra); without it validate says the overrides
were not checked and how to check them.

Reference backend: it reads only the learning rate of the overrides; validate names every other key as
ignored (a note, not an error: a manifest may carry verl settings for a later switch to the Verl backend).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import warnings
from dataclasses import dataclass, field

from asyncrl.api import AsyncTrainingRun
from asyncrl.api.types import TrainerBackend
from asyncrl.api.types.verl_overrides import REFERENCE_BACKEND_KEYS, reference_ignored_keys

FIELD = "spec.trainer.verlOverrides"
VERL_PACKAGES = ("verl", "hydra", "omegaconf")
INSTALL_HINT = "pip install 'asyncrl[trainer]'"


@dataclass
class Findings:
    """Problems fail validation; notes are said but do not."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def verl_findings(run: AsyncTrainingRun) -> Findings:
    trainer = run.spec.trainer
    overrides = trainer.verl_overrides or {}
    if trainer.backend is TrainerBackend.REFERENCE:
        ignored = reference_ignored_keys(overrides)
        if not ignored:
            return Findings()
        return Findings(
            notes=[
                f"{FIELD}: the Reference backend reads only {', '.join(REFERENCE_BACKEND_KEYS)} and ignores "
                f"{', '.join(ignored)} (they take effect with trainer.backend: Verl)"
            ]
        )
    missing = [name for name in VERL_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        what = "verlOverrides were" if overrides else "the run's verl configuration was"
        return Findings(
            notes=[
                f"{FIELD}: not checked: {what} not checked against verl's config ({', '.join(missing)} not "
                f"installed here); install the trainer extra ({INSTALL_HINT}) and run asyncrl validate again"
            ]
        )
    return _compose_findings(run)


def _compose_findings(run: AsyncTrainingRun) -> Findings:
    from asyncrl.trainer.backends.verl.config import VerlConfigError, compose_verl_config, verl_settings

    quiet = io.StringIO()
    try:
        # verl prints a "checks passed" line and warns about the critic; validate prints one line per file
        with contextlib.redirect_stdout(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compose_verl_config(verl_settings(run, checkpoint_dir=None))
    except VerlConfigError as error:
        message = " ".join(str(error).split())
        return Findings(problems=[message if message.startswith("spec.") else f"{FIELD}: {message}"])
    except Exception as error:  # verl or Hydra failing here is not the run's fault: say so, go on
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        return Findings(
            notes=[
                f"{FIELD}: not checked: composing verl's config failed here ({reason}); the trainer checks it"
            ]
        )
    return Findings()
