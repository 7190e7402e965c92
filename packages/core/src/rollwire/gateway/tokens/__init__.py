"""``capture="tokens"``: the gateway owns tokenization (DESIGN §4.2).

:mod:`.handler` serves a chat call (:mod:`.plan`, :mod:`.record`); :mod:`.render` and
:mod:`.heal` build the prompt ids, :mod:`.backend` generates on a token-in route, :mod:`.parsers`
reads the completion, :mod:`.response` answers in OpenAI form, :mod:`.runtime` keeps per-gateway
state. Nothing here is imported until a tokens session needs it.
"""
