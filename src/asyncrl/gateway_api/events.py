"""The events document: one rollout's captured model calls and agent events, as they cross the wire.

`GET /api/rollouts/{rollout_id}/events` answers one `EventsDocument`; `POST /api/rollouts/events` answers an
`EventsBatchAnswer` holding many. The gateway writes them (`asyncrl.gateway.capture`), the trainer reads them
(`asyncrl.trainer.adapter`, through `asyncrl.gateway_api.client`): both import these models, so the schema
lives in one place and a change to it is a change to both sides.

Token ids and log-probs are validated at capture time with the same types the reader uses (`TokenIds`,
`LogProbs`), so what the store keeps as packed arrays reads back exactly as the upstream's JSON did. The
models ignore unknown keys: a newer gateway may add fields without breaking an older trainer.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from asyncrl.gateway_api.models import RolloutView

TokenIds = tuple[int, ...]
LogProbs = tuple[float, ...]
TOKEN_IDS: TypeAdapter[TokenIds] = TypeAdapter(TokenIds)
LOG_PROBS: TypeAdapter[LogProbs] = TypeAdapter(LogProbs)


class CallRecord(BaseModel):
    """One captured model call."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    attempt_id: str | None = None
    endpoint: str = Field(default="", description="chat/completions or completions.")
    status: int = Field(description="The upstream's HTTP status; 499 for a stream the agent abandoned.")
    latency_seconds: float = 0.0
    model_version: int | None = Field(default=None, description="Training step of the weights that answered.")
    started_at: float
    choice_index: int = Field(
        default=0, description="Which choice of the answer this is: a call with n choices is n records."
    )
    prompt_token_ids: TokenIds | None = None
    response_token_ids: TokenIds | None = None
    response_logprobs: LogProbs | None = Field(
        default=None,
        description="One per response token; absent when the upstream gave none or a non-finite one.",
    )
    agent_sampling: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The agent's own values of the sampling parameters the gateway owns (temperature, top_p, top_k, "
            "penalties, logit_bias, structured output, ...), when it replaced or removed any; a value longer "
            "than 200 bytes of JSON is kept as a summary."
        ),
    )
    aborted: bool = Field(
        default=False,
        description="A stream the agent abandoned, or a choice vLLM aborted (finish_reason abort).",
    )
    request: Any = Field(default=None, description="The forwarded request's JSON (capture Full only).")
    response: Any = Field(default=None, description="The upstream's response JSON (capture Full only).")
    unreadable: str | None = Field(
        default=None, description="Why part of this call is missing (not captured, or not encodable)."
    )


class EventRecord(BaseModel):
    """One event an agent posted (a reward among them)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    attempt_id: str | None = None
    event_type: str | None = None
    at: float | None = None
    data: dict[str, Any] | None = None
    unreadable: str | None = None


class EventsDocument(BaseModel):
    """`GET /api/rollouts/{rollout_id}/events`: the rollout's view, its calls (oldest first), its events."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rollout: RolloutView
    model_calls: tuple[CallRecord, ...] = ()
    events: tuple[EventRecord, ...] = ()


class EventsBatchAnswer(BaseModel):
    """`POST /api/rollouts/events`: the documents found, the ids not held, the ids left out for the bound."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: str
    missing: tuple[str, ...] = ()
    omitted: tuple[str, ...] = ()
    documents: tuple[EventsDocument, ...] = ()


def parse_events_batch(body: bytes) -> tuple[EventsBatchAnswer, dict[str, str]]:
    """The batch answer, and the ids of documents that do not validate with why (they are left out).

    The whole body is validated in one pass; only when that fails is each document validated on its own, so
    one malformed document (an older gateway's, say) costs only its own rollout.
    """
    try:
        return EventsBatchAnswer.model_validate_json(body), {}
    except ValidationError:
        pass
    raw = json.loads(body)
    if not isinstance(raw, dict) or not isinstance(raw.get("documents"), list):
        raise ValueError("the gateway's events batch is not a JSON object with a documents list")
    documents: list[EventsDocument] = []
    malformed: dict[str, str] = {}
    for index, document in enumerate(raw["documents"]):
        try:
            documents.append(EventsDocument.model_validate(document))
        except ValidationError as error:
            malformed[_rollout_id_of(document) or f"#{index}"] = str(error)
    answer = EventsBatchAnswer.model_validate({**raw, "documents": []})
    return answer.model_copy(update={"documents": tuple(documents)}), malformed


def _rollout_id_of(document: Any) -> str | None:
    rollout = document.get("rollout") if isinstance(document, dict) else None
    rollout_id = rollout.get("rollout_id") if isinstance(rollout, dict) else None
    return rollout_id if isinstance(rollout_id, str) else None
