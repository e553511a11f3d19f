"""How the trainer ends when it cannot go on, and what it tells the others before it exits.

The trainer container restarts in place after an error (the pod's restartPolicy is OnFailure), which cures
a crash but not a wrong setting or a run whose agents never succeed. So the trainer sorts its failures:
- a configuration error (bad manifest, data file, verl setting) exits with EXIT_CONFIG_ERROR,
- a run that cannot progress (maxFailedSteps consecutive steps with nothing to train) with EXIT_RUN_FAILED,
- anything else with 1, and the container is restarted (so does a Ray cluster whose nodes have not all
  joined by the preflight's deadline: `ClusterNotReady`).
Before exiting it leaves a `TrainerReport` with the gateway (which outlives the container); the operator
turns a permanent one into the run's Failed phase and stops the trainer, and local mode does not restart it.
"""

from __future__ import annotations

from asyncrl.gateway_api.models import TrainerOutcome

EXIT_CONFIG_ERROR = 78  # EX_CONFIG in sysexits.h
EXIT_RUN_FAILED = 79

EXIT_CODES = {
    TrainerOutcome.CONFIG_ERROR: EXIT_CONFIG_ERROR,
    TrainerOutcome.RUN_FAILED: EXIT_RUN_FAILED,
    TrainerOutcome.FAILED: 1,
}
PERMANENT_EXIT_CODES = frozenset({EXIT_CONFIG_ERROR, EXIT_RUN_FAILED})


class RunFailed(RuntimeError):
    """The run cannot make progress; restarting the trainer would not change that."""


class ClusterNotReady(RuntimeError):
    """The run's Ray cluster is not all there yet (no head, a node missing); a restart waits for it again."""
