"""A run's workloads as Kubernetes objects, pure: built from its spec (the trainer Job or RayCluster, the
gateway Service, key Secret and ConfigMap, agent Jobs, the agent pool), named deterministically, and read
back (what a trainer Job or RayCluster says of the trainer).

Neutral: the operator creates these objects, and local mode, the agent pool runner, `asyncrl manifest`
and the cluster commands build or name the same ones. No I/O here, and no component is imported."""
