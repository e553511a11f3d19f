"""Test infrastructure shipped with asyncrl: a real local control plane and a kubelet stand-in.

Used by asyncrl's own tests and available to users who want to exercise their agent templates against real
API semantics without a cluster (`asyncrl.testing.controlplane`, `asyncrl.testing.podrunner`).
"""
