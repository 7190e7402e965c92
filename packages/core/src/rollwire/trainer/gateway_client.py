"""Trainer-side clients for the gateway's control plane (docs/control-api.md), sync and async."""

from __future__ import annotations

import os
import re
from typing import Any

import httpx
import orjson

from rollwire.data.protocol import ModelCall, Rollout, Row
from rollwire.trainer.session_models import SessionHandle, SessionInfo

__all__ = [
    "AsyncGatewayClient",
    "GatewayAPIError",
    "GatewayClient",
    "SessionHandle",
    "SessionInfo",
    "server_weights_path",
]


class GatewayAPIError(Exception):
    """The gateway refused a request; ``status_code``, ``code`` and ``message`` say why
    (``details``: what the error body carries for a program, e.g. what a sync's pause waited
    for)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status_code} {code or ''}: {message}".replace("  ", " "))
        self.status_code = status_code
        self.message = message
        self.code = code
        self.details = details


def _check(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        message, code, details = resp.text, None, None
        try:
            err = orjson.loads(resp.content)["error"]
            message, code = err.get("message", message), err.get("code")
            if isinstance(err.get("details"), dict):
                details = err["details"]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            pass
        raise GatewayAPIError(resp.status_code, message, code, details)
    if resp.status_code == 204 or not resp.content:
        return None
    return orjson.loads(resp.content)


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def server_weights_path(weights_path: str | os.PathLike[str]) -> str:
    """``weights_path`` as a server in another working folder must read it: a relative path to
    a folder or file that exists here becomes absolute; a URI (``tinker://…``), an absolute path
    and a name that is no local path (a Hub id) go as they are."""
    path = os.fspath(weights_path)
    if _URI.match(path) or os.path.isabs(path) or not os.path.exists(path):
        return path
    # abspath, not resolve(): a symlinked folder keeps the name every machine mounts it under
    return os.path.abspath(path)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _weight_version_targets(backends: list[dict[str, Any]], urls: list[str] | None) -> list[str]:
    if urls is not None:
        return [u.rstrip("/") for u in urls]
    return [str(b["url"]).rstrip("/") for b in backends if b.get("kind") in ("vllm", "sglang")]


def _weight_version_error(url: str, resp: httpx.Response) -> GatewayAPIError:
    hint = (
        " (vLLM serves /update_weight_version only with VLLM_SERVER_DEV_MODE=1)"
        if resp.status_code in (403, 404)
        else ""
    )
    return GatewayAPIError(
        resp.status_code,
        f"{url}/update_weight_version answered {resp.status_code}{hint}: {resp.text[:200]}",
        "weight_version_not_set",
    )


class _Base:
    def __init__(self, url: str, admin_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key

    def _headers(self, token: str | None = None) -> dict[str, str]:
        key = token or self.admin_key
        return {"authorization": f"Bearer {key}"} if key else {}


class GatewayClient(_Base):
    """Synchronous control-plane client: one method per ``/api`` route."""

    def __init__(self, url: str, admin_key: str | None = None, timeout: float = 60.0) -> None:
        super().__init__(url, admin_key)
        self._http = httpx.Client(base_url=self.url, headers=self._headers(), timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _req(self, method: str, path: str, **kw: Any) -> Any:
        return _check(self._http.request(method, path, **kw))

    def create_session(self, **fields: Any) -> SessionHandle:
        """``POST /api/sessions``."""
        return SessionHandle.model_validate(
            self._req("POST", "/api/sessions", json=_drop_none(fields))
        )

    def get_session(self, session_id: str) -> SessionInfo:
        """``GET /api/sessions/{id}``."""
        return SessionInfo.model_validate(self._req("GET", f"/api/sessions/{session_id}"))

    def list_sessions(
        self, group_id: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """``GET /api/sessions``."""
        params = _drop_none({"group_id": group_id, "status": status, "limit": limit})
        data = self._req("GET", "/api/sessions", params=params)
        return [SessionInfo.model_validate(s) for s in data["sessions"]]

    def calls(self, session_id: str) -> list[ModelCall]:
        """``GET /api/sessions/{id}/calls``."""
        data = self._req("GET", f"/api/sessions/{session_id}/calls")
        return [ModelCall.model_validate(c) for c in data["calls"]]

    def rollout(self, session_id: str) -> Rollout:
        """``GET /api/sessions/{id}/rollout``."""
        resp = self._http.get(f"/api/sessions/{session_id}/rollout")
        _check(resp)
        return Rollout.from_json(resp.content)

    def trajectory(self, session_id: str, mode: str = "merge") -> list[Row]:
        """``GET /api/sessions/{id}/trajectory``."""
        data = self._req("GET", f"/api/sessions/{session_id}/trajectory", params={"mode": mode})
        return [Row.model_validate(r) for r in data["rows"]]

    def complete(
        self,
        session_id: str,
        reward: float | None = None,
        metrics: dict[str, float] | None = None,
        status: str = "completed",
        error: str | None = None,
        token: str | None = None,
    ) -> SessionInfo:
        """``POST /api/sessions/{id}/complete`` (with the admin key, or the session's token)."""
        body = _drop_none({"reward": reward, "metrics": metrics, "status": status, "error": error})
        data = self._req(
            "POST",
            f"/api/sessions/{session_id}/complete",
            json=body,
            headers=self._headers(token) if token else None,
        )
        return SessionInfo.model_validate(data)

    def wait(self, session_id: str, timeout: float = 30.0) -> SessionInfo:
        """``GET /api/sessions/{id}/wait``: the session once terminal, or as it is at timeout."""
        data = self._req(
            "GET",
            f"/api/sessions/{session_id}/wait",
            params={"timeout": timeout},
            timeout=timeout + 30.0,
        )
        return SessionInfo.model_validate(data)

    def delete_session(self, session_id: str) -> None:
        """``DELETE /api/sessions/{id}``."""
        self._req("DELETE", f"/api/sessions/{session_id}")

    def backends(self) -> list[dict[str, Any]]:
        """``GET /api/backends``."""
        return list(self._req("GET", "/api/backends")["backends"])

    def add_backend(
        self,
        url: str,
        kind: str = "vllm",
        name: str | None = None,
        model: str | None = None,
        tokenizer: str | None = None,
    ) -> list[dict[str, Any]]:
        """``POST /api/backends``. ``model`` pins the served model name every forwarded request
        uses; unpinned, it is read from the backend's ``GET /v1/models`` at each health check.
        ``tokenizer`` is the folder capture="tokens" renders with for this server."""
        body = _drop_none(
            {"url": url, "kind": kind, "name": name, "model": model, "tokenizer": tokenizer}
        )
        return list(self._req("POST", "/api/backends", json=body)["backends"])

    def remove_backend(self, name: str) -> None:
        """``DELETE /api/backends/{name}``."""
        self._req("DELETE", f"/api/backends/{name}")

    def set_policy_version(self, version: str, *, seq: int | None = None) -> str:
        """``POST /api/policy_version`` (``seq``: its ordinal; default one more than the last)."""
        body = _drop_none({"version": version, "seq": seq})
        return str(self._req("POST", "/api/policy_version", json=body)["version"])

    def set_trainer_version(self, seq: int | None, version: str | None = None) -> dict[str, Any]:
        """``POST /api/trainer_version``: the trainer's newest weights are ``seq`` in the policy
        versions' ordinal (what ``max_staleness`` is measured against; None: no bound)."""
        body = {"seq": seq, **_drop_none({"version": version})}
        return dict(self._req("POST", "/api/trainer_version", json=body))

    def staleness(self) -> dict[str, Any]:
        """``GET /api/trainer_version``: the trainer's and the served ordinals, the lag, and the
        calls this gateway holds."""
        return dict(self._req("GET", "/api/trainer_version"))

    def get_policy_version(self) -> str | None:
        """``GET /api/policy_version``."""
        version = self._req("GET", "/api/policy_version")["version"]
        return None if version is None else str(version)

    def sync_weight_version(self, version: str, *, servers: list[str] | None = None) -> str:
        """After a weight sync: tell every inference server its new weight version
        (``POST /update_weight_version``, so calls report it) and set the gateway's policy
        version. ``servers`` defaults to the gateway's ``vllm``/``sglang`` backends; a server
        that refuses raises :class:`GatewayAPIError` naming it, before the gateway is touched."""
        for url in _weight_version_targets(self.backends(), servers):
            resp = httpx.post(
                f"{url}/update_weight_version",
                json={"new_version": version},
                timeout=self._http.timeout,
            )
            if resp.status_code >= 400:
                raise _weight_version_error(url, resp)
        return self.set_policy_version(version)

    def pause(self, wait: bool = False) -> dict[str, Any]:
        """``POST /api/pause`` (``wait=True``: return once in-flight calls drained)."""
        params = {"wait": "true"} if wait else None
        return dict(self._req("POST", "/api/pause", params=params, timeout=None))

    def resume(self) -> dict[str, Any]:
        """``POST /api/resume``."""
        return dict(self._req("POST", "/api/resume"))

    def pause_status(self) -> dict[str, Any]:
        """``GET /api/pause``."""
        return dict(self._req("GET", "/api/pause"))

    # --------------------------------------------------------------- weight sync (WeightSync)
    def sync_begin(
        self, *, drain: bool = True, timeout: float = 120.0, lease: float = 60.0
    ) -> dict[str, Any]:
        """``POST /api/sync/begin``: pause every gateway on the store; returns once each has
        acknowledged (and, with ``drain``, has no call in flight). The pause lapses after
        ``lease`` seconds unless renewed (:meth:`sync_renew`)."""
        body = {"drain": drain, "timeout": timeout, "lease": lease}
        return dict(self._req("POST", "/api/sync/begin", json=body, timeout=timeout + 30.0))

    def sync_renew(self, *, epoch: str, lease: float = 60.0) -> dict[str, Any]:
        """``POST /api/sync/renew``: keep the sync's pause ``lease`` more seconds."""
        return dict(self._req("POST", "/api/sync/renew", json={"epoch": epoch, "lease": lease}))

    def sync_end(
        self, *, version: str | None, seq: int | None = None, epoch: str | None = None
    ) -> dict[str, Any]:
        """``POST /api/sync/end``: set the policy version (ordinal ``seq``, default one more),
        then resume every gateway (with ``epoch``: a 409 if that sync is over)."""
        body = _drop_none({"version": version, "seq": seq, "epoch": epoch})
        return dict(self._req("POST", "/api/sync/end", json=body))

    def push_weights(
        self,
        name: str,
        *,
        weights_path: str,
        version: str,
        keep: bool = False,
        timeout: float,
        epoch: str | None = None,
        adapter: str | None = None,
        unload: list[str] | None = None,
        seq: int | None = None,
    ) -> dict[str, Any]:
        """``POST /api/backends/{name}/weights``: the backend loads ``weights_path`` by its
        kind's transport and takes ``version`` as its weight version (a relative local path is
        sent absolute: the server's working folder is not this process's). With ``adapter``,
        ``weights_path`` is a PEFT LoRA folder loaded under that name (``seq``: its ordinal),
        which calls name from then on; ``unload`` names adapters to unload after it."""
        path = server_weights_path(weights_path)
        body = _drop_none(
            {"weights_path": path, "version": version, "keep": keep, "epoch": epoch,
             "adapter": adapter, "unload": unload, "seq": seq}
        )  # fmt: skip
        return dict(
            self._req("POST", f"/api/backends/{name}/weights", json=body, timeout=timeout + 30.0)
        )

    def probe_backend(
        self, name: str, *, prompt_ids: list[int], max_tokens: int, timeout: float = 300.0,
        model: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """``POST /api/backends/{name}/probe``: a greedy token-in request with log-probs
        (``model``: through the adapter a call asking for it gets, e.g. a role's)."""
        body: dict[str, Any] = {"prompt_ids": prompt_ids, "max_tokens": max_tokens}
        body["timeout"] = timeout
        if model is not None:
            body["model"] = model
        path = f"/api/backends/{name}/probe"
        return dict(self._req("POST", path, json=body, timeout=timeout + 30.0))

    def quarantine_backend(self, name: str, *, reason: str) -> dict[str, Any]:
        """``POST /api/backends/{name}/quarantine``: out of rotation until restored."""
        return dict(self._req("POST", f"/api/backends/{name}/quarantine", json={"reason": reason}))

    def restore_backend(self, name: str) -> dict[str, Any]:
        """``DELETE /api/backends/{name}/quarantine``: back in rotation."""
        return dict(self._req("DELETE", f"/api/backends/{name}/quarantine"))


class AsyncGatewayClient(_Base):
    """Asynchronous control-plane client: the same methods as :class:`GatewayClient`."""

    def __init__(self, url: str, admin_key: str | None = None, timeout: float = 60.0) -> None:
        super().__init__(url, admin_key)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers(), timeout=timeout)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _req(self, method: str, path: str, **kw: Any) -> Any:
        return _check(await self._http.request(method, path, **kw))

    async def create_session(self, **fields: Any) -> SessionHandle:
        """``POST /api/sessions``."""
        data = await self._req("POST", "/api/sessions", json=_drop_none(fields))
        return SessionHandle.model_validate(data)

    async def get_session(self, session_id: str) -> SessionInfo:
        """``GET /api/sessions/{id}``."""
        return SessionInfo.model_validate(await self._req("GET", f"/api/sessions/{session_id}"))

    async def list_sessions(
        self, group_id: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """``GET /api/sessions``."""
        params = _drop_none({"group_id": group_id, "status": status, "limit": limit})
        data = await self._req("GET", "/api/sessions", params=params)
        return [SessionInfo.model_validate(s) for s in data["sessions"]]

    async def calls(self, session_id: str) -> list[ModelCall]:
        """``GET /api/sessions/{id}/calls``."""
        data = await self._req("GET", f"/api/sessions/{session_id}/calls")
        return [ModelCall.model_validate(c) for c in data["calls"]]

    async def rollout(self, session_id: str) -> Rollout:
        """``GET /api/sessions/{id}/rollout``."""
        resp = await self._http.get(f"/api/sessions/{session_id}/rollout")
        _check(resp)
        return Rollout.from_json(resp.content)

    async def trajectory(self, session_id: str, mode: str = "merge") -> list[Row]:
        """``GET /api/sessions/{id}/trajectory``."""
        data = await self._req(
            "GET", f"/api/sessions/{session_id}/trajectory", params={"mode": mode}
        )
        return [Row.model_validate(r) for r in data["rows"]]

    async def complete(
        self,
        session_id: str,
        reward: float | None = None,
        metrics: dict[str, float] | None = None,
        status: str = "completed",
        error: str | None = None,
        token: str | None = None,
    ) -> SessionInfo:
        """``POST /api/sessions/{id}/complete`` (with the admin key, or the session's token)."""
        body = _drop_none({"reward": reward, "metrics": metrics, "status": status, "error": error})
        data = await self._req(
            "POST",
            f"/api/sessions/{session_id}/complete",
            json=body,
            headers=self._headers(token) if token else None,
        )
        return SessionInfo.model_validate(data)

    async def wait(self, session_id: str, timeout: float = 30.0) -> SessionInfo:
        """``GET /api/sessions/{id}/wait``."""
        data = await self._req(
            "GET",
            f"/api/sessions/{session_id}/wait",
            params={"timeout": timeout},
            timeout=timeout + 30.0,
        )
        return SessionInfo.model_validate(data)

    async def delete_session(self, session_id: str) -> None:
        """``DELETE /api/sessions/{id}``."""
        await self._req("DELETE", f"/api/sessions/{session_id}")

    async def backends(self) -> list[dict[str, Any]]:
        """``GET /api/backends``."""
        return list((await self._req("GET", "/api/backends"))["backends"])

    async def add_backend(
        self,
        url: str,
        kind: str = "vllm",
        name: str | None = None,
        model: str | None = None,
        tokenizer: str | None = None,
    ) -> list[dict[str, Any]]:
        """``POST /api/backends`` (``model``, ``tokenizer``: see :meth:`GatewayClient.add_backend`)."""
        body = _drop_none(
            {"url": url, "kind": kind, "name": name, "model": model, "tokenizer": tokenizer}
        )
        return list((await self._req("POST", "/api/backends", json=body))["backends"])

    async def remove_backend(self, name: str) -> None:
        """``DELETE /api/backends/{name}``."""
        await self._req("DELETE", f"/api/backends/{name}")

    async def set_policy_version(self, version: str, *, seq: int | None = None) -> str:
        """``POST /api/policy_version``."""
        body = _drop_none({"version": version, "seq": seq})
        return str((await self._req("POST", "/api/policy_version", json=body))["version"])

    async def set_trainer_version(
        self, seq: int | None, version: str | None = None
    ) -> dict[str, Any]:
        """:meth:`GatewayClient.set_trainer_version`, async."""
        body = {"seq": seq, **_drop_none({"version": version})}
        return dict(await self._req("POST", "/api/trainer_version", json=body))

    async def staleness(self) -> dict[str, Any]:
        """``GET /api/trainer_version``."""
        return dict(await self._req("GET", "/api/trainer_version"))

    async def sync_weight_version(self, version: str, *, servers: list[str] | None = None) -> str:
        """:meth:`GatewayClient.sync_weight_version`, async."""
        targets = _weight_version_targets(await self.backends(), servers)
        async with httpx.AsyncClient(timeout=self._http.timeout) as http:
            for url in targets:
                resp = await http.post(
                    f"{url}/update_weight_version", json={"new_version": version}
                )
                if resp.status_code >= 400:
                    raise _weight_version_error(url, resp)
        return await self.set_policy_version(version)

    async def pause(self, wait: bool = False) -> dict[str, Any]:
        """``POST /api/pause``."""
        params = {"wait": "true"} if wait else None
        return dict(await self._req("POST", "/api/pause", params=params, timeout=None))

    async def resume(self) -> dict[str, Any]:
        """``POST /api/resume``."""
        return dict(await self._req("POST", "/api/resume"))

    async def pause_status(self) -> dict[str, Any]:
        """``GET /api/pause``."""
        return dict(await self._req("GET", "/api/pause"))
