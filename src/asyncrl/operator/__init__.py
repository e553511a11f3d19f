"""The operator: reconciles AsyncTrainingRuns into a trainer Job with a gateway sidecar, and turns queued
rollouts into agent Jobs. It is the only writer of a run's status."""
