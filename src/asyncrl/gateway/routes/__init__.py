"""The gateway's management and store routes, one router per concern; `asyncrl.gateway.api` assembles them.

- `pause`: pause / resume / state (Agent Lightning's contract, plus a server-side drain wait), upstreams;
- `rollouts`: create, list, claim, launch, transition, delete rollouts;
- `events`: agents' events and the rollouts' events documents;
- `feeds`: the completion feed, the window summary, the stats and the trainer's report;
- `health`: liveness, readiness and Prometheus metrics;
- `pool`: the agent pool's claim and report, and the operator's release of gone pods' rollouts.

Each router module is small and takes the gateway's parts (`GatewayParts`) explicitly, so a route can be read
and tested beside the state it touches. None says who may call it: `access.py`'s table does, for all.
"""
