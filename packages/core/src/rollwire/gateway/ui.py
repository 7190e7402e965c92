"""``/ui``: the gateway's own dashboard — live sessions, rates, errors, latency, store size.

The admin key is typed into a login form once and answered with an HttpOnly, SameSite=Strict
cookie holding an expiring HMAC of the key (never the key itself, never in a URL). A session's
page is ``rollwire inspect``'s report of that one rollout. Everything is served by the gateway
process; the pages fetch only the gateway's own ``/ui/api/stats``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import Counter, deque
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from rollwire.data.protocol import TERMINAL_STATUSES
from rollwire.gateway.control.base import json_response, same_key
from rollwire.gateway.control.sessions import SessionRoutes
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.ports import GatewayPort

__all__ = ["COOKIE", "ui_routes"]

COOKIE = "rollwire_ui"
_COOKIE_TTL_S = 12 * 3600
_RATE_WINDOW_S = 30.0
_RECENT = 50
_PAGE_CSP = (
    "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; "
    "script-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"
)


def _asset(name: str) -> str:
    return resources.files("rollwire.gateway").joinpath("ui_assets").joinpath(name).read_text()


def _sign(key: str, expires: int) -> str:
    mac = hmac.new(key.encode(), f"rollwire-ui:{expires}".encode(), hashlib.sha256)
    return f"{expires}.{mac.hexdigest()}"


def _percentile(bounds: tuple[float, ...], counts: list[int], q: float) -> float | None:
    """Upper bound (seconds) of the histogram bucket holding quantile ``q``; None when empty."""
    total = sum(counts)
    if total == 0:
        return None
    acc = 0
    for i, n in enumerate(counts):
        acc += n
        if acc >= q * total:
            return bounds[i] if i < len(bounds) else float("inf")
    return float("inf")


def _store_bytes(store: Any) -> int | None:
    path = getattr(store, "path", None)
    if not isinstance(path, (str, Path)) or str(path) in ("", ":memory:"):
        return None
    base = Path(path)
    files = [base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-shm")]
    return sum(f.stat().st_size for f in files if f.exists()) or None


class _Dashboard:
    """The routes, and the samples the rates are computed from."""

    def __init__(self, gw: GatewayPort) -> None:
        self.gw = gw
        self.sessions = SessionRoutes(gw)
        # Rates are averaged over the last 30 s of polls; until a second poll, since start-up.
        self.samples: deque[tuple[float, int, int, int]] = deque(maxlen=120)
        self.samples.append((time.monotonic(), 0, 0, 0))

    # -- auth -----------------------------------------------------------------------------------
    def _logged_in(self, request: Request) -> bool:
        key = self.gw.admin_key
        if key is None:
            return True  # open mode without an admin key: local development
        value = request.cookies.get(COOKIE, "")
        expires, _, _ = value.partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return False
        return hmac.compare_digest(value, _sign(key, int(expires)))

    def _require(self, request: Request) -> None:
        if not self._logged_in(request):
            self.gw.metrics.error("unauthorized_ui")
            raise GatewayError(
                401, "log in at /ui/login first", "authentication_error", "ui_login_required"
            )

    async def login_form(self, request: Request) -> Response:
        failed = request.query_params.get("failed") == "1"
        page = _asset("login.html").replace(
            "@MESSAGE@", '<p class="err">That is not the admin key.</p>' if failed else ""
        )
        return HTMLResponse(page, headers={"content-security-policy": _PAGE_CSP})

    async def login(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > 4096:
            raise GatewayError(413, "login form too large")
        given = (parse_qs(body.decode("utf-8", "replace")).get("key") or [""])[0]
        key = self.gw.admin_key
        if key is not None and not same_key(given, key):
            self.gw.metrics.error("unauthorized_ui")
            return RedirectResponse("/ui/login?failed=1", status_code=303)
        response = RedirectResponse("/ui", status_code=303)
        if key is not None:
            expires = int(time.time()) + _COOKIE_TTL_S
            response.set_cookie(
                COOKIE,
                _sign(key, expires),
                max_age=_COOKIE_TTL_S,
                path="/ui",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/ui")
        return response

    # -- pages ----------------------------------------------------------------------------------
    async def dashboard(self, request: Request) -> Response:
        if not self._logged_in(request):
            return RedirectResponse("/ui/login", status_code=303)
        return HTMLResponse(
            _asset("dashboard.html"), headers={"content-security-policy": _PAGE_CSP}
        )

    async def session_page(self, request: Request) -> Response:
        if not self._logged_in(request):
            return RedirectResponse("/ui/login", status_code=303)
        from rollwire.report import build_report, render_html
        from rollwire.report.tokenizers import load_tokenizer

        sid = request.path_params["session_id"]
        rollout = await self.sessions.rollout_of(sid)
        spec = (rollout.metadata or {}).get("tokenizer") or os.environ.get("ROLLWIRE_TOKENIZER")
        try:
            tok = load_tokenizer(str(spec)) if spec else None
        except ValueError:
            tok = None  # a tokenizer this machine does not have: ids instead of text
        report = build_report(
            [rollout], tokenizer=tok, title=f"session {sid}", source=f"gateway session {sid}"
        )
        page = render_html(report).replace("<header>", '<header><a href="/ui">← dashboard</a> ', 1)
        return HTMLResponse(page)

    # -- data -----------------------------------------------------------------------------------
    def _rates(self, now: float, calls: int, tokens: int, errors: int) -> dict[str, float | None]:
        self.samples.append((now, calls, tokens, errors))
        while len(self.samples) > 2 and now - self.samples[0][0] > _RATE_WINDOW_S:
            self.samples.popleft()
        t0, c0, k0, e0 = self.samples[0]
        dt = now - t0
        if dt <= 0:
            return {"calls_per_s": None, "tokens_per_s": None, "errors_per_s": None}
        return {
            "calls_per_s": (calls - c0) / dt,
            "tokens_per_s": (tokens - k0) / dt,
            "errors_per_s": (errors - e0) / dt,
        }

    async def stats(self, request: Request) -> Response:
        self._require(request)
        gw, m = self.gw, self.gw.metrics
        recs = await gw.store.list_sessions()
        statuses = Counter(r.status for r in recs)
        groups: dict[str, bool] = {}
        for r in recs:
            if r.group_id is not None:
                groups[r.group_id] = groups.get(r.group_id, True) and r.status in TERMINAL_STATUSES
        calls = sum(m.calls.values())
        tokens = m.prompt_tokens + m.completion_tokens
        errors = sum(m.errors.values())
        lat = m.latency
        return json_response(
            {
                "time": time.time(),
                "sessions": {
                    "live": statuses.get("running", 0),
                    "cached": len(gw.sessions),
                    "by_status": dict(statuses),
                },
                "calls": calls,
                "calls_by_status": _by_status(m.calls),
                "tokens": {"prompt": m.prompt_tokens, "completion": m.completion_tokens},
                "errors": dict(m.errors),
                "error_rate": errors / (calls + errors) if calls + errors else 0.0,
                **self._rates(time.monotonic(), calls, tokens, errors),
                "latency_ms": {
                    f"p{int(q * 100)}": _ms(_percentile(lat.bounds, lat.counts, q))
                    for q in (0.5, 0.9, 0.99)
                },
                "groups": {"total": len(groups), "completed": sum(groups.values())},
                "tools": m.tools.as_dict(),
                "policy_version": gw.policy_version,
                "paused": gw.paused,
                "in_flight": gw.in_flight,
                "store": {"kind": type(gw.store).__name__, "bytes": _store_bytes(gw.store)},
                "backends": [
                    {"name": b.name, "url": b.url, "healthy": b.healthy}
                    for b in gw.pool.backends.values()
                ],
                "recent": [
                    {
                        "id": r.session_id,
                        "group": r.group_id,
                        "status": r.status,
                        "reward": r.reward,
                        "calls": r.num_calls,
                        "tokens": r.num_tokens,
                    }
                    for r in reversed(recs[-_RECENT:])
                ],
            }
        )


def _by_status(calls: dict[tuple[str, str], int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for (_, status), n in calls.items():
        out[status] += n
    return dict(out)


def _ms(seconds: float | None) -> float | None:
    if seconds is None or seconds == float("inf"):
        return None if seconds is None else -1.0
    return round(seconds * 1000.0, 3)


def ui_routes(gw: GatewayPort) -> list[BaseRoute]:
    """The ``/ui`` routes of a gateway (registered by :class:`~rollwire.gateway.app.Gateway`)."""
    d = _Dashboard(gw)
    return [
        Route("/ui", d.dashboard, methods=["GET"]),
        Route("/ui/login", d.login_form, methods=["GET"]),
        Route("/ui/login", d.login, methods=["POST"]),
        Route("/ui/logout", d.logout, methods=["POST"]),
        Route("/ui/api/stats", d.stats, methods=["GET"]),
        Route("/ui/sessions/{session_id}", d.session_page, methods=["GET"]),
    ]
