"""The gateway's credentials as its callers derive them: the environment variable that carries the gateway
key, a rollout's agent token and the agent pool's token. An agent's token is an HMAC of its rollout id under
the gateway key, so the gateway checks it without storing anything (`asyncrl.gateway.auth`); the operator and
local mode derive it here to hand it to the agent as AGL_KEY.
"""

from __future__ import annotations

import hashlib
import hmac

KEY_ENV_VAR = "ASYNCRL_GATEWAY_KEY"
TOKEN_PREFIX = "aglr-"
POOL_TOKEN_PREFIX = "aglp-"


def agent_token(key: str, rollout_id: str) -> str:
    """The bearer token that the agent of `rollout_id` receives as AGL_KEY."""
    digest = hmac.new(key.encode(), rollout_id.encode(), hashlib.sha256).hexdigest()
    return f"{TOKEN_PREFIX}{digest}"


def pool_token(key: str) -> str:
    """The bearer token of a run's agent pool pods: it may take rollouts and report their outcomes (the pool
    routes of `access.ROUTES`), nothing else; the pool gives each agent only its rollout's own token."""
    digest = hmac.new(key.encode(), b"asyncrl agent pool", hashlib.sha256).hexdigest()
    return f"{POOL_TOKEN_PREFIX}{digest}"
