"""The data model and the pure functions over it: calls, rollouts, rows, datasets, rewards.

Nothing here does I/O beyond reading and writing JSONL files; no gateway, store or HTTP code.
"""
