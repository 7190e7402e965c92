"""The control plane: ``/api``, ``/health`` and ``/metrics`` (a small Starlette app).

:mod:`.routes` builds the app, :mod:`.base` holds what every route group shares,
:mod:`.sessions` and :mod:`.admin` are the route groups, :mod:`.foreign_results` the result
channels of other toolkits' agents.
"""
