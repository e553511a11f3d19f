"""A byte-level tokenizer built in code, so the reference model needs no download.

Every UTF-8 byte is one token (a byte-level BPE with no merges, GPT-2's byte alphabet), so any text an agent
sends encodes losslessly and the vocabulary stays at 256 + a few special tokens, which keeps the embedding
and output layers, and so the model, tiny. The chat template is ChatML (`<|im_start|>role\\n...<|im_end|>`),
the format most open chat models use, so agents' multi-turn prompts look as they do on a real model.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"  # ends a plain completion; also the padding token
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # ends an assistant turn

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The reference tokenizer: byte ids 0-255, then the special tokens; the same on every machine."""
    if set(pre_tokenizers.ByteLevel.alphabet()) != set(_BYTE_OF_SYMBOL):
        raise RuntimeError("the tokenizers library changed its byte-level alphabet")
    vocab = dict(_BYTE_OF_SYMBOL)  # byte b is token id b
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def stop_token_ids(tokenizer: PreTrainedTokenizerFast) -> frozenset[int]:
    """Tokens that end generation: the end of text and the end of a chat turn (kept in the output ids)."""
    return frozenset(_token_id(tokenizer, token) for token in (END_OF_TEXT, IM_END))


def token_bytes(tokenizer: PreTrainedTokenizerFast, token_id: int) -> bytes:
    """The bytes one token stands for (a special token: its UTF-8 text), as OpenAI's `bytes` field wants."""
    if 0 <= token_id < 256:
        return bytes([token_id])
    return str(tokenizer.convert_ids_to_tokens(token_id)).encode()


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise TypeError(f"token {token!r} maps to {token_id!r}, not to one id")
    return token_id


def _gpt2_symbol_bytes() -> dict[str, int]:
    """GPT-2's byte-level table, inverted: printable bytes stand for themselves, the rest for chr(256 + i)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table: dict[str, int] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + shifted)] = byte
            shifted += 1
    return table


_BYTE_OF_SYMBOL = _gpt2_symbol_bytes()
