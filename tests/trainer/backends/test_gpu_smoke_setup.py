"""What benchmarks/gpu_smoke.py prepares before it needs the GPU: the local model and the run, checked here.

The smoke run itself needs an NVIDIA GPU and vLLM (it is not part of the test suite); these tests make sure
that, on a GPU machine, it does not fail on its own inputs: the model directory loads the way verl and vLLM
load a Hugging Face model (AutoConfig, AutoTokenizer with its chat template, AutoModelForCausalLM), and the
manifest is a valid run whose verl config verl accepts.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from asyncrl.api import load_run
from asyncrl.trainer.backends.verl.config import compose_verl_config, verl_settings
from tests.support.benchmark_scripts import load_benchmark


def smoke_module() -> ModuleType:
    return load_benchmark("gpu_smoke")


def test_the_local_model_loads_as_a_hugging_face_chat_model(tmp_path: Path) -> None:
    smoke = smoke_module()
    smoke.make_model(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == "llama"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert config.vocab_size == len(tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in config.eos_token_id  # a chat turn ends generation
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = tokenizer("hello", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_the_smoke_run_is_valid_and_verl_accepts_its_settings(tmp_path: Path) -> None:
    smoke = smoke_module()
    run = load_run(smoke.manifest(tmp_path / "model", steps=3))
    assert run.spec.trainer.backend.value == "Verl"
    assert run.spec.total_steps == 3
    config = compose_verl_config(verl_settings(run, checkpoint_dir=tmp_path / "checkpoints"))
    assert config.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert config.actor_rollout_ref.rollout.enforce_eager is True
    assert config.trainer.n_gpus_per_node == 1
