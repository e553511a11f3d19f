"""Who may call what: the gateway key for management, and per-rollout agent tokens.

An agent's token is an HMAC of its rollout id under the gateway key, so the gateway can check it without
storing anything, and a token lets its holder call only that rollout's proxy and event routes.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import Enum

TOKEN_PREFIX = "aglr-"
POOL_TOKEN_PREFIX = "aglp-"


class Access(Enum):
    MANAGEMENT = "management"
    ROLLOUT = "rollout"
    MISSING = "missing"
    DENIED = "denied"


def agent_token(key: str, rollout_id: str) -> str:
    """The bearer token that the agent of `rollout_id` receives as AGL_KEY."""
    digest = hmac.new(key.encode(), rollout_id.encode(), hashlib.sha256).hexdigest()
    return f"{TOKEN_PREFIX}{digest}"


def pool_token(key: str) -> str:
    """The bearer token of a run's agent pool pods: it may take rollouts and report their outcomes
    (`/api/pool/*`), nothing else; the pool gives each agent only its rollout's own token."""
    digest = hmac.new(key.encode(), b"asyncrl agent pool", hashlib.sha256).hexdigest()
    return f"{POOL_TOKEN_PREFIX}{digest}"


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def check_access(key: str, authorization: str | None, rollout_id: str | None = None) -> Access:
    """MANAGEMENT for the gateway key; ROLLOUT for the token of `rollout_id`; else MISSING or DENIED."""
    token = bearer(authorization)
    if token is None:
        return Access.MISSING
    if hmac.compare_digest(token.encode(), key.encode()):
        return Access.MANAGEMENT
    if rollout_id is not None and hmac.compare_digest(token.encode(), agent_token(key, rollout_id).encode()):
        return Access.ROLLOUT
    return Access.DENIED
