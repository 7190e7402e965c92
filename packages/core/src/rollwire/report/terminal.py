"""The report's row view in a terminal (``rollwire inspect --session ID --gateway URL``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rollwire.data.protocol import Rollout, Row
from rollwire.report.payload import fork_diff
from rollwire.report.tokens import ROLES, Vocabulary, row_roles

__all__ = ["print_rollout", "rollout_renderable"]

_STYLE = {
    "P": "on rgb(37,99,235)",
    "S": "on rgb(124,58,237)",
    "A": "grey70",
    "T": "green",
    "U": "dark_orange",
    "Y": "magenta",
    "M": "grey50",
    "C": "grey62",
}


def _policy_style(role: str, logprob: float) -> str:
    # Brighter background for likelier tokens: the HTML view's intensity, in three steps.
    p = math.exp(logprob)
    base = (37, 99, 235) if role == "P" else (124, 58, 237)
    k = 0.45 if p < 0.2 else 0.7 if p < 0.6 else 1.0
    r, g, b = (int(c * k) for c in base)
    return f"white on rgb({r},{g},{b})"


def _row_text(row: Row, vocab: Vocabulary) -> Text:
    roles = row_roles(row, vocab)
    text = Text()
    last_turn = -2
    for i, tid in enumerate(row.input_ids.tolist()):
        j = i - row.prompt_len
        piece = vocab.pieces.get(tid, f"{tid} ") if vocab.tokenizer is not None else f"{tid} "
        role = roles[i]
        if j == 0:
            text.append(" response ", style="bold white on blue")
        if j >= 0:
            turn = int(row.turn_ids[j])
            if turn >= 0 and turn != last_turn:
                text.append(f" call {turn} ", style="bold white on rgb(42,98,201)")
            last_turn = turn
            if role in ("P", "S"):
                text.append(piece, style=_policy_style(role, float(row.logprobs[j])))
                continue
        text.append(piece, style=_STYLE.get(role, ""))
    return text


def rollout_renderable(rollout: Rollout, rows: Sequence[Row], vocab: Vocabulary) -> Group:
    """A rich renderable of a rollout: its calls, then each row's tokens and forks."""
    calls = Table(title=f"rollout {rollout.rollout_id}: {rollout.status}, reward {rollout.reward}")
    for col in ("call", "status", "finish", "prompt/completion", "flags", "tool calls"):
        calls.add_column(col)
    for c in sorted(rollout.calls, key=lambda c: c.index):
        flags = [*c.flags, *(["off-policy"] if c.off_policy else [])]
        flags += [] if c.trainable else ["not trained"]
        tools = []
        try:
            for tc in c.response["choices"][0]["message"].get("tool_calls") or []:
                fn = tc.get("function") or {}
                tools.append(f"{fn.get('name')}({fn.get('arguments', '')})")
        except (KeyError, IndexError, TypeError, AttributeError):
            pass
        calls.add_row(
            str(c.index),
            c.status if c.error is None else f"{c.status}: {c.error}",
            str(c.finish_reason),
            f"{c.prompt_ids.shape[0]}/{c.completion_ids.shape[0]}",
            ", ".join(flags),
            "; ".join(tools),
        )
    parts: list[object] = [calls]
    legend = Text("roles: ")
    for code, name in ROLES.items():
        legend.append(
            f" {name} ", style=_STYLE[code] if code not in "PS" else f"white {_STYLE[code]}"
        )
        legend.append(" ")
    parts.append(legend)
    if rollout.error:
        parts.append(Text(f"error: {rollout.error}", style="red"))
    for k, row in enumerate(rows):
        if row.fork is not None:
            diff = fork_diff(rows, k, vocab)
            body = Text(
                f"{row.fork.kind} at position {row.fork.position}, "
                f"{row.fork.tokens_lost} trainable tokens lost\n"
            )
            if diff is not None:
                body.append("row ", style="bold")
                body.append(f"{diff.from_row}: …{diff.context}")
                body.append(diff.old, style="on dark_red")
                body.append("\nnew prompt: ", style="bold")
                body.append(f"…{diff.context}")
                body.append(diff.new, style="on dark_green")
            parts.append(Panel(body, title=f"fork before row {k}", border_style="yellow"))
        title = (
            f"row {k}: prompt {row.prompt_len}, response {row.input_ids.shape[0] - row.prompt_len}, "
            f"trained {int(row.loss_mask.sum())}"
        )
        parts.append(Panel(_row_text(row, vocab), title=title))
    return Group(*parts)  # type: ignore[arg-type]


def print_rollout(
    console: Console, rollout: Rollout, rows: Sequence[Row], vocab: Vocabulary
) -> None:
    """Print :func:`rollout_renderable` to ``console``."""
    console.print(rollout_renderable(rollout, rows, vocab))
