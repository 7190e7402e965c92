"""The report in Debian's headless chromium: key elements visible, nothing fetched off 127.0.0.1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rollwire.report import write_report
from rollwire.testing.browser import chromium_path, chromium_session, serve_directory
from rollwire.testing.chat_samples import CHAR_TOKENIZER, chat_batch

if chromium_path() is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI must install chromium for the browser tests (see .ci/run)")
    pytest.skip("no chromium installed (apt-get install -y chromium)", allow_module_level=True)


def test_report_in_chromium(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_report(site / "report.html", chat_batch(), tokenizer=CHAR_TOKENIZER, source="demo.jsonl")
    (site / "probe.html").write_text('<img src="http://example.invalid/pixel.png">')
    with serve_directory(site) as base, chromium_session(tmp_path / "profile") as s:
        page = s.page
        # the gate itself: a page that reaches off the machine is caught
        page.goto(f"{base}/probe.html")
        assert s.refused == ["http://example.invalid/pixel.png"]
        s.refused.clear()
        s.requested.clear()
        s.console_errors.clear()
        page.goto(f"{base}/report.html")
        page.wait_for_selector("body[data-ready='1']")
        for selector in ("#summary", "#cards", "#charts svg", "#drift-table", "#group-table"):
            assert page.locator(selector).first.is_visible(), selector
        assert page.locator("#cards .card").count() >= 10
        assert "9" in page.locator("#cards .card").first.inner_text()
        assert page.locator("#drift-table tbody tr").count() == 5
        # open a forked rollout from the group table
        page.locator("button.chip", has_text="g-forks-retokenized").click()
        page.wait_for_selector("body[data-rollout]")
        assert page.locator("#rollout").is_visible()
        token = page.locator(".tokens .tok.P").first
        assert token.is_visible()
        colour = token.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour.startswith("rgba(37, 99, 235"), colour  # the policy's blue
        assert "logprob -" in (token.get_attribute("title") or "")
        fork = page.locator(".fork").first
        assert fork.is_visible() and "retokenized" in fork.inner_text()
        assert '"guess", "arguments"' in page.locator(".diff .old mark").first.inner_text()
        assert '"guess","arguments"' in page.locator(".diff .new mark").first.inner_text()
        assert page.locator(".tools code", has_text="guess").first.is_visible()
        # filters and pagination work without reloading
        page.select_option("#filter-kind", "failed")
        assert page.locator("button.chip").count() == 1
        page.select_option("#filter-kind", "all")
        shot = tmp_path / "report.png"
        page.locator("#rollout").scroll_into_view_if_needed()
        page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert s.requested and all(u.startswith(base) for u in s.requested), s.requested
    assert s.refused == [] and s.console_errors == []
    out = os.environ.get("ROLLWIRE_SCREENSHOT_DIR")
    if out:  # how the README's screenshot is refreshed
        shutil.copy(shot, Path(out) / "inspect-report.png")
