"""The inference backends: :mod:`.pool` (routing, health, stickiness) and :mod:`.upstream` (the
keep-alive HTTP/1.1 client the data plane forwards with)."""
