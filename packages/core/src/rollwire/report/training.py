"""The training section of ``rollwire inspect``: a ``rollwire train`` run folder as one HTML page.

It reads what the run wrote — ``steps.jsonl`` (one record per optimizer step: ``step``,
``reward_mean``, ``reward_std``, ``pass_rate``, ``rollout_s``, ``train_s``, ``sync_s``,
``tokens_per_s``, ``sampled_tokens``/``trained_tokens``, the ``trainer``'s statistics (``trl`` in
runs before the loop was shared), ``eval`` when the step was evaluated) and ``summary.json``
or ``baseline.json`` — and draws the reward curve, the pass rate per step beside held-out pass@1
with its 95 % intervals, and where each step's time went. Inline SVG, nothing fetched.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path
from typing import Any

import orjson

from rollwire.report.charts import line_chart, stacked_bars

__all__ = ["is_training_run", "training_html", "write_training_report"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} table{border-collapse:collapse}
td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right} td:first-child,th:first-child{text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:18px} svg.line{width:520px;height:auto}
.axis{stroke:#888} .lbl,.key{font-size:10px;fill:#555} .ttl{font-size:12px;fill:#222}
polyline.s0,line.s0{stroke:#2a6fdb;stroke-width:2} circle.s0,rect.s0,text.s0{fill:#2a6fdb}
polyline.s1,line.s1{stroke:#d9622b;stroke-width:2} circle.s1,rect.s1,text.s1{fill:#d9622b}
rect.s2,text.s2{fill:#5a9e4b} line.ci{stroke-width:1.5} .muted{color:#777}
"""


def is_training_run(path: Path) -> bool:
    """Whether ``path`` is a folder ``rollwire train`` wrote (it has ``steps.jsonl``)."""
    return path.is_dir() and (path / "steps.jsonl").is_file()


