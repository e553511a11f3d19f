"""verl's own vLLM server class on CPU, behind our real gateway, through the calls our backend makes around
an update.

Real here: verl 0.9.1's `vLLMHttpServer` (verl/workers/rollout/vllm_rollout/vllm_async_server.py) as a Ray
actor, configured from the rollout and model config our Verl backend composes (`compose_verl_config`),
starting vLLM 0.24's OpenAI server (CPU build) on a tiny model made here; `asyncrl gateway` registered with it
as the step loop registers the backend's servers; an agent's chat call over HTTP. The server runs in a driver
process on the vLLM venv's python (`asyncrl.testing.verl_server_cpu`), since this venv has no vLLM.

Replaced, and why:

- verl's replica and trainer around the server. Our backend starts it through `WindowDrivenTrainer.init()`:
  the actor worker group, then `vLLMReplica.launch_servers`, which places the server on the rollout workers'
  GPUs (vllm_async_server.py:1343-1350 reads each worker's GPU id) and needs GPUs in the resource pool
  (verl/single_controller/ray/base.py:240). Here the server actor is created as `launch_servers` creates it,
  with no GPU worker, and the test calls the server methods verl's replica and checkpoint manager call.
- the weight transfer inside `checkpoint_manager.update_weights()`: verl's vLLM worker extension loads the
  sent weights with `update_weights_from_ipc`, which fails on vLLM's CPU build with "'Parameter' object has
  no attribute 'weight_loader'" (vllm/model_executor/models/llama.py:468): the CPU linear kernels repack the
  weights after loading and drop the parameter vLLM's loader writes into
  (vllm/model_executor/layers/linear.py:211-215). Its server-side calls around the transfer are made;
  tests/vllm/test_weight_sync_against_vllm.py covers the weight sync with vLLM's own reload_weights. For
  the same reason vLLM loads the checkpoint itself (`load_format: auto`) instead of starting with dummy
  weights that the trainer's initial sync replaces.
- vLLM's CPU workers accept `sleep` and `wake_up` and do nothing (vllm/v1/worker/cpu_worker.py:172-178,
  "sleep mode is not supported on CPU"), so this proves the calls, their order and that the server answers
  after them; not that memory is freed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.events import CallRecord, EventsDocument
from asyncrl.testing.verl_server_cpu import VerlServerProcess, run_processes
from asyncrl.testing.vllm_cpu import VllmVenv
from asyncrl.testing.waiting import wait_for
from asyncrl.trainer.backends.verl.backend import served_model_name
from tests.gateway.conftest import RunningGateway, create_rollouts, launch_gateway
from tests.trainer.backends.verl_support import verl_config
from tests.vllm.conftest import SRC

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LAUNCH_TIMEOUT_SECONDS = 900.0  # vLLM's start: about a minute on two idle cores, CI shares them
MODEL_VERSION = 1  # the version our backend passes to update_weights after the first update
MESSAGES = [{"role": "user", "content": "Name two colours."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo"]}},
            "required": ["city"],
        },
    },
}

# What our backend's sleep() and wake() (backend.py, _sleep_blocking and _wake_blocking) reach on the server
# actor: one replica on one node, HYBRID mode (actor and rollout collocated), checkpoint engine "naive" and
# free_cache_engine true (our config's values, checked below).
SLEEP_CALLS: list[tuple[str, dict[str, Any]]] = [
    # checkpoint_manager.abort_replicas() (verl/checkpoint_engine/base.py:484)
    # -> vLLMReplica.abort_all_requests (vllm_async_server.py:1435)
    ("abort_all_requests", {"reject_request": False}),
    # checkpoint_manager.sleep_replicas() (base.py:469) -> vLLMReplica.sleep (vllm_async_server.py:1421-1422)
    ("wait_for_requests_to_drain", {}),
    ("sleep", {}),
]
WAKE_CALLS: list[tuple[str, dict[str, Any]]] = [
    # checkpoint_manager.update_weights(version), backend "naive" (base.py:518): the actor workers'
    # update_weights (verl/workers/engine_workers.py:728) through verl's vLLM ServerAdapter
    # (verl/workers/rollout/vllm_rollout/vllm_rollout.py):
    ("wake_up", {"tags": ["weights"]}),  # engine_workers.py:782 -> vllm_rollout.py:202
    # (replaced) the weights themselves: collective_rpc("update_weights_from_ipc") and the buckets sent over
    # ZMQ (vllm_rollout.py:229-243), see the module docstring
    ("clear_kv_cache", {}),  # vllm_rollout.py:248
    ("set_global_steps", {"global_steps": MODEL_VERSION}),  # vllm_rollout.py:250
    ("wake_up", {"tags": ["kv_cache"]}),  # engine_workers.py:823 -> vllm_rollout.py:202
    # checkpoint_manager.resume_generation_replicas() (base.py:489) -> vLLMReplica.resume_generation
    # (vllm_async_server.py:1454-1455)
    ("resume_engine_generation", {}),
    ("open_submission_gate", {}),
]


def cpu_verl_config(model_dir: Path) -> Any:
    """verl's config as our backend composes it for a run on this model, with the changes CPU needs."""
    config = verl_config(model={"name": "tiny", "path": str(model_dir)})
    rollout = config.actor_rollout_ref.rollout
    # vLLM's CPU build refuses sleep mode: "Sleep mode is not supported on current platform"
    # (vllm/config/model.py:520-521). verl's sleep and wake_up calls still run (see the module docstring).
    # verl's YAML leaves the key out (RolloutConfig's default, True: verl/workers/config/rollout.py:268).
    with open_dict(rollout):
        rollout.enable_sleep_mode = False
    # The trainer's weight sync cannot run on CPU (module docstring), so vLLM loads the checkpoint itself
    # rather than dummy weights (verl's default, replaced by the initial sync on a GPU).
    rollout.load_format = "auto"
    # Otherwise vLLM's CPU platform compiles the model with inductor (vllm/platforms/cpu.py:180-193): minutes
    # of C++ compilation on two cores.
    rollout.enforce_eager = True
    # Not required by vLLM (its CPU platform lists bfloat16 for x86: vllm/platforms/cpu.py:68), but the tiny
    # model is float32, CPU bfloat16 depends on the machine's bf16 instructions, and the other tests against
    # vLLM serve float32 too (asyncrl/testing/vllm_cpu.py).
    rollout.dtype = "float32"
    return config


