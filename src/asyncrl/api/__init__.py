"""The AsyncTrainingRun API (asyncrl.dev/v1alpha1): its types, and the CRD generated from them.

The operator, the trainer's configuration and local mode all read a run through these types, so they agree
with the API server on what a valid run is and on every default.
"""

from asyncrl.api.types import (
    API_VERSION,
    AsyncTrainingRun,
    AsyncTrainingRunSpec,
    AsyncTrainingRunStatus,
    InvalidRunError,
    Phase,
    check_update,
    load_run,
)

__all__ = [
    "API_VERSION",
    "AsyncTrainingRun",
    "AsyncTrainingRunSpec",
    "AsyncTrainingRunStatus",
    "InvalidRunError",
    "Phase",
    "check_update",
    "load_run",
]
