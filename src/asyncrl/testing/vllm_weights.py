"""New policy weights into a running vLLM OpenAI server (CPU build), and the log-probs it serves after.

Why this exists: the verl backend's step ends with verl's `update_weights`. On a GPU that sends the actor's
tensors over CUDA IPC to verl's worker extension inside vLLM (`vLLMColocateWorkerExtension.
update_weights_from_ipc`: `model.load_weights`, then `process_weights_after_loading`). That worker method
cannot run on vLLM's CPU build: the CPU linear kernels repack each weight when it is loaded and drop the
loadable parameter (`dispatch_cpu_unquantized_gemm(..., remove_weight=True)`), so a second `load_weights`
fails (`'Parameter' object has no attribute 'weight_loader'`) after part of the model was already replaced.
vLLM's own in-place reload (the worker's `reload_weights`: put the checkpoint layout back, load, repack,
layer by layer) does work there. This module drives it through the server's development endpoints
(`VLLM_SERVER_DEV_MODE=1`), surrounded by the engine calls verl makes around a weight update (pause with
abort, sleep level 2, wake the weights, load, clear the prefix cache, wake the KV cache, resume), so a test
can check that what vLLM serves after an update is the trained policy, token by token.

One limit, measured on vLLM 0.24's CPU build: with tied word embeddings, the LM head keeps serving the old
weights after a reload (its repacked copy is not rebuilt), so `untie_word_embeddings` gives the served model
its own head first. vLLM's CPU worker ignores sleep and wake (it logs so); they are sent for their engine-side
effects (scheduling paused, caches cleared) and to keep verl's order.

Run in the vLLM venv (torch and transformers at the GPU image's pins):
    python -m asyncrl.testing.vllm_weights untie SRC DST
    python -m asyncrl.testing.vllm_weights check --url URL --model NAME --model-dir DIR --work-dir DIR
`check` prints one JSON line: the served and the policy's prompt log-probs before and after each update.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

# The server needs its development endpoints (/pause, /sleep, /wake_up, /collective_rpc, ...).
DEV_MODE_ENV: Mapping[str, str] = {"VLLM_SERVER_DEV_MODE": "1"}
WEIGHTS_FILE = "model.safetensors"
PROMPT = "The quick brown fox jumps over the lazy dog, again and again."

# verl's engine calls before the weights (abort_replicas, sleep_replicas, then update_weights' resume of the
# weights: vllm_async_server.py abort_all_requests, _sleep_hybrid, wake_up) ...
_BEFORE_LOAD: tuple[tuple[str, dict[str, str]], ...] = (
    ("/pause", {"mode": "abort", "clear_cache": "true"}),
    ("/sleep", {"level": "2"}),
    ("/wake_up", {"tags": "weights"}),
)
# ... and after them (clear_kv_cache, resume of the KV cache, resume_generation_replicas).
_AFTER_LOAD: tuple[tuple[str, dict[str, str]], ...] = (
    ("/reset_prefix_cache", {}),
    ("/wake_up", {"tags": "kv_cache"}),
    ("/resume", {}),
)


def update_weights(url: str, weights_dir: Path, *, timeout: float = 300.0) -> float:
    """Load the safetensors files in `weights_dir` into the server at `url` in place; the seconds it took.

    Names are the checkpoint's (Hugging Face) names, as `model.load_weights` takes them; every weight of the
    served model must be there.
    """
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=timeout) as client:
        for path, params in _BEFORE_LOAD:
            _post(client, path, params=params)
        _post(
            client,
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}},
        )
        for path, params in _AFTER_LOAD:
            _post(client, path, params=params)
    return time.perf_counter() - started


def served_prompt_logprobs(
    url: str, model: str, token_ids: Sequence[int], *, timeout: float = 300.0
) -> list[float]:
    """vLLM's log-prob of each prompt token after the first, given the ones before it (`prompt_logprobs`)."""
    response = httpx.post(
        f"{url}/v1/completions",
        # Temperature 1: the model's own distribution, whatever the model's generation config says.
        json={
            "model": model,
            "prompt": list(token_ids),
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "temperature": 1.0,
        },
        timeout=timeout,
    )
    if response.status_code != 200:
        raise RuntimeError(f"{url}/v1/completions answered {response.status_code}: {response.text}")
    entries = response.json()["choices"][0]["prompt_logprobs"]
    return [
        float(entry[str(token)]["logprob"]) for entry, token in zip(entries[1:], token_ids[1:], strict=True)
    ]


def _post(client: httpx.Client, path: str, **kwargs: Any) -> None:
    response = client.post(path, **kwargs)
    if response.status_code != 200:
        raise RuntimeError(
            f"{client.base_url}{path} answered {response.status_code}: {response.text} "
            "(development endpoints need VLLM_SERVER_DEV_MODE=1 in the server's environment)"
        )


# -- the policy side (torch, transformers: the vLLM venv) ---------------------------------------------------


def save_weights(model: Any, directory: Path) -> Path:
    """The model's parameters, under their checkpoint names, as one safetensors file in `directory`."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: parameter.detach().contiguous() for name, parameter in model.named_parameters()}
    save_file(tensors, str(directory / WEIGHTS_FILE))
    return directory


def policy_prompt_logprobs(model: Any, token_ids: Sequence[int]) -> list[float]:
    """The Hugging Face model's log-prob of each prompt token after the first, as `served_prompt_logprobs`."""
    import torch

    ids = torch.tensor([list(token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return [float(value) for value in chosen]


def untie_word_embeddings(source: Path, target: Path) -> Path:
    """A copy of the model at `source` in `target`, its LM head its own tensor (equal to the embedding)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(source)
    config.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def check(url: str, model_name: str, model_dir: Path, work_dir: Path, *, rounds: int = 2) -> dict[str, Any]:
    """Train the served model `rounds` optimizer steps, push each into the server, and record the log-probs.

    Each step is one Adam step on the prompt's language-model loss (any loss would do: it moves every weight).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if AutoConfig.from_pretrained(model_dir).tie_word_embeddings:
        raise ValueError(f"{model_dir} ties its word embeddings: serve untie_word_embeddings' copy")
    token_ids = AutoTokenizer.from_pretrained(model_dir).encode(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = torch.tensor([token_ids])
    report: dict[str, Any] = {
        "token_ids": token_ids,
        "initial": {
            "served": served_prompt_logprobs(url, model_name, token_ids),
            "policy": policy_prompt_logprobs(model, token_ids),
        },
        "updates": [],
    }
    for step in range(rounds):
        model(batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds = update_weights(url, save_weights(model, work_dir / f"step-{step}"))
        report["updates"].append(
            {
                "seconds": seconds,
                "served": served_prompt_logprobs(url, model_name, token_ids),
                "policy": policy_prompt_logprobs(model, token_ids),
            }
        )
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.testing.vllm_weights", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    untie = commands.add_parser("untie", help="copy a model, giving it its own LM head")
    untie.add_argument("source", type=Path)
    untie.add_argument("target", type=Path)
    run = commands.add_parser("check", help="train, push into the server, print the log-probs as JSON")
    run.add_argument("--url", required=True)
    run.add_argument("--model", required=True, help="the name the server serves the model under")
    run.add_argument("--model-dir", type=Path, required=True, help="the directory the server loaded")
    run.add_argument("--work-dir", type=Path, required=True, help="where each update's weights are written")
    run.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "untie":
        print(untie_word_embeddings(args.source, args.target))
    else:
        print(json.dumps(check(args.url, args.model, args.model_dir, args.work_dir, rounds=args.rounds)))


if __name__ == "__main__":
    main()
