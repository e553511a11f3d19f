"""The rollout dispatcher: the one long-lived part of a run besides its reconcile.

Queued rollouts become agent Jobs at most once, rate-limited and capped (`controller.py`, `ratelimit.py`),
Job outcomes reach the gateway (`job_state.py`), and a Pool run's agent pool is kept (`pool_keeper.py`). It
starts the run's reconciler and only reports what it observed to it; it decides no status."""
