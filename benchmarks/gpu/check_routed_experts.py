"""Check routing captured through the gateway against transformers' router choices.

    python benchmarks/gpu/check_routed_experts.py --backend http://127.0.0.1:8000 --model DIR

``DIR`` is the Mixtral folder the backend serves (``rollwire engine save-model DIR --format hf``).
A gateway in this process runs one passthrough and one tokens-mode session (3 scripted-free
turns each, greedy) against the backend; for every captured call the routing of
``prompt + completion[:-1]`` (``[tokens, layers, top_k]``, what vLLM's
``--enable-return-routed-experts`` returns) must name, per token and layer, the same set of
experts as transformers' router on the same ids. Needs torch + transformers (the vLLM venv).
Exit status 0 when every call matches.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import openai
import torch
from transformers import AutoModelForCausalLM

from rollwire.gateway import serve_in_thread


def router_choices(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """``[len(ids), layers, top_k]`` experts transformers' Mixtral router picks for ``ids``."""
    chosen: dict[int, torch.Tensor] = {}
    hooks = []
    top_k = model.config.num_experts_per_tok
    for i, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate if hasattr(layer, "mlp") else layer.block_sparse_moe.gate

        def keep(_m: object, _inp: object, out: object, i: int = i) -> None:
            if isinstance(out, tuple):  # transformers 5: (logits, weights, indices)
                chosen[i] = next(t for t in out if not t.is_floating_point())
            else:
                chosen[i] = torch.topk(out, top_k, dim=-1).indices  # type: ignore[call-overload]

        hooks.append(gate.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return np.stack([chosen[i].reshape(len(ids), -1).numpy() for i in range(len(chosen))], axis=1)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--backend", required=True, help="URL of the inference server (vLLM kind)")
    ap.add_argument("--model", required=True, help="the Mixtral folder it serves")
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    failures = 0
    checked = 0
    t0 = time.monotonic()
    with serve_in_thread(backends=[(args.backend, "vllm")]) as gw, gw.client() as c:
        for capture in ("passthrough", "tokens"):
            h = c.create_session(capture=capture, sampling={"temperature": 0.0, "max_tokens": 24})
            oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
            messages: list[dict[str, str]] = []
            for turn in range(args.turns):
                messages.append({"role": "user", "content": f"Turn {turn}: tell me about the sea."})
                r = oai.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
                messages.append(
                    {"role": "assistant", "content": r.choices[0].message.content or ""}
                )
            for call in c.calls(h.session_id):
                checked += 1
                if call.routed_experts is None:
                    print(f"{capture} call {call.index}: no routed experts captured ({call.flags})")
                    failures += 1
                    continue
                ids = call.full_tokens().tolist()[:-1]
                want = np.sort(router_choices(model, ids), axis=-1)
                got = np.sort(np.asarray(call.routed_experts), axis=-1)
                if got.shape != want.shape:
                    print(f"{capture} call {call.index}: shape {got.shape}, expected {want.shape}")
                    failures += 1
                    continue
                wrong = int((got != want).any(axis=-1).sum())
                print(f"{capture} call {call.index}: {got.shape[0]} tokens x {got.shape[1]} layers, "
                      f"{wrong} (token, layer) routings differ")  # fmt: skip
                failures += wrong > 0
    print(f"{checked} calls checked in {time.monotonic() - t0:.1f} s; {failures} failed")
    return 0 if failures == 0 and checked else 1


if __name__ == "__main__":
    sys.exit(main())
