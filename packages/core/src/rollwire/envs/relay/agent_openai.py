"""The relay agent, with the plain OpenAI client: the planner writes the note, the executor acts
on it. Each call names its role as its ``model`` — all the gateway needs to train one policy per
role (:mod:`rollwire.envs.relay.game`)."""

from __future__ import annotations

from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client, rollout_create_kwargs
from rollwire.envs.relay.game import action_of, executor_prompt, note_of, planner_prompt

__all__ = ["app", "play"]

app = RolloutApp(failure_reward=0.0)


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One relay episode: ``{"reward", "metrics": {"solved", "note_correct",
    "action_follows_note", "note_parsed"}}``."""
    room, secret = str(payload["room"]), int(payload["secret"])
    client = openai_client(payload, max_retries=2)
    create = rollout_create_kwargs(payload, max_tokens=8)

    def ask(role: str, prompt: str) -> str:
        answer = client.chat.completions.create(  # type: ignore[call-overload]
            messages=[{"role": "user", "content": prompt}], **{**create, "model": role}
        )
        return str(answer.choices[0].message.content or "")

    try:
        note = ask("planner", payload.get("prompt") or planner_prompt(room, secret))
        action = action_of(ask("executor", executor_prompt(room, note)))
    finally:
        client.close()
    noted = note_of(note)
    reward = float(action == secret)
    metrics = {"solved": reward, "note_correct": float(noted == secret)}
    metrics["note_parsed"] = float(noted is not None)
    if noted is not None:  # the executor's own measure: does it act on the note it got
        metrics["action_follows_note"] = float(action == noted)
    return {"reward": reward, "metrics": metrics}
