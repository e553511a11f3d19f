"""Packed training rows on CPU: verl's own input packing, a transformers model with SDPA, unpacked logits.

The verl backend trains with remove-padding on SDPA (the trainer image has no flash-attn): verl's FSDP engine
(`FSDPEngineWithLMHead.prepare_model_inputs`) concatenates a micro-batch's rows into one sequence and passes
the position ids with no attention mask; transformers then masks attention per row from where the position
ids restart. If that masking failed, every row would attend to the rows packed before it and train on wrong
log-probs without any error. `max_logit_gap` measures it: verl's packing of `lengths` rows through a small
random Llama, against each row run alone.

Runs in the dev venv (the tests) and, as `python -m asyncrl.testing.verl_packing`, in the vLLM venv with the
trainer image's pins (transformers 5.9, torch 2.11), where it prints the gap as JSON.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Sequence
from typing import Any

DEFAULT_LENGTHS = (7, 31, 5, 64, 12)


def tiny_llama(*, attention: str = "sdpa", seed: int = 0) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(  # type: ignore[call-arg]  # the stubs lack the kwargs PretrainedConfig takes
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as Qwen and Llama 3 have
        max_position_embeddings=1024,
        attn_implementation=attention,
    )
    model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    return model.eval()


def verl_packed_inputs(rows: Sequence[Any]) -> dict[str, Any]:
    """The model inputs verl's FSDP engine builds for `rows` (1-D token tensors) with use_remove_padding."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    input_ids = torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)
    positions = torch.nested.as_nested_tensor([torch.arange(len(row)) for row in rows], layout=torch.jagged)
    micro_batch = TensorDict({"input_ids": input_ids, "position_ids": positions}, batch_size=[len(rows)])
    tu.assign_non_tensor(micro_batch, use_remove_padding=True, temperature=1.0)
    # The engine's own state that prepare_model_inputs reads: no Ulysses, no bucket padding (the defaults).
    engine = types.SimpleNamespace(
        use_ulysses_sp=False, pad_to_length=False, _get_packed_pad_size=lambda _length: 0
    )
    model_inputs, _ = FSDPEngineWithLMHead.prepare_model_inputs(engine, micro_batch)  # type: ignore[arg-type]
    return dict(model_inputs)


def max_logit_gap(lengths: Sequence[int] = DEFAULT_LENGTHS, *, attention: str = "sdpa") -> float:
    """Largest |logit| difference between verl's packed forward and each row's own forward."""
    import torch

    model = tiny_llama(attention=attention)
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, model.config.vocab_size, (n,), generator=generator) for n in lengths]
    inputs = verl_packed_inputs(rows)
    assert inputs["attention_mask"] is None
    assert inputs["input_ids"].shape == (1, sum(lengths))
    with torch.no_grad():
        packed = model(**inputs, use_cache=False).logits[0]  # verl passes use_cache=False
        alone = torch.cat([model(input_ids=row[None], use_cache=False).logits[0] for row in rows])
    return float((packed - alone).abs().max())


def main() -> int:
    import torch
    import transformers
    import verl

    gap = max_logit_gap()
    print(
        json.dumps(
            {
                "max_logit_gap": gap,
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "verl": verl.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
