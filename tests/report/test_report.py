"""``rollwire inspect``'s report, rendered from a batch holding every fork class, failed
rollouts, off-policy calls, tool use and routed experts, and read back from the HTML."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from rollwire.data.rewards import group_advantages
from rollwire.report import build_report, render_html, row_roles
from rollwire.report.html import read_report_data
from rollwire.testing.chat_samples import CHAR_TOKENIZER, chat_batch

FORK_CLASSES = {"template", "retokenized", "think_stripped", "truncated", "other"}


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    return build_report(chat_batch(), tokenizer=CHAR_TOKENIZER, source="fixture.jsonl")


@pytest.fixture(scope="module")
def page(report):  # type: ignore[no-untyped-def]
    return render_html(report)


@pytest.fixture(scope="module")
def data(page):  # type: ignore[no-untyped-def]
    return read_report_data(page)


def _payload(data, rid):  # type: ignore[no-untyped-def]
    _index, _, payloads = data
    by_id = {p["id"]: p for p in payloads}
    return by_id[rid]


def test_summary_counts(data) -> None:  # type: ignore[no-untyped-def]
    index, _, _ = data
    s = index["summary"]
    assert s["rollouts"] == 9 and s["groups"] == 2
    assert s["statuses"] == {"completed": 8, "failed": 1}
    assert s["forks"] == dict.fromkeys(FORK_CLASSES, 1)
    # 19 calls: 4 forked rollouts × 2, the truncated one × 3, four mixed rollouts × 2
    assert s["calls"] == 19
    assert s["failed_calls"] == 1
    assert s["off_policy_calls"] == 1 and s["non_trainable_calls"] == 1
    assert s["flags"] == {"logit_bias": 1}
    assert s["calls_with_experts"] == 2 and s["rows_with_experts"] == 1
    assert s["rows"] == 5 * 2 + 4
    assert s["errors"] == {"TimeoutError": 1}
    assert 0 < s["trainable_share"] < 1


def test_forks_carry_tokens_lost_and_advice(report, data) -> None:  # type: ignore[no-untyped-def]
    index, _, _ = data
    drift = {d["kind"]: d for d in index["drift"]}
    assert set(drift) == FORK_CLASSES
    for kind, d in drift.items():
        (row,) = [r for r in report.rows[f"g-forks-{kind}"] if r.fork is not None]  # one fork each
        assert d["count"] == 1 and d["rollouts"] == 1
        assert d["tokens_lost"] == row.fork.tokens_lost
        assert d["advice"]
    assert drift["think_stripped"]["tokens_lost"] > 0
    assert "rollwire doctor" in drift["template"]["advice"]
    # most costly first
    lost = [d["tokens_lost"] for d in index["drift"]]
    assert lost == sorted(lost, reverse=True)


def test_group_advantages_are_grpo(data) -> None:  # type: ignore[no-untyped-def]
    index, _, _ = data
    expected = group_advantages(chat_batch())
    forks = next(g for g in index["groups"] if g["id"] == "g-forks")
    rewards = [r["rw"] for r in forks["rollouts"]]
    assert rewards == [1.0, 0.5, 0.0, -0.5, 0.25]
    for r in forks["rollouts"]:
        assert r["adv"] == pytest.approx(expected[r["id"]], abs=1e-6)
    mean, std = np.mean(rewards), np.std(rewards, ddof=1)
    top = forks["rollouts"][0]
    assert top["adv"] == pytest.approx((1.0 - mean) / std, rel=1e-4)
    mixed = next(g for g in index["groups"] if g["id"] == "g-mixed")
    failed = next(r for r in mixed["rollouts"] if r["id"] == "failed")
    assert failed["st"] == "failed" and failed["rw"] is None and failed["adv"] is None


def test_tokens_coloured_by_role(data) -> None:  # type: ignore[no-untyped-def]
    _, vocab, _ = data
    p = _payload(data, "tools-merged")
    (row,) = p["rows"]
    pieces = [vocab[str(t)] for t in row["ids"]]
    text = "".join(pieces)
    owner = [i for i, piece in enumerate(pieces) for _ in piece]  # character -> token
    roles = row["roles"]
    assert len(roles) == len(row["ids"])

    def role_of(fragment: str) -> set[str]:
        at = text.index(fragment)
        return {roles[owner[c]] for c in range(at, at + len(fragment))}

    assert role_of("You play Wordle") == {"Y"}
    assert role_of("Guess the word.") == {"U"}
    assert role_of("<tool_response>C?R?A?N?E?</tool_response>") == {"T"}
    assert role_of('{"name": "guess"') == {"P"}  # sampled by the policy and trained
    assert role_of("crane<|im_end|>") == {"P"}
    assert roles[0] == "M"  # <|im_start|>
    assert role_of("<|im_start|>user\n") == {"M"}
    # log-probs of the response region, 0 where the mask is 0
    lp = row["lp"]
    assert len(lp) == len(row["ids"]) - row["pl"]
    sampled = [j for j in range(len(lp)) if roles[row["pl"] + j] == "P"]
    assert all(lp[j] < 0 for j in sampled)
    assert all(lp[j] == 0 for j in range(len(lp)) if roles[row["pl"] + j] != "P")


def test_off_policy_tokens_are_sampled_not_trained(report, data) -> None:  # type: ignore[no-untyped-def]
    p = _payload(data, "off-policy")
    (row,) = p["rows"]
    assert "S" in row["roles"]
    (r,) = report.rows["off-policy"]
    roles = row_roles(r, report.vocab)
    s = np.frombuffer(roles.encode(), np.uint8) == ord("S")
    assert s[r.prompt_len :].sum() == len(CHAR_TOKENIZER.encode("crane<|im_end|>")) == 6
    assert int(r.loss_mask[s[r.prompt_len :]].sum()) == 0
    call = p["calls"][1]
    assert call["off"] and not call["tr"] and call["flags"] == ["logit_bias"]


def test_fork_diff_side_by_side(data) -> None:  # type: ignore[no-untyped-def]
    p = _payload(data, "g-forks-retokenized")
    first, second = p["rows"]
    assert first["fork"] is None
    f = second["fork"]
    assert f["kind"] == "retokenized" and f["from"] == 0
    # the shared context, then what the model sampled (left) and what the history holds (right)
    assert f["ctx"] == 'all>{"name":'  # 12 tokens (characters) of shared context
    assert f["old"].startswith(' "guess", "arguments": {"word": "crane"}}')
    assert f["new"].startswith('"guess","arguments":{"word":"crane"}}')
    think = _payload(data, "g-forks-think_stripped")["rows"][1]["fork"]
    assert think["kind"] == "think_stripped"
    assert think["old"].startswith("<think>plan: try crane</think>")
    assert think["new"].startswith("<tool_call>")


def test_calls_show_parsed_tool_calls_and_failures(data) -> None:  # type: ignore[no-untyped-def]
    p = _payload(data, "tools-merged")
    assert p["calls"][0]["tools"] == [{"name": "guess", "arguments": '{"word": "crane"}'}]
    failed = _payload(data, "failed")
    assert failed["err"].startswith("TimeoutError")
    assert failed["calls"][1]["st"] == "failed"
    assert "503" in failed["calls"][1]["err"]
    assert len(failed["rows"]) == 1  # the failed call trains nothing
    moe = _payload(data, "moe")
    assert all(c["ex"] for c in moe["calls"]) and moe["rows"][0]["ex"]


def test_page_is_self_contained(page) -> None:  # type: ignore[no-untyped-def]
    assert "fixture.jsonl" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    assert "default-src 'none'" in page  # the page may not fetch anything
    # the summary charts are inline SVG
    assert page.count("<svg") >= 5 and "forks by class" in page
    # the script colours tokens by role class and log-prob intensity
    assert ".tok.P" in page and "Math.exp(lp)" in page


def test_script_tags_survive_hostile_text() -> None:
    batch = chat_batch()
    batch[0].rollouts[0].rollout_id = "</script><script>alert(1)</script>"
    page = render_html(build_report(batch, tokenizer=CHAR_TOKENIZER))
    assert "</script><script>alert(1)" not in page
    index, _, _ = read_report_data(page)
    assert index["groups"][0]["rollouts"][0]["id"] == "</script><script>alert(1)</script>"


def test_without_tokenizer_roles_come_from_masks() -> None:
    page = render_html(build_report(chat_batch()))
    index, vocab, payloads = read_report_data(page)
    assert vocab == {} and index["tokenizer"] is False
    assert index["summary"]["forks"] == {"unknown": 5}  # nothing can be told apart
    roles = "".join(row["roles"] for p in payloads for row in p["rows"])
    assert set(roles) <= {"P", "S", "C"} and "P" in roles


def test_many_rollouts_are_chunked() -> None:
    from rollwire.report.html import CHUNK

    batch = chat_batch()
    rollouts = []
    for i in range(3 * CHUNK // 9 + 1):
        for g in chat_batch():
            for r in g.rollouts:
                r.rollout_id = f"{r.rollout_id}-{i}"
                r.group_id = f"{g.group_id}-{i}"
                rollouts.append(r)
    page = render_html(build_report(rollouts, tokenizer=CHAR_TOKENIZER))
    index, _, payloads = read_report_data(page)
    assert page.count('id="rw-chunk-') == math.ceil(len(rollouts) / CHUNK) >= 3
    assert [p["id"] for p in payloads] == [r["id"] for g in index["groups"] for r in g["rollouts"]]
    assert len(batch) == 2


def test_stale_calls_are_counted_in_the_summary() -> None:
    batch = chat_batch()
    call = batch[0].rollouts[0].calls[-1]
    call.trainable, call.off_policy, call.flags = False, True, ["stale"]
    s = build_report(batch, tokenizer=CHAR_TOKENIZER).summary.as_dict()
    assert s["stale_calls"] == 1 and s["flags"] == {"logit_bias": 1, "stale": 1}
    from rollwire.cli.summary import summarize, summary_lines

    lines = dict(summary_lines(summarize(batch, [], 1.0)))
    assert lines["stale calls (not trained)"] == "1"
    assert "MoE calls without routing" not in lines


def test_tool_call_health_in_the_summary_and_on_each_call() -> None:
    batch = chat_batch()
    healthy = build_report(batch, tokenizer=CHAR_TOKENIZER).summary.as_dict()["tools"]
    assert healthy["parsed"] >= 1 and healthy["unparsed"] == 0 and not healthy["none_parsed"]
    # the server's parser does not read the model's format: the call's tool call stays text
    offered = 0
    for group in batch:
        for rollout in group.rollouts:
            for call in rollout.calls:
                offered += bool(call.request.get("tools"))
                message = (call.response.get("choices") or [{}])[0].get("message") or {}
                if message.get("tool_calls"):
                    message["content"] = '<tool_call>{"name": "guess", "arguments": {}}</tool_call>'
                    message["tool_calls"] = None
    report = build_report(batch, tokenizer=CHAR_TOKENIZER)
    broken = report.summary.as_dict()["tools"]
    assert broken == {
        "offered": offered,
        "parsed": 0,
        "unparsed": healthy["parsed"],
        "none_parsed": offered > 0,
    }
    index, _, payloads = read_report_data(render_html(report))
    assert index["summary"]["tools"] == broken
    calls = [c for p in payloads for c in p["calls"]]
    assert sum(c["unparsed"] for c in calls) == healthy["parsed"]
