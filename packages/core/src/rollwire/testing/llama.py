"""The config of a tiny dense Llama with the embedded engine's vocabulary and special tokens, for
tests and benchmarks against real vLLM and transformers (needs ``transformers``)."""

from __future__ import annotations

from typing import Any

__all__ = ["tiny_llama_config"]


def tiny_llama_config(*, tied: bool = False) -> Any:
    """A ``LlamaConfig``: 2 layers, hidden 128, 4 heads (head_dim 32: vLLM's CPU attention has no
    kernel for 16), the engine tokenizer's vocabulary, eos and pad; ``tied``: the output head is
    the input embedding."""
    from transformers import LlamaConfig

    from rollwire.engine import ModelConfig, TinyModel

    engine = TinyModel(ModelConfig(seed=0))
    tok = engine.tokenizer
    return LlamaConfig(
        vocab_size=engine.config.vocab_size,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
    )
