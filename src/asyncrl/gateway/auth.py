"""The gateway's credentials: the gateway key, the per-rollout agent tokens, the agent pool's token; and who a
bearer token proves its holder to be. Which caller may call which route is `access.py`'s table.

An agent's token is an HMAC of its rollout id under the gateway key, so the gateway can check it without
storing anything; the pool token is an HMAC of a fixed label under the key.
"""

from __future__ import annotations

import hmac

from asyncrl.gateway.access import Caller
from asyncrl.gateway_api.tokens import agent_token, pool_token


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def identify(key: str, authorization: str | None, rollout_id: str | None = None) -> Caller | None:
    """Who the bearer token proves its holder to be: KEY, AGENT (the token of `rollout_id`), POOL, or ANYONE
    (a token that proves nothing here); None when there is no bearer token."""
    token = bearer(authorization)
    if token is None:
        return None
    given = token.encode()
    if hmac.compare_digest(given, key.encode()):
        return Caller.KEY
    if rollout_id is not None and hmac.compare_digest(given, agent_token(key, rollout_id).encode()):
        return Caller.AGENT
    if hmac.compare_digest(given, pool_token(key).encode()):
        return Caller.POOL
    return Caller.ANYONE
