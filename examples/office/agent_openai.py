"""The office agent, written with the plain OpenAI client: a tools loop over calendar and email.

Two rollwire lines: ``app = RolloutApp(...)`` and ``openai_client(payload)``. The same function
serves production (a task row without ``_rollwire``) and RL rollouts; it returns the reward of
the resulting state (see :func:`office.score_office`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import rollwire
from rollwire.agent.context import rollout_create_kwargs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from office import SYSTEM_PROMPT, TOOLS, Office, score_office, task_prompt

__all__ = ["app", "assist"]

#: Model calls per task at most.
MAX_TURNS = 8

app = rollwire.RolloutApp(failure_reward=0.0)


@app.rollout_entrypoint
def assist(payload: dict[str, Any]) -> dict[str, Any]:
    """Do one office task; returns ``{"reward", "metrics"}``."""
    office = Office(payload)
    client = rollwire.openai_client(payload, max_retries=2)
    # the session's model and sampling in a rollout; production's settings otherwise
    create = rollout_create_kwargs(payload, model=os.environ.get("OFFICE_MODEL", "gpt-4o-mini"))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task_prompt(payload)},
    ]
    turns = 0
    try:
        while turns < MAX_TURNS:
            turns += 1
            resp = client.chat.completions.create(messages=messages, tools=TOOLS, **create)  # type: ignore[arg-type]
            msg = resp.choices[0].message
            calls = [tc for tc in msg.tool_calls or [] if tc.type == "function"]
            assistant: dict[str, Any] = {"role": "assistant", "content": msg.content}
            if calls:
                assistant["tool_calls"] = [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                    }
                    for tc in calls
                ]
            messages.append(assistant)
            if not calls:
                break
            for tc in calls:
                result = office.call(tc.function.name, tc.function.arguments)
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    finally:
        client.close()
    score = score_office(office)
    return {"reward": score.reward, "metrics": {**score.metrics, "turns": float(turns)}}


if __name__ == "__main__":
    app.run()
