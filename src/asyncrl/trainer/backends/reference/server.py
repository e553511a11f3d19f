"""The reference backend's inference endpoint: an aiohttp server inside the trainer process.

It plays vLLM's part on CPU: the gateway forwards agents' model calls here and captures token ids and
log-probs from the answers. It runs on the event loop of whoever starts it (the trainer's), and samples in
a small thread pool, so a long generation never blocks the loop and an update (which runs in another
thread) never blocks serving. Each request reads the published `ServedPolicy` once and generates from it
to the end, so every answer comes from one version of the weights, and that version is in the answer.

`stream: true` is answered as vLLM streams, token by token as the sampling thread draws them.
Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health.
`python -m asyncrl.trainer.backends.reference.server --port P` serves an untrained model on its own (for
trying agents and the gateway without a trainer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import torch
from aiohttp import web
from transformers import PreTrainedTokenizerFast

from asyncrl.trainer.backends.reference.config import ModelConfig, ServerConfig
from asyncrl.trainer.backends.reference.model import ServedPolicy, build_policy_model, freeze_for_serving
from asyncrl.trainer.backends.reference.openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    Generation,
    chat_response,
    completion_response,
    parse_chat,
    parse_completion,
)
from asyncrl.trainer.backends.reference.sampling import Sample, generate
from asyncrl.trainer.backends.reference.streaming import StreamChunks
from asyncrl.trainer.backends.reference.tokenizer import build_tokenizer, stop_token_ids

logger = logging.getLogger(__name__)

MODEL_VERSION_HEADER = "x-asyncrl-model-version"


class InferenceServer:
    """Serves the latest published policy over OpenAI-compatible HTTP."""

    def __init__(
        self,
        *,
        config: ServerConfig,
        tokenizer: PreTrainedTokenizerFast,
        max_model_len: int,
        policy: ServedPolicy,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._policy = policy
        self._stop_token_ids = stop_token_ids(tokenizer)
        self._runner: web.AppRunner | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._port: int | None = None

    @property
    def policy(self) -> ServedPolicy:
        return self._policy

    def publish(self, policy: ServedPolicy) -> None:
        """Serve `policy` from the next request on; requests in flight finish on the one they started with."""
        self._policy = policy

    @property
    def url(self) -> str:
        """Base URL without `/v1`; valid once started."""
        if self._port is None:
            raise RuntimeError("the inference server is not started")
        return f"http://{self.config.host}:{self._port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        self._executor = ThreadPoolExecutor(
            self.config.worker_threads, thread_name_prefix="asyncrl-inference"
        )
        runner = web.AppRunner(self.build_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        logger.info("reference inference server listening on %s", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self._port = None

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_chat, chat_response)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_completion, completion_response)

    async def _serve(self, request: web.Request, parse: Any, respond: Any) -> web.StreamResponse:
        """One generation request: parse, sample from the current weights, answer in OpenAI's shape."""
        try:
            parsed, generation = parse(
                await _json_body(request),
                tokenizer=self.tokenizer,
                config=self.config,
                max_model_len=self.max_model_len,
            )
            policy = self._policy
            if parsed.stream:
                return await self._stream(request, parsed, generation, policy)
            samples = await self._sample(policy, generation)
        except ApiError as error:
            return web.json_response(error.body(), status=error.status)
        body = respond(
            parsed,
            generation,
            samples,
            tokenizer=self.tokenizer,
            model_name=self.config.served_model_name,
            model_version=policy.version,
        )
        return _answer(body, policy.version)

    async def _stream(
        self,
        request: web.Request,
        parsed: ChatCompletionRequest | CompletionRequest,
        generation: Generation,
        policy: ServedPolicy,
    ) -> web.StreamResponse:
        """Answer as server-sent events, each token sent as it is drawn (vLLM's chunks, `streaming.py`).

        The sampling thread hands tokens to the loop; a token's chunk is sent when the next token (or the
        end of its choice) is known, so the last one carries the finish reason. A client that leaves stops
        the generation at its next token.
        """
        if self._executor is None:
            raise ApiError(503, "the inference server is stopping", error_type="ServiceUnavailableError")
        chunks = StreamChunks(
            request=parsed,
            generation=generation,
            tokenizer=self.tokenizer,
            model_name=self.config.served_model_name,
            model_version=policy.version,
        )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_StreamItem] = asyncio.Queue()
        left = threading.Event()

        def emit(item: _StreamItem) -> None:  # called on the sampling thread
            if left.is_set():
                raise _ClientLeft()
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def finished(done: asyncio.Future[list[Sample]]) -> None:
            # Retrieved here, whoever reads the result later: a generation stopped by `_ClientLeft` is
            # never read, and asyncio would log "Future exception was never retrieved" for it.
            if not done.cancelled():
                done.exception()
            queue.put_nowait(None)

        sampling = loop.run_in_executor(self._executor, self._sample_blocking, policy, generation, emit)
        sampling.add_done_callback(finished)
        response = web.StreamResponse(
            headers={
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                MODEL_VERSION_HEADER: str(policy.version),
            }
        )
        await response.prepare(request)
        pending: tuple[int, int, float, tuple[tuple[int, float], ...]] | None = None
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, Sample):  # the choice of the pending token is finished
                    if pending is not None:
                        await _send_chunk(response, chunks.token(*pending, final=item))
                    pending = None
                    continue
                if pending is not None:
                    await _send_chunk(response, chunks.token(*pending))
                elif item[0] not in chunks.started:
                    for opening in chunks.opening(item[0]):
                        await _send_chunk(response, opening)
                    chunks.started.add(item[0])
                pending = item
            try:
                samples = sampling.result()
            except Exception as error:  # reported mid-stream, as vLLM does
                logger.exception("streamed generation failed")
                body = ApiError(500, f"generation failed: {error}", error_type="InternalServerError").body()
                await _send_chunk(response, body)
            else:
                usage = chunks.usage(samples)
                if usage is not None:
                    await _send_chunk(response, usage)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            logger.info("a streaming client left; its generation stops at the next token")
        finally:
            left.set()
        return response

    async def _models(self, _request: web.Request) -> web.Response:
        model = {
            "id": self.config.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "asyncrl",
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _health(self, _request: web.Request) -> web.Response:
        version = self._policy.version
        return _answer({"status": "ok", "model_version": version}, version)

    async def _sample(self, policy: ServedPolicy, generation: Generation) -> list[Sample]:
        if self._executor is None:
            raise ApiError(503, "the inference server is stopping", error_type="ServiceUnavailableError")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._sample_blocking, policy, generation)

    def _sample_blocking(
        self,
        policy: ServedPolicy,
        generation: Generation,
        emit: Callable[[_StreamItem], None] | None = None,
    ) -> list[Sample]:
        """The n samples; with `emit`, each token (index, token, logprob, alternatives) and each finished
        sample are handed to it as they come."""
        seed = generation.seed if generation.seed is not None else secrets.randbits(63)
        generator = torch.Generator().manual_seed(seed)
        stop_token_ids = frozenset[int]() if generation.ignore_eos else self._stop_token_ids
        samples = []
        for index in range(generation.n):
            on_token = None if emit is None else partial(_emit_token, emit, index)
            sample = generate(
                policy.model,
                self.tokenizer,
                prompt_token_ids=generation.prompt_token_ids,
                params=generation.params,
                stop_token_ids=stop_token_ids,
                generator=generator,
                on_token=on_token,
            )
            if emit is not None:
                emit(sample)
            samples.append(sample)
        return samples


