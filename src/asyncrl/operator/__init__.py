"""The operator: reconciles AsyncTrainingRuns into a trainer Job with a gateway sidecar, and turns queued
rollouts into agent Jobs. It is the only writer of a run's status.

Its layers, top down (an import-linter contract): `main` (`asyncrl operator`), `handlers` (kopf's wiring),
`dispatcher` (the rollout dispatcher), `reconciliation` (a run's reconcile and its observations), and the
plumbing every part uses (`kube`, `retry`, `metrics`, `diffbase`). What it creates is built in
`asyncrl.workloads`, and agent templates are rendered by `asyncrl.agent_templates`."""
