"""``rollwire inspect``: one self-contained HTML file that shows what a batch would train.

Everything is inline (CSS, script, SVG charts, data); the page fetches nothing. The summary and
the group table are plain JSON; each block of rollouts' token data is gzipped and base64-encoded
in its own inert ``<script type="text/plain">`` tag, decoded by the page only when one of its
rollouts is opened, so a 10,000-rollout file opens as fast as a small one.
"""

from __future__ import annotations

import base64
import gzip
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import BuildMode, TrajectoryBuilder
from rollwire.report.charts import bar_chart, histogram
from rollwire.report.payload import rollout_payload
from rollwire.report.summary import DriftEntry, Summary, drift_report, summarize
from rollwire.report.tokens import ROLES, ReportTokenizer, Vocabulary

__all__ = ["Report", "build_report", "render_html", "write_report"]

#: rollouts per gzipped block of token data
CHUNK = 64
_PLACEHOLDER = re.compile(r"@(TITLE|SOURCE|GENERATED|CSS|CHARTS|INDEX|VOCAB|CHUNKS|JS)@")


@dataclass
class Report:
    """A batch of rollouts with its rows, figures and drift, ready to render."""

    groups: list[Group]
    rows: dict[str, list[Row]]
    summary: Summary
    drift: list[DriftEntry]
    vocab: Vocabulary
    title: str = "rollwire inspect"
    source: str = ""


def build_report(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: ReportTokenizer | None = None,
    mode: BuildMode = "merge",
    failure_reward: float | None = None,
    title: str = "rollwire inspect",
    source: str = "",
) -> Report:
    """Build every rollout's rows (as the trainers would get them) and the report's figures."""
    groups = group_rollouts(batch)
    builder = TrajectoryBuilder(mode, tokenizer=tokenizer)
    rows: dict[str, list[Row]] = {}
    for group in groups:
        for r in group.rollouts:
            rows[r.rollout_id] = builder.build(r)
    return Report(
        groups=groups,
        rows=rows,
        summary=summarize(groups, rows, failure_reward=failure_reward),
        drift=drift_report(groups, rows),
        vocab=Vocabulary(tokenizer),
        title=title,
        source=source,
    )


def _index(report: Report) -> dict[str, Any]:
    """The small part of the data: figures, groups and one line per rollout."""
    s = report.summary
    groups_out = []
    n = 0
    for group, gs in zip(report.groups, s.group_summaries):
        items = []
        for r, adv in zip(group.rollouts, gs.advantages):
            rows = report.rows.get(r.rollout_id, [])
            items.append(
                {
                    "n": n,
                    "id": r.rollout_id,
                    "st": r.status,
                    "rw": r.reward,
                    "adv": adv,
                    "calls": len(r.calls),
                    "rows": len(rows),
                    "forks": [row.fork.kind for row in rows if row.fork is not None],
                    "trained": int(sum(int(row.loss_mask.sum()) for row in rows)),
                    "off": sum(c.off_policy for c in r.calls),
                    "failed_calls": sum(c.status != "ok" for c in r.calls),
                    "ex": any(c.routed_experts is not None for c in r.calls),
                }
            )
            n += 1
        groups_out.append(
            {
                "id": group.group_id,
                "task": group.task_id,
                "mean": gs.reward_mean if gs.reward_mean == gs.reward_mean else None,
                "std": gs.reward_std,
                "rollouts": items,
            }
        )
    return {
        "title": report.title,
        "source": report.source,
        "summary": s.as_dict(),
        "drift": [asdict(d) for d in report.drift],
        "groups": groups_out,
        "roles": ROLES,
        "chunk": CHUNK,
        "tokenizer": report.vocab.tokenizer is not None,
    }