@dataclass
class VerlServer:
    process: VerlServerProcess
    address: str  # as verl's replica reports it: host:port
    launch_seconds: float

    @property
    def url(self) -> str:
        return f"http://{self.address}"  # as our backend turns verl's addresses into serve_urls


@pytest.fixture(scope="module")
def verl_server(
    vllm_venv: VllmVenv, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VerlServer]:
    directory = tmp_path_factory.mktemp("verl-server")
    config = cpu_verl_config(tiny_model_dir)
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.checkpoint_engine.backend, rollout.free_cache_engine) == ("naive", True)
    assert rollout.engine_kwargs.vllm == {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    config_path = directory / "verl.yaml"
    OmegaConf.save(config, config_path, resolve=True)
    process = VerlServerProcess(
        vllm_venv.python, config_path, env=vllm_venv.env(SRC), log_path=directory / "driver.log"
    )
    try:
        ready = process.answer(timeout=LAUNCH_TIMEOUT_SECONDS, what="vLLMHttpServer.launch_server()")
        # The driver's mark reaches what it started (Ray's processes, the actor, vLLM's engine: 14 here), so
        # the check after stop() below sees them all.
        assert len(run_processes(process.marker)) > 1
        yield VerlServer(process=process, address=ready["address"], launch_seconds=ready["launch_seconds"])
    finally:
        process.stop()
        # Nothing of this run is left: not the driver, Ray's processes, the server actor nor vLLM's.
        wait_for(
            lambda: not run_processes(process.marker),
            timeout=60,
            what="every process of the verl server run to be gone",
        )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """`asyncrl gateway` started with no upstream, as the trainer's gateway is; the test registers it."""
    running = launch_gateway([], tmp_path_factory.mktemp("gateway"), "--capture=full")
    yield running
    running.process.stop()


def register(gateway: RunningGateway, server: VerlServer) -> str:
    """The step loop's `connect()`: the backend's serve_urls and served model name, PUT /api/upstreams."""
    model = asyncio.run(served_model_name(server.url))

    async def put() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            view = await client.set_upstreams([server.url], model=model)
        assert (view.upstreams, view.model) == ([server.url], model)

    asyncio.run(put())
    return model


def agent_chat(gateway: RunningGateway, rollout_id: str, *, seed: int) -> CallRecord:
    with gateway.management() as admin:
        create_rollouts(admin, rollout_id)
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(
            gateway.proxy_path(rollout_id),
            json={"model": "what-the-agent-says", "messages": MESSAGES, "max_tokens": 16, "seed": seed},
            timeout=300,
        )
    assert answer.status_code == 200, answer.text
    with gateway.management() as admin:
        events = admin.get(f"/api/rollouts/{rollout_id}/events")
    assert events.status_code == 200, events.text
    (call,) = EventsDocument.model_validate_json(events.content).model_calls
    assert answer.json() == call.response  # the agent got vLLM's answer as it is
    return call


def agent_tools_call(gateway: RunningGateway, rollout_id: str, *, mode: str, **body: Any) -> dict[str, Any]:
    """A chat call with `tools`; vLLM's answer, which must be 200 (vLLM started without a tool-call parser
    answers 400: `"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`)."""
    with gateway.management() as admin:
        create_rollouts(admin, rollout_id)
    request = {"messages": MESSAGES, "tools": [WEATHER_TOOL], "max_tokens": 400, "seed": 4, **body}
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(gateway.proxy_path(rollout_id, mode=mode), json=request, timeout=300)
    assert answer.status_code == 200, answer.text
    reply: dict[str, Any] = answer.json()
    return reply


def assert_captured(call: CallRecord, model: str) -> None:
    """The gateway forwarded to verl's server under its model name and captured what vLLM answered."""
    assert call.request["model"] == model
    (choice,) = call.response["choices"]
    assert call.prompt_token_ids == tuple(call.response["prompt_token_ids"])
    assert call.response_token_ids == tuple(choice["token_ids"])
    assert len(call.response_token_ids) >= 1
    logprobs = tuple(float(item["logprob"]) for item in choice["logprobs"]["content"])
    assert call.response_logprobs == logprobs
    assert all(value <= 0.0 for value in logprobs)


def test_verl_server_serves_the_gateway_and_answers_after_the_update_calls(
    verl_server: VerlServer, gateway: RunningGateway, tiny_model_dir: Path
) -> None:
    # 1. verl's server started vLLM's OpenAI server and reported host:port.
    host, _, port = verl_server.address.rpartition(":")
    assert host, verl_server.address
    assert port.isdigit(), verl_server.address
    print(f"\nvLLMHttpServer.launch_server(): {verl_server.launch_seconds:.1f}s")

    # 2. The gateway, registered as the step loop registers the backend's servers, captures an agent's call.
    model = register(gateway, verl_server)
    assert model == str(tiny_model_dir)  # verl serves the model under its path (no served_model_name)
    started = time.monotonic()
    assert_captured(agent_chat(gateway, "before-update", seed=1), model)
    print(f"chat through the gateway: {time.monotonic() - started:.1f}s")

    # verl started vLLM with the tool-call parser of our config (engine_kwargs.vllm, from
    # spec.model.toolCallParser): a train-mode call with tools (automatic choice) is answered, and a
    # validation call naming the function gets the call parsed by the parser.
    agent_tools_call(gateway, "with-tools", mode="train")
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = agent_tools_call(gateway, "named-tool", mode="val", tool_choice=named)
    (tool_call,) = forced["choices"][0]["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather"
    assert json.loads(tool_call["function"]["arguments"]) == {"city": "Oslo"}

    # 3. One step's calls, in the step loop's order: pause the gateway (drained), the backend's sleep(),
    # (the update), its wake(), resume the gateway.
    async def pause() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            drained = await client.pause(reason="update")
        assert drained.drained

    async def resume() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            await client.resume(model_version=MODEL_VERSION)

    asyncio.run(pause())
    answers: dict[str, Any] = {}
    for method, kwargs in [*SLEEP_CALLS, *WAKE_CALLS]:
        answer = verl_server.process.call(method, **kwargs)
        answers.setdefault(method, answer["result"])
        print(f"server.{method}({kwargs}): {answer['seconds']:.3f}s -> {answer['result']!r}")
    assert answers["abort_all_requests"] == {"aborted_count": 0, "request_ids": []}  # the gateway drained
    asyncio.run(resume())

    # Still answered, through the gateway, by verl's server.
    assert_captured(agent_chat(gateway, "after-update", seed=2), model)