_StreamItem = tuple[int, int, float, tuple[tuple[int, float], ...]] | Sample | None


def _emit_token(
    emit: Callable[[_StreamItem], None],
    index: int,
    token: int,
    logprob: float,
    alternatives: tuple[tuple[int, float], ...],
) -> None:
    emit((index, token, logprob, alternatives))


class _ClientLeft(Exception):
    """Raised on the sampling thread to stop a generation whose streaming client has gone."""


async def _send_chunk(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not JSON: {error}") from error


def _answer(body: dict[str, Any], version: int) -> web.Response:
    return web.json_response(body, headers={MODEL_VERSION_HEADER: str(version)})


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve an untrained reference model (no training).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's initial weights")
    parser.add_argument("--served-model-name", default=ServerConfig().served_model_name)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)  # see ReferenceBackendConfig.torch_threads
    model_config = ModelConfig(seed=args.seed)
    server_config = ServerConfig(host=args.host, port=args.port, served_model_name=args.served_model_name)
    tokenizer = build_tokenizer()
    model = build_policy_model(model_config, vocab_size=len(tokenizer))
    server = InferenceServer(
        config=server_config,
        tokenizer=tokenizer,
        max_model_len=model_config.max_model_len,
        policy=freeze_for_serving(model, version=0),
    )

    async def serve() -> None:
        await server.start()
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
