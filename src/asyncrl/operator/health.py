"""The operator's probes on `--health-port`: `/healthz` (liveness: the event loop answers) and `/readyz`
(readiness: 200 once the permissions review found nothing missing, else 503 with the reason as JSON).

With leader election (`--leader-elect`), `/readyz` also says `"leading"`, but a standby that may do the
work is ready too: its readiness means "can take over", so `helm install --wait` and a rolling update (whose
new pods stand by while the old leader holds the Lease) go on; the metric `asyncrl_operator_leader` and the
Lease say which replica leads.

Served in kopf's event loop, as kopf's own liveness endpoint was, so an answer also means that loop is alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.permissions import REVIEW_SECONDS, Missing, describe, review

logger = logging.getLogger(__name__)


@dataclass
class Readiness:
    """What `/readyz` says: not ready until the first review, then ready when nothing is missing."""

    missing: list[Missing] | None = None
    leading: bool | None = None  # None: no leader election (the only replica acts)

    def answer(self) -> tuple[int, dict[str, object]]:
        election: dict[str, object] = {} if self.leading is None else {"leading": self.leading}
        if self.missing is None:
            return 503, {"ready": False, "reason": "starting: permissions not reviewed yet", **election}
        if self.missing:
            return 503, {
                "ready": False,
                "reason": describe(self.missing),
                "missing": [
                    {"namespace": entry.namespace, "permission": str(entry.permission)}
                    for entry in self.missing
                ],
                **election,
            }
        return 200, {"ready": True, **election}


@dataclass
class HealthServer:
    port: int
    readiness: Readiness = field(default_factory=Readiness)
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)])
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "0.0.0.0", self.port).start()  # the pod's probe port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def _readyz(self, request: web.Request) -> web.Response:
        status, body = self.readiness.answer()
        return web.json_response(body, status=status)


async def review_forever(
    api_client: object,
    namespaces: Sequence[str],
    readiness: Readiness,
    metrics: OperatorMetrics,
    *,
    interval_seconds: float = REVIEW_SECONDS,
    also: Sequence[Missing] = (),
) -> None:
    """Review the permissions every `interval_seconds`; log a change once, keep metrics and readiness.
    `also`: more permissions to check, each in its namespace (the leader election's Lease)."""
    while True:
        try:
            missing = await review(api_client, namespaces, also=also)
        except Exception as error:  # the API server unreachable: keep the last answer, say why, try again
            logger.warning("could not review the operator's permissions: %s", error)
        else:
            if missing != readiness.missing:
                if missing:
                    logger.error("not ready: %s", describe(missing))
                elif readiness.missing:
                    logger.info("ready: every permission the operator needs is granted now")
            readiness.missing = missing
            metrics.missing_permissions.clear()
            for entry in missing:
                metrics.missing_permissions.labels(entry.namespace, str(entry.permission)).set(1)
        await asyncio.sleep(interval_seconds)
