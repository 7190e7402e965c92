"""The office environment: calendars and an outbox, two tools, and an exact-state reward.

Task: "email the organiser of USER's next meeting, subject 'Running late: TITLE'". The task row
carries the whole world (``now``, ``user``, ``calendar``), so a rollout is reproducible and the
reward needs nothing but the final state. Pure Python, no I/O.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SYSTEM_PROMPT",
    "TOOLS",
    "Office",
    "OfficeScore",
    "expected_email",
    "make_tasks",
    "next_meeting",
    "score_office",
    "task_prompt",
]

SYSTEM_PROMPT = (
    "You are an office assistant with access to the company calendar and email. Use the tools to "
    "look things up and to act; do exactly what the user asks, no more."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_events",
            "description": "List the calendar events a user attends (past and future), as JSON.",
            "parameters": {
                "type": "object",
                "properties": {"user": {"type": "string", "description": "user name, e.g. alice"}},
                "required": ["user"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send an email.",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "string", "description": "recipient email address"},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                },
                "required": ["to", "subject", "body"],
            },
        },
    },
]

_USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
_TITLES = (
    "Budget review",
    "Design sync",
    "1:1",
    "Hiring panel",
    "Roadmap",
    "Incident retro",
    "Offsite plan",
)


def _email(user: str) -> str:
    return f"{user}@example.com"


def task_prompt(task: dict[str, Any]) -> str:
    """The user's request for a task."""
    return (
        f"It is now {task['now']}. I am {task['user']}. I will be late for my next meeting: email its "
        f"organiser with the subject 'Running late: <meeting title>' and a one-line apology."
    )


def make_tasks(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` tasks, each a small world: a user, a current time and a calendar of 6-9 events."""
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        user = rng.choice(_USERS)
        day = 3 + rng.randrange(3)
        now_hour = 9 + rng.randrange(6)
        events: list[dict[str, Any]] = []
        for j in range(rng.randrange(6, 10)):
            hour = 8 + rng.randrange(10)
            organizer = rng.choice([u for u in _USERS if u != user])
            attendees = sorted({organizer, *rng.sample(_USERS, 2)} | ({user} if j < 4 else set()))
            events.append(
                {
                    "id": f"ev{j}",
                    "title": rng.choice(_TITLES),
                    "start": f"2025-03-{day + rng.choice((0, 0, 1)):02d}T{hour:02d}:{rng.choice((0, 30)):02d}",
                    "organizer": _email(organizer),
                    "attendees": [_email(a) for a in attendees],
                }
            )
        task = {
            "task_id": f"office-{seed}-{i}",
            "user": user,
            "now": f"2025-03-{day:02d}T{now_hour:02d}:00",
            "calendar": events,
        }
        if next_meeting(task) is None:  # keep only solvable worlds: add one future meeting
            events.append(
                {
                    "id": "ev-next",
                    "title": rng.choice(_TITLES),
                    "start": f"2025-03-{day + 1:02d}T10:00",
                    "organizer": _email(rng.choice([u for u in _USERS if u != user])),
                    "attendees": [_email(user)],
                }
            )
        tasks.append(task)
    return tasks


def next_meeting(task: dict[str, Any]) -> dict[str, Any] | None:
    """The first event the task's user attends that starts after ``now`` (None if there is none)."""
    me = _email(task["user"])
    upcoming = [e for e in task["calendar"] if me in e["attendees"] and e["start"] > task["now"]]
    return min(upcoming, key=lambda e: (e["start"], e["id"])) if upcoming else None


def expected_email(task: dict[str, Any]) -> tuple[str, str]:
    """``(to, subject)`` of the one email that solves the task."""
    meeting = next_meeting(task)
    if meeting is None:
        raise ValueError(f"task {task.get('task_id')} has no upcoming meeting for {task['user']}")
    return meeting["organizer"], f"Running late: {meeting['title']}"


@dataclass
class Office:
    """The world of one task: calendars to read and an outbox the agent writes to."""

    task: dict[str, Any]
    outbox: list[dict[str, str]] = field(default_factory=list)
    tool_errors: int = 0

    def list_events(self, user: str) -> str:
        """Tool: the events ``user`` attends, as JSON."""
        email = user if "@" in str(user) else _email(str(user).strip().lower())
        events = [
            {k: e[k] for k in ("id", "title", "start", "organizer")}
            for e in self.task["calendar"]
            if email in e["attendees"]
        ]
        return json.dumps({"user": email, "events": events})

    def send_email(self, to: str, subject: str, body: str) -> str:
        """Tool: queue an email in the outbox."""
        if not all(isinstance(v, str) for v in (to, subject, body)) or "@" not in to:
            self.tool_errors += 1
            return "Error: send_email needs 'to' (an email address), 'subject' and 'body' strings."
        self.outbox.append({"to": to.strip(), "subject": subject.strip(), "body": body.strip()})
        return f"Email sent to {to.strip()}."

    def call(self, name: str, arguments: str | None) -> str:
        """Run a tool call from the model (``arguments`` is its JSON text)."""
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            self.tool_errors += 1
            return "Error: tool arguments must be a JSON object."
        try:
            if name == "list_events":
                return self.list_events(**args)
            if name == "send_email":
                return self.send_email(**args)
        except TypeError as exc:
            self.tool_errors += 1
            return f"Error: bad arguments for {name}: {exc}"
        self.tool_errors += 1
        return f"Error: unknown tool {name!r}; the tools are list_events and send_email."


@dataclass(frozen=True)
class OfficeScore:
    """Reward 1.0 only for the exact resulting state: one email, right recipient, right subject."""

    reward: float
    metrics: dict[str, float]


def score_office(office: Office) -> OfficeScore:
    """Check the outbox against the task exactly."""
    to, subject = expected_email(office.task)
    sent = office.outbox
    right_to = any(m["to"] == to for m in sent)
    right_subject = any(m["to"] == to and m["subject"] == subject for m in sent)
    exact = (
        len(sent) == 1
        and sent[0]["to"] == to
        and sent[0]["subject"] == subject
        and bool(sent[0]["body"])
    )
    return OfficeScore(
        reward=1.0 if exact else 0.0,
        metrics={
            "emails_sent": float(len(sent)),
            "right_recipient": float(right_to),
            "right_subject": float(right_subject),
            "tool_errors": float(office.tool_errors),
        },
    )
