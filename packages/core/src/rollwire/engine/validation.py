"""Request validation of the engine's routes: typed, range-checked fields (a 400 naming the field
otherwise), sampling parameters, model name, tools and ``tool_choice``."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

from .http import _HTTPError
from .parsing import parse_assistant_text
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .runtime import Engine


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(name: str, expected: str, value: Any) -> _HTTPError:
    return _HTTPError(400, f"'{name}' must be {expected}, got {_show(value)}", param=name)


def _int(
    body: dict[str, Any],
    key: str,
    default: int | None,
    *,
    lo: int | None = None,
    hi: int | None = None,
    where: str = "",
) -> int | None:
    """``body[key]`` as an int (ints, integral floats, bools and numeric strings, like pydantic's
    lax mode); a 400 naming the field otherwise."""
    value = body.get(key)
    if value is None:
        return default
    name = where + key
    span = f" in [{lo}, {hi}]" if lo is not None and hi is not None else ""
    span = span or (f" >= {lo}" if lo is not None else "")
    out: int | None = None
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        out = int(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            out = int(value.strip())
    if out is None or (lo is not None and out < lo) or (hi is not None and out > hi):
        raise _bad(name, "an integer" + span, value)
    return out


def _float(
    body: dict[str, Any],
    key: str,
    default: float,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    where: str = "",
) -> float:
    """``body[key]`` as a finite float in range; a 400 naming the field otherwise."""
    value = body.get(key)
    if value is None:
        return default
    out: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            out = float(value.strip())
    low_ok = out is not None and (lo is None or (out > lo if lo_open else out >= lo))
    if out is None or not math.isfinite(out) or not low_ok or (hi is not None and out > hi):
        bounds = ""
        if lo is not None:
            bounds = f" {'>' if lo_open else '>='} {lo}"
        if hi is not None:
            bounds += f"{' and' if bounds else ''} <= {hi}"
        raise _bad(where + key, "a number" + bounds, value)
    return out


def _bool(body: dict[str, Any], key: str, default: bool, *, where: str = "") -> bool:
    """``body[key]`` as a bool (also 0/1 and "true"/"false"); a 400 naming the field otherwise."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(where + key, "a boolean", value)


def _str_list(body: dict[str, Any], key: str, *, where: str = "") -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise _bad(where + key, "a string or a list of strings", value)


def _int_list(body: dict[str, Any], key: str, *, where: str = "") -> list[int]:
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return [int(v) for v in value]
    raise _bad(where + key, "a list of integers", value)


def _params(
    body: dict[str, Any], engine: Engine, *, sglang: bool = False, n_index: int = 0, where: str = ""
) -> SamplingParams:
    """Sampling parameters of a request; every field is type- and range-checked (400 naming it)."""
    w = where
    if sglang:
        sp = body.get("sampling_params")
        sp = {} if sp is None else sp
        if not isinstance(sp, dict):
            raise _bad("sampling_params", "an object", sp)
        w = "sampling_params."
        seed = _int(sp, "sampling_seed", None, where=w)
        if seed is None:
            seed = _int(sp, "seed", None, where=w)
        return SamplingParams(
            max_tokens=_int(sp, "max_new_tokens", 128, lo=0, where=w) or 0,
            temperature=_float(sp, "temperature", 1.0, lo=0.0, where=w),
            top_p=_float(sp, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True, where=w),
            top_k=_int(sp, "top_k", -1, lo=-1, where=w) or -1,
            min_p=_float(sp, "min_p", 0.0, lo=0.0, hi=1.0, where=w),
            stop=_str_list(sp, "stop", where=w),
            stop_token_ids=_int_list(sp, "stop_token_ids", where=w),
            ignore_eos=_bool(sp, "ignore_eos", False, where=w),
            seed=seed,
            logprobs=_int(body, "top_logprobs_num", 0, lo=0, hi=engine.config.max_top_logprobs)
            if _bool(body, "return_logprob", False)
            else None,
            skip_special_tokens=_bool(sp, "skip_special_tokens", True, where=w),
            include_stop_str_in_output=_bool(sp, "no_stop_trim", False, where=w),
        )
    max_tokens = _int(body, "max_completion_tokens", None, lo=0, where=w)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", engine.config.default_max_tokens, lo=0, where=w)
    seed = _int(body, "seed", None, where=w)
    if seed is not None and n_index:
        seed += n_index
    return SamplingParams(
        max_tokens=max_tokens or 0,
        temperature=_float(body, "temperature", 1.0, lo=0.0, where=w),
        top_p=_float(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True, where=w),
        top_k=_int(body, "top_k", -1, lo=-1, where=w) or -1,
        min_p=_float(body, "min_p", 0.0, lo=0.0, hi=1.0, where=w),
        stop=_str_list(body, "stop", where=w),
        stop_token_ids=_int_list(body, "stop_token_ids", where=w),
        ignore_eos=_bool(body, "ignore_eos", False, where=w),
        seed=seed,
        skip_special_tokens=_bool(body, "skip_special_tokens", True, where=w),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False, where=w),
    )


