"""Starting the run's parts: one place for what the operator (as Kubernetes objects) and local mode (as local
processes) both launch, and the process helpers they and the test harness share.

A neutral layer: production code (the operator, local mode) and the test harness (asyncrl.testing) import it;
it imports neither of them.
"""
