"""A run's one level-triggered reconcile, and what it observes.

Observe (the children the watches saw: `child_index.py`; the trainer Job or RayCluster: `ray_child.py`;
the gateway and its Job counters, through the link it shares with the dispatcher: `run_link/`), decide
(`reconcile.py` and the state machine in `status.py`, both pure), apply (`reconciler.py`, `children_io.py`).
It alone writes a run's status and phase events, creates its children (from the first creation on) and
recreates them, and suspends or stops its trainer (tests/architecture/test_one_writer.py checks the first
two). It never imports the rollout dispatcher, nor the dispatcher it: it reads it through
`reconciler.Dispatcher`."""
