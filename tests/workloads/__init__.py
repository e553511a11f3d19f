"""Tests of the pure builders of a run's workloads (src/asyncrl/workloads): its children's manifests."""
