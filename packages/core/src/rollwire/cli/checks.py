"""Start-up checks of the CLI: backend specs, ports, gateways and backends that must answer.

Each check ends a command that cannot work with one line saying what was wrong (via
:func:`~rollwire.cli.errors.fail`) before anything is announced or started.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rollwire.cli.errors import fail

if TYPE_CHECKING:
    import httpx

    from rollwire.gateway.config import BackendSpec

__all__ = [
    "bind_port",
    "check_store",
    "parse_backend",
    "probe_backend",
    "probe_gateway",
    "url_problem",
]

#: the backend kinds of ``rollwire.gateway.config`` (not imported here: it loads the gateway)
BACKEND_KINDS = ("vllm", "sglang", "openai", "tinker")
_KINDS = "|".join(BACKEND_KINDS)
#: seconds a start-up probe waits for an answer (a live server answers in milliseconds)
PROBE_TIMEOUT = 5.0


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host, or None when it is."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    if port is not None and not 0 < port < 65536:
        return f"port {port} is out of range"
    return None


def parse_backend(spec: str, flag: str = "--backend") -> BackendSpec:
    """``URL`` or ``URL=KIND`` as a :class:`BackendSpec`; an unknown kind or a string that is
    not an http(s) URL ends the command (the gateway would otherwise 502 on every call)."""
    from rollwire.gateway.config import BackendSpec

    url, sep, kind = spec.rpartition("=")
    if not sep or url_problem(url) is not None:
        url, kind = spec, "vllm"
    elif kind not in BACKEND_KINDS:
        raise fail(
            f"{flag} {spec}: unknown backend kind {kind!r}; use URL=KIND with KIND one of "
            f"{', '.join(BACKEND_KINDS)}"
        )
    problem = url_problem(url)
    if problem is not None:
        raise fail(
            f"{flag} {spec} is not a backend URL ({problem}); use http://HOST:PORT[={_KINDS}]"
        )
    if kind == "tinker":
        raise fail(
            f"{flag} {spec}: a tinker backend needs the model it samples and its tokenizer; add it "
            "with POST /api/backends (kind, model, tokenizer) or GatewayConfig (docs/tinker.md)"
        )
    return BackendSpec(url, kind)


def check_store(url: str) -> None:
    """End the command when a ``sqlite:PATH`` store's folder does not exist (SQLite would
    only fail at the first write, after the gateway announced itself)."""
    if not url.startswith("sqlite:"):
        return  # other schemes are checked when the store is opened
    path = url[len("sqlite:") :].removeprefix("//")
    if path in ("", ":memory:"):
        return
    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise fail(f"--store {url}: the folder {folder} does not exist; create it first")


def bind_port(host: str, port: int, what: str) -> socket.socket:
    """A listening socket on ``host:port`` for uvicorn, bound before anything is announced.

    Binding here rather than inside uvicorn turns a busy port into one line, and leaves no
    window between the check and the bind."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise fail(f"--host {host}: cannot resolve it ({exc.strerror})") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # what uvicorn sets
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise fail(
                f"port {port} on {host} is already in use (another {what}, or another server?); "
                "pick a free one with --port"
            ) from exc
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def probe_backend(spec: BackendSpec) -> str | None:
    """Why the inference server ``spec`` cannot be reached, or None when it answers at all
    (``/health``, or ``/v1/models`` for an ``openai`` endpoint; any HTTP status counts)."""
    import httpx

    path = "/v1/models" if spec.kind == "openai" else "/health"
    try:
        httpx.get(spec.url + path, timeout=PROBE_TIMEOUT, trust_env=False)
    except httpx.TransportError as exc:
        return _transport_problem(exc)
    return None


def probe_gateway(url: str, admin_key: str | None) -> None:
    """End the command unless ``url`` is a rollwire gateway that takes ``admin_key`` and has a
    backend: each way it can be wrong gets its own line, at once (no minute of retries)."""
    import httpx

    if url_problem(url) is not None:
        raise fail(f"--gateway {url} is not a URL ({url_problem(url)}); use http://HOST:PORT")
    if not admin_key:
        raise fail(
            f"the gateway at {url} needs its admin key: pass --admin-key KEY or set "
            "ROLLWIRE_ADMIN_KEY (`rollwire gateway` prints the key it generated at start-up)"
        )
    try:
        resp = httpx.get(
            url + "/api/backends",
            headers={"authorization": f"Bearer {admin_key}"},
            timeout=PROBE_TIMEOUT,
            trust_env=False,
        )
    except httpx.TransportError as exc:
        raise fail(
            f"cannot reach the gateway at {url}: {_transport_problem(exc)}; start one with "
            "`rollwire gateway`, or run with --gateway embedded"
        ) from exc
    if resp.status_code in (401, 403):
        raise fail(
            f"the gateway at {url} refused the admin key (HTTP {resp.status_code}); pass the key "
            "it was started with (--admin-key or ROLLWIRE_ADMIN_KEY)"
        )
    if resp.status_code != 200:
        raise fail(
            f"{url} does not answer as a rollwire gateway (GET /api/backends: HTTP "
            f"{resp.status_code})"
        )
    try:
        backends = resp.json().get("backends", [])
    except ValueError as exc:
        raise fail(f"{url} does not answer as a rollwire gateway (GET /api/backends)") from exc
    if not backends:
        raise fail(
            f"the gateway at {url} has no inference backend: start it with --backend URL "
            "(or add one with POST /api/backends)"
        )


def _transport_problem(exc: httpx.TransportError) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return "connection refused or host unreachable"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {PROBE_TIMEOUT:g}s"
    return f"{type(exc).__name__}: {exc}"
