"""The ``rollwire`` command line; :func:`main` is the console-script entry point."""

from __future__ import annotations

from rollwire.cli.app import app, main

__all__ = ["app", "main"]
