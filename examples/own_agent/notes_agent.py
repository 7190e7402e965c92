"""A user's own multi-turn agent, written outside rollwire's package, that ``rollwire train``
trains as it is (``examples/own_agent/README.md``).

Each episode: the agent drafts a note (main turn), asks a side model call to label the draft
(another conversation: a router-style side call mid-rollout), then finishes the note continuing
its main conversation. It asks for its own ``max_tokens`` (24) and scores itself: reward 1 when
the final note opens with the task's keyword (in its first five characters). The plain OpenAI client, pointed at the rollout's
session by rollwire's helpers: the only change a production agent needs.
"""

from __future__ import annotations

from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client, rollout_create_kwargs

app = RolloutApp(failure_reward=0.0)

#: this agent's own sampling: the run keeps it
MAX_TOKENS = 24


@app.rollout_entrypoint
def write_note(payload: dict[str, Any]) -> dict[str, Any]:
    """One episode: ``{"reward", "metrics": {"draft_tokens", "final_tokens", "label_tokens"}}``."""
    client = openai_client(payload, max_retries=2)
    create = rollout_create_kwargs(payload, model="notes", max_tokens=MAX_TOKENS)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Write a note about {payload['topic']}."}
    ]
    try:
        draft = client.chat.completions.create(messages=messages, **create)  # type: ignore[arg-type]
        draft_text = draft.choices[0].message.content or ""
        label = client.chat.completions.create(  # the side call: its own conversation
            messages=[{"role": "user", "content": f"Label this note: {draft_text}"}],
            **create,  # type: ignore[arg-type]
        )
        messages += [
            {"role": "assistant", "content": draft_text},
            {"role": "user", "content": "Now finish it."},
        ]
        final = client.chat.completions.create(messages=messages, **create)  # type: ignore[arg-type]
    finally:
        client.close()
    text = final.choices[0].message.content or ""
    lengths = {
        "draft_tokens": float(draft.usage.completion_tokens if draft.usage else 0),
        "label_tokens": float(label.usage.completion_tokens if label.usage else 0),
        "final_tokens": float(final.usage.completion_tokens if final.usage else 0),
    }
    return {"reward": float(str(payload["keyword"]) in text[:5]), "metrics": lengths}
