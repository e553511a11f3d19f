"""The rollout dispatcher: the one long-lived part of a run besides its reconcile.

Queued rollouts become agent Jobs at most once, rate-limited and capped (`launching.py`, `ratelimit.py`,
`vanished_launches.py`, `template_checks.py`), Job outcomes reach the gateway (`reports.py`, `job_state.py`),
the Jobs of cancelled rollouts are deleted (`cancellations.py`), agent pods that cannot start are said
(`agent_pods_io.py`, `agent_pods.py`), and a Pool run's agent pool is kept (`pool_keeper.py`); what these
parts share is stated in `shared.py`, and `controller.py` is the facade that builds them. It runs beside the
run's reconciler, under the run's supervisor (`run_supervisor.py`), and only reports what it observed to it;
it decides and writes no status and creates none of the run's children. It never imports the reconciliation,
nor the reconciliation it: what both use is below both (`run_link/`)."""
