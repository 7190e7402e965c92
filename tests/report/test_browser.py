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
        assert "tool calls parsed" in page.locator("#tool-health").inner_text()
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


def test_gateway_ui_in_chromium(tmp_path: Path) -> None:
    import openai

    from rollwire.agent.serving import ServerThread
    from rollwire.gateway import serve_in_thread
    from rollwire.testing.null_backend import NullBackend

    def reply(body: dict) -> dict:
        if body.get("tools"):
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "guess", "arguments": '{"word": "crane"}'},
            }
            return {"content": "", "tool_calls": [call]}
        return {"content": "The word was crane."}

    tools = [{"type": "function", "function": {"name": "guess", "parameters": {"type": "object"}}}]
    with (
        ServerThread(NullBackend(reply=reply, routed_experts=(2, 2))) as backend,
        serve_in_thread(
            backends=[(backend.url, "vllm")], store=f"sqlite:{tmp_path / 'gw.db'}"
        ) as gw,
        chromium_session(tmp_path / "profile", height=1000) as s,
    ):
        with gw.client() as c:
            for i in range(3):
                h = c.create_session(group_id=f"wordle-{i // 2}")
                oai = openai.OpenAI(base_url=h.base_url, api_key=h.token)
                msgs: list = [{"role": "user", "content": f"game {i}"}]
                first = oai.chat.completions.create(model="p", messages=msgs, tools=tools)
                msgs += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": "c1", "content": "C?R?A?N?E?"}]  # fmt: skip
                oai.chat.completions.create(model="p", messages=msgs)
                c.complete(h.session_id, reward=float(i))
            live = c.create_session(group_id="wordle-2")  # still running
            openai.OpenAI(base_url=live.base_url, api_key=live.token).chat.completions.create(
                model="p", messages=[{"role": "user", "content": "game 3"}], tools=tools
            )
            c.set_policy_version("step-12")
        page = s.page
        page.goto(f"{gw.url}/ui")
        page.wait_for_selector("#login")  # redirected to the form
        assert gw.admin_key is not None and gw.admin_key not in page.url
        page.fill("#key", gw.admin_key)
        page.click("button[type=submit]")
        page.wait_for_selector("body[data-ready='1']")
        assert page.url == f"{gw.url}/ui" and gw.admin_key not in page.url
        for label in ("live sessions", "calls/s", "tokens/s", "error rate", "latency p50 / p90 / p99",
                      "groups completed", "policy version", "state", "store"):  # fmt: skip
            assert page.locator(f".card[data-k='{label}']").is_visible(), label
        assert "step-12" in page.locator(".card[data-k='policy version']").inner_text()
        assert "2 / 3" in page.locator(".card[data-k='groups completed']").inner_text()
        assert page.locator(".card[data-k='live sessions'] .v").inner_text() == "1"
        assert page.locator("#sessions tbody tr").count() == 4
        page.wait_for_selector("svg.spark")  # the second poll draws the rate sparklines
        shot = tmp_path / "ui.png"
        page.screenshot(path=str(shot), full_page=True)
        page.locator("#sessions tbody a").nth(1).click()  # a finished session
        page.wait_for_selector("body[data-ready='1']")
        page.locator("button.chip").first.click()
        page.wait_for_selector("body[data-rollout]")
        assert page.locator(".tokens .tok.P").first.is_visible()
        assert page.locator(".tools code", has_text="guess").first.is_visible()
    assert shot.stat().st_size > 10_000
    assert s.requested and all(u.startswith(gw.url) for u in s.requested), s.requested
    assert s.refused == [] and s.console_errors == []
    out = os.environ.get("ROLLWIRE_SCREENSHOT_DIR")
    if out:
        shutil.copy(shot, Path(out) / "gateway-ui.png")
