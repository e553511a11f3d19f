"""The gateway's wire contract: what its callers import, never the gateway server itself.

The HTTP client (`client`), the request and answer models (`models`, `pool`), the events document of a rollout
(`events`), the URL paths (`paths`), the upstream URLs it accepts (`upstreams`) and the credentials callers
derive (`tokens`). The trainer, the operator, local mode, the agent pool and agents import this package; it
imports nothing of `asyncrl.gateway`, and `asyncrl.gateway` (the server) imports it for the same models, so
the two sides of the wire cannot drift apart. `make lint` checks both directions.
"""
