"""The embedded engine: a tiny real language model with vLLM- and SGLang-compatible HTTP APIs, on CPU.

Random weights, no downloads: for wiring agents to trainers, tests and CI, not for quality.
"""

from __future__ import annotations

from .config import EngineConfig, FaultConfig
from .model import ModelConfig, TinyModel
from .parsing import parse_assistant_text
from .sampling import SamplingParams
from .server import EmbeddedEngine, create_app, serve_in_thread
from .tokenizer import EngineTokenizer, render_chat, tokenizer_dir

__all__ = [
    "EmbeddedEngine",
    "EngineConfig",
    "EngineTokenizer",
    "FaultConfig",
    "ModelConfig",
    "SamplingParams",
    "TinyModel",
    "create_app",
    "parse_assistant_text",
    "render_chat",
    "serve_in_thread",
    "tokenizer_dir",
]
