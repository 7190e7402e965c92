"""``rollwire inspect`` at scale: a 10,000-rollout report built, then opened in headless Chromium.

The rollouts are real: the Wordle demo (embedded engine, gateway, agent) runs 64 of them, which
are copied (new ids and groups) up to ``--rollouts``. Measured: report build time and file size;
in Debian's headless chromium (driven by Playwright, loopback only), the time from navigation to
the page's script having drawn the summary and the first page of groups, and the time to open
one rollout's token view. Target: the report opens in < 5 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rollwire.data.protocol import Group, Rollout


def demo_rollouts(n_tasks: int) -> list[Group]:
    from rollwire.cli.demo import run_demo

    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo(tasks=n_tasks, group_size=4, out=tmp, progress=False, exports=False)
    return result.groups


def scaled(groups: list[Group], n: int) -> list[Rollout]:
    """``n`` rollouts: copies of the demo's, each with its own id and group."""
    base = [r for g in groups for r in g.rollouts]
    out: list[Rollout] = []
    copy = 0
    while len(out) < n:
        for r in base:
            if len(out) == n:
                break
            c = r.model_copy()
            c.rollout_id = f"{r.rollout_id}-{copy}"
            c.group_id = f"{r.group_id}-{copy}"
            out.append(c)
        copy += 1
    return out


def open_times(path: Path, runs: int) -> tuple[list[float], list[float], int]:
    from rollwire.testing.browser import chromium_session, serve_directory

    opened, rollout = [], []
    refused = 0
    with tempfile.TemporaryDirectory() as profiles, serve_directory(path.parent) as base:
        for i in range(runs):
            with chromium_session(Path(profiles) / str(i)) as s:
                page = s.page
                t0 = time.perf_counter()
                page.goto(f"{base}/{path.name}", timeout=120_000)
                page.wait_for_selector("body[data-ready='1']", timeout=120_000)
                opened.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                page.locator("button.chip").nth(5).click()
                page.wait_for_selector("body[data-rollout]", timeout=60_000)
                page.locator(".tokens .tok.P").first.wait_for()
                rollout.append(time.perf_counter() - t1)
                refused += len(s.refused)
    return opened, rollout, refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--demo-tasks", type=int, default=16, help="demo tasks (x4 rollouts) to copy")
    ap.add_argument("--runs", type=int, default=3, help="fresh browser profiles to open it in")
    args = ap.parse_args()

    from rollwire.engine.tokenizer import EngineTokenizer
    from rollwire.report import build_report, write_report

    t = time.perf_counter()
    groups = demo_rollouts(args.demo_tasks)
    print(
        f"demo: {sum(len(g.rollouts) for g in groups)} rollouts in {time.perf_counter() - t:.1f} s"
    )
    rollouts = scaled(groups, args.rollouts)
    tokens = sum(
        int(c.prompt_ids.shape[0] + c.completion_ids.shape[0])
        for r in rollouts
        for c in r.calls[-1:]
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.html"
        t = time.perf_counter()
        report = build_report(rollouts, tokenizer=EngineTokenizer(), source="benchmark")
        write_report(path, report)
        build_s = time.perf_counter() - t
        size = path.stat().st_size
        opened, rollout, refused = open_times(path, args.runs)
    print(
        f"report: {len(rollouts)} rollouts, {report.summary.rows} rows, ~{tokens / 1e6:.1f} M tokens"
    )
    print(f"build + write: {build_s:.1f} s, file {size / 2**20:.1f} MiB")
    print(
        f"open in headless chromium (navigation -> summary and groups drawn): median "
        f"{statistics.median(opened):.2f} s over {len(opened)} fresh profiles "
        f"({', '.join(f'{x:.2f}' for x in opened)}); target < 5 s: "
        f"{'met' if statistics.median(opened) < 5 else 'NOT met'}"
    )
    print(f"open one rollout's token view: median {statistics.median(rollout):.2f} s")
    print(f"requests refused (off 127.0.0.1): {refused}")


if __name__ == "__main__":
    main()