def _n(body: dict[str, Any]) -> int:
    return _int(body, "n", 1, lo=1, hi=128) or 1


def _model_name(engine: Engine, body: dict[str, Any]) -> str:
    """The name to echo (a loaded LoRA adapter's name serves the request with it); with
    ``strict_model_name`` an unknown model is vLLM's 404."""
    model = body.get("model")
    if model is None or model == "":
        return engine.model_name
    if not isinstance(model, str):
        raise _bad("model", "a string", model)
    served = engine.config.served_model_names
    if engine.config.strict_model_name and model not in served and model not in engine.adapters:
        raise _HTTPError(404, f"The model `{model}` does not exist.", param="model")
    return model


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "a list of tool objects", tools)
    if not tools:
        # vLLM refuses an empty tools list; keep the same behaviour so gateway tests see it.
        raise _HTTPError(
            400, "'tools' must not be an empty list; omit it when there are no tools", param="tools"
        )
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}]", '{"type": "function", "function": {"name": ...}}', t)
    return tools


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> str | tuple[str]:
    """``"none"``, ``"auto"``, ``"required"`` or ``(name,)`` for a named function (checked
    against ``tools``, like vLLM)."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise _HTTPError(
                400, "tool_choice 'required' needs a non-empty 'tools' list", param="tool_choice"
            )
        return str(choice)
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad(
            "tool_choice",
            '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            choice,
        )
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise _HTTPError(
            400,
            f"tool_choice names function {name!r}, which is not in 'tools' ({names})",
            param="tool_choice",
        )
    return (name,)


def _check_forced_tool_call(choice: str | tuple[str], forced_text: str | None) -> None:
    """``required``/named tool_choice: the engine cannot constrain sampling, so only a scripted
    reply that is a tool call (to the named function) satisfies it."""
    if choice in ("none", "auto"):
        return
    what = "'required'" if choice == "required" else f"function {choice[0]!r}"
    if forced_text is None:
        raise _HTTPError(
            400,
            f"tool_choice {what} cannot be enforced by the embedded engine (it samples freely); "
            "script the reply with scripted mode (--scripted) or use tool_choice 'auto'",
            param="tool_choice",
        )
    calls = parse_assistant_text(forced_text)[2]
    if not calls:
        raise _HTTPError(
            400,
            f"tool_choice {what}: the scripted reply is not a tool call: {_show(forced_text)}",
            param="tool_choice",
        )
    if isinstance(choice, tuple):
        wrong = [c["function"]["name"] for c in calls if c["function"]["name"] != choice[0]]
        if wrong:
            raise _HTTPError(
                400,
                f"tool_choice {what}: the scripted reply calls {wrong}",
                param="tool_choice",
            )


def _top_k_requested(body: dict[str, Any], engine: Engine) -> int | None:
    k = _int(body, "top_logprobs", 0, lo=0, hi=engine.config.max_top_logprobs) or 0
    if not _bool(body, "logprobs", False):
        return None
    return k


def _prompt_logprobs(body: dict[str, Any], engine: Engine) -> int | None:
    return _int(body, "prompt_logprobs", None, lo=0, hi=engine.config.max_top_logprobs)
