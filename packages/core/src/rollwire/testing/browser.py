"""Headless Debian ``chromium`` driven by Playwright, held to loopback, for page tests.

Playwright's own browser download cannot work here (and must not): the system ``chromium`` is
launched through ``executable_path`` with a fresh profile. Every request the page makes is
checked: anything not for 127.0.0.1 (or an inline ``data:``/``blob:`` URL) is aborted and
recorded, so a test can assert that nothing left the machine.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["BrowserSession", "chromium_path", "chromium_session", "serve_directory"]

#: the flags every browser test runs with
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
_LOCAL_SCHEMES = {"data", "blob", "about"}


def chromium_path() -> str | None:
    """The system chromium (``ROLLWIRE_CHROMIUM`` overrides), or None when none is installed."""
    env = os.environ.get("ROLLWIRE_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class BrowserSession:
    """A page plus every URL it requested and every one that was refused."""

    page: Any
    requested: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)


def _loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in _LOCAL_SCHEMES or (
        parts.scheme in ("http", "https", "ws") and parts.hostname == "127.0.0.1"
    )


@contextmanager
def chromium_session(
    profile_dir: Path, *, width: int = 1280, height: int = 900
) -> Iterator[BrowserSession]:
    """A headless chromium page with a fresh profile in ``profile_dir``, held to 127.0.0.1."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    if executable is None:
        raise RuntimeError("no chromium on PATH: apt-get install -y chromium (see .ci/run)")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile_dir),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            session = BrowserSession(page)

            def gate(route: Any) -> None:
                url = route.request.url
                session.requested.append(url)
                if _loopback(url):
                    route.continue_()
                else:
                    session.refused.append(url)
                    route.abort()

            context.route("**/*", gate)
            page.on(
                "console",
                lambda m: session.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: session.console_errors.append(str(e)))
            yield session
        finally:
            context.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over HTTP on a free 127.0.0.1 port; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
