"""A run's one level-triggered reconcile, and what it observes.

Observe (the children the watches saw: `child_index.py`; the trainer Job or RayCluster: `ray_child.py`;
the gateway and its Job counters: `gateway_link.py`), decide (`reconcile.py` and the state machine in
`status.py`, both pure), apply (`reconciler.py`, `children_io.py`). It alone writes a run's status and events,
creates or recreates its children and suspends or stops its trainer. It never imports the rollout dispatcher:
it reads it through `reconciler.Dispatcher`."""