def _read(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    steps = [
        orjson.loads(line)
        for line in (run / "steps.jsonl").read_bytes().splitlines()
        if line.strip()
    ]
    summary: dict[str, Any] = {}
    if (run / "summary.json").is_file():
        summary = orjson.loads((run / "summary.json").read_bytes())
    elif (run / "baseline.json").is_file():
        summary = {"baseline": orjson.loads((run / "baseline.json").read_bytes())}
    return steps, summary


def _evals(steps: list[dict[str, Any]], summary: dict[str, Any]) -> list[dict[str, Any]]:
    found = {int(e["step"]): e for e in summary.get("evals", [])}
    for key in ("baseline", "final"):
        if key in summary:
            found[int(summary[key]["step"])] = summary[key]
    for s in steps:
        if s.get("eval"):
            found[int(s["eval"]["step"])] = s["eval"]
    return [found[k] for k in sorted(found)]


def _interval(e: dict[str, Any]) -> str:
    return f"{e['pass_at_1']:.3f} [{e['pass_at_1_low']:.3f}, {e['pass_at_1_high']:.3f}]"


def _summary_table(
    steps: list[dict[str, Any]], evals: list[dict[str, Any]], summary: dict[str, Any]
) -> str:
    rows: list[tuple[str, str]] = []
    if evals:
        rows.append(("held-out pass@1 before step 1", _interval(evals[0])))
        rows.append((f"held-out pass@1 after step {evals[-1]['step']}", _interval(evals[-1])))
        rows.append(("attempts per evaluation", str(evals[-1].get("attempts", ""))))
    rows.append(("steps", str(len(steps))))
    if summary.get("warmup_steps"):
        rows.append(("supervised warm-up before RL", f"{summary['warmup_steps']} steps"))
    if steps:
        total = sum(s["rollout_s"] + s["train_s"] + s["sync_s"] for s in steps)
        rows.append(("seconds per step (mean)", f"{total / len(steps):.1f}"))
    if summary.get("wall_s"):
        rows.append(("wall time", f"{summary['wall_s']:.0f} s"))
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _tool_cell(s: dict[str, Any]) -> str:
    """Tool calls parsed of the calls that offered tools; flagged when none (or not all) parsed."""
    offered = s.get("tool_offered_calls", 0)
    if not offered:
        return "—"
    cell = f"{s.get('tool_calls_parsed', 0)} / {offered}"
    unparsed = s.get("tool_call_text_unparsed", 0)
    if unparsed:
        cell += f", {unparsed} unparsed"
    flags = s.get("flags") or []
    if "no_tool_calls_parsed" in flags:
        return f'<b class="flag">⚠ {cell}: no tool call parsed</b>'
    return cell


def _step_table(steps: list[dict[str, Any]]) -> str:
    head = (
        "<tr><th>step</th><th>reward</th><th>pass</th><th>loss</th><th>KL behaviour</th>"
        "<th>IS ratio</th><th>tokens trained/sampled</th><th>tok/s</th><th>rollout s</th><th>train s</th><th>sync s</th>"
        "<th>tool calls parsed / calls offering tools</th><th>held-out pass@1</th></tr>"
    )
    rows = []
    for s in steps:
        t = s.get("trainer", s.get("trl", {}))
        ev = _interval(s["eval"]) if s.get("eval") else ""
        tokens = f"{s.get('trained_tokens', '')}/{s.get('sampled_tokens', '')}"
        rows.append(
            f"<tr><td>{s['step']}</td><td>{s['reward_mean']:.3f} ± {s['reward_std']:.3f}</td>"
            f"<td>{s['pass_rate']:.2f}</td><td>{t.get('loss', 0.0):+.4f}</td>"
            f"<td>{t.get('kl_behaviour', 0.0):.2e}</td>"
            f"<td>{t.get('is_ratio_min', 1.0):.2f}..{t.get('is_ratio_max', 1.0):.2f}</td>"
            f"<td>{tokens}</td><td>{s['tokens_per_s']:.0f}</td><td>{s['rollout_s']:.1f}</td><td>{s['train_s']:.1f}</td>"
            f"<td>{s['sync_s']:.2f}</td><td>{_tool_cell(s)}</td><td>{ev}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def training_html(run: Path) -> str:
    """The page of the run folder ``run`` (see the module docstring)."""
    steps, summary = _read(run)
    evals = _evals(steps, summary)
    xs = [float(s["step"]) for s in steps]
    reward = line_chart(
        "reward per step (mean of the step's rollouts)",
        {"reward": [(x, s["reward_mean"]) for x, s in zip(xs, steps)]},
    )
    passing = line_chart(
        "pass rate: training batch and held-out (95 % intervals)",
        {
            "training batch": [(x, s["pass_rate"]) for x, s in zip(xs, steps)],
            "held-out pass@1": [(float(e["step"]), e["pass_at_1"]) for e in evals],
        },
        low_high={
            "held-out pass@1": [
                (float(e["step"]), e["pass_at_1_low"], e["pass_at_1_high"]) for e in evals
            ]
        },
        y_range=(0.0, 1.0),
    )
    timing = stacked_bars(
        "seconds per step",
        xs,
        {k: [s[f"{k}_s"] for s in steps] for k in ("rollout", "train", "sync")},
    )
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>rollwire train: "
        f"{escape(run.name)}</title><style>{_CSS}</style></head><body>"
        f"<h1>rollwire train — {escape(str(run))}</h1>"
        f"<p class='muted'>generated {generated}</p>"
        f"{_summary_table(steps, evals, summary)}"
        f"<h2>Learning</h2><div class='charts'>{passing}{reward}</div>"
        f"<h2>Time</h2><div class='charts'>{timing}</div>"
        f"<h2>Steps</h2>{_step_table(steps)}</body></html>"
    )


def write_training_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Write :func:`training_html` of ``run`` to ``out`` (default ``run/report.html``)."""
    folder = Path(run)
    if not is_training_run(folder):
        raise ValueError(f"{folder} is not a rollwire train run folder (no steps.jsonl in it)")
    path = Path(out) if out is not None else folder / "report.html"
    path.write_text(training_html(folder), encoding="utf-8")
    return path