def _chunks(report: Report) -> list[str]:
    """Token data of every rollout, ``CHUNK`` rollouts per gzipped, base64-encoded block."""
    payloads = [
        rollout_payload(r, report.rows.get(r.rollout_id, []), report.vocab)
        for g in report.groups
        for r in g.rollouts
    ]
    out = []
    for i in range(0, len(payloads), CHUNK):
        raw = orjson.dumps(payloads[i : i + CHUNK], option=orjson.OPT_SERIALIZE_NUMPY)
        out.append(base64.b64encode(gzip.compress(raw, compresslevel=5)).decode("ascii"))
    return out


def _charts(s: Summary) -> str:
    status_order = ["completed", "failed", "timeout", "cancelled", "running"]
    statuses = {k: float(s.statuses[k]) for k in status_order if k in s.statuses}
    return "".join(
        [
            histogram("reward", s.rewards),
            histogram("calls per rollout", [float(x) for x in s.turns_per_rollout]),
            histogram("rows per rollout", [float(x) for x in s.rows_per_rollout]),
            bar_chart("forks by class", {k: float(v) for k, v in sorted(s.forks.items())}),
            bar_chart("rollouts by status", statuses),
        ]
    )


def _json_script(data: Any) -> str:
    # "</" would end the script element early; JSON allows "<\/" for it.
    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode().replace("</", "<\\/")


def _asset(name: str) -> str:
    return resources.files("rollwire.report").joinpath("assets").joinpath(name).read_text("utf-8")


def render_html(report: Report) -> str:
    """The report as one HTML document (self-contained: nothing is fetched)."""
    index = _index(report)
    chunks = _chunks(report)
    # Decoding ran over every token by now, so the vocabulary holds every id the page shows.
    vocab = {str(k): v for k, v in report.vocab.pieces.items()}
    blocks = "\n".join(
        f'<script type="text/plain" id="rw-chunk-{i}">{c}</script>' for i, c in enumerate(chunks)
    )
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    values = {
        "TITLE": escape(report.title),
        "SOURCE": escape(report.source or "(in memory)"),
        "GENERATED": generated,
        "CSS": _asset("report.css"),
        "CHARTS": _charts(report.summary),
        "INDEX": _json_script(index),
        "VOCAB": _json_script(vocab),
        "CHUNKS": blocks,
        "JS": _asset("report.js"),
    }
    # One pass over the template only: inserted data is never scanned for placeholders.
    page = _PLACEHOLDER.sub(lambda m: values[m.group(1)], _asset("report.html"))
    return page


def write_report(
    path: str | Path,
    batch: Iterable[Group | Rollout] | Report,
    **options: Any,
) -> Path:
    """Render ``batch`` (or a built :class:`Report`) to ``path``; returns the path."""
    report = batch if isinstance(batch, Report) else build_report(batch, **options)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report), encoding="utf-8")
    return path


def rollouts_in(report: Report) -> Sequence[Rollout]:
    """Every rollout of the report, in page order."""
    return [r for g in report.groups for r in g.rollouts]


def read_report_data(page: str) -> tuple[dict[str, Any], dict[str, str], list[dict[str, Any]]]:
    """The data embedded in a rendered report: index, vocabulary, and every rollout's payload.

    The inverse of what :func:`render_html` embeds; for tests and tools that check a report.
    """

    def script(element_id: str) -> str:
        m = re.search(rf'<script type="[^"]+" id="{element_id}">(.*?)</script>', page, re.DOTALL)
        if m is None:
            raise ValueError(f"not a rollwire report: no <script id={element_id!r}>")
        return m.group(1)

    index = orjson.loads(script("rw-index").replace("<\\/", "</"))
    vocab = orjson.loads(script("rw-vocab").replace("<\\/", "</"))
    payloads: list[dict[str, Any]] = []
    i = 0
    while f'id="rw-chunk-{i}"' in page:
        payloads.extend(orjson.loads(gzip.decompress(base64.b64decode(script(f"rw-chunk-{i}")))))
        i += 1
    return index, vocab, payloads
