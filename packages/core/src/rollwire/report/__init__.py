"""``rollwire inspect``: see what a batch of rollouts would train, as one self-contained HTML file.

A reader of rollouts (``rollwire.data``), never on the capture path.
"""

from rollwire.report.html import Report, build_report, render_html, write_report
from rollwire.report.summary import DriftEntry, GroupSummary, Summary, drift_report, summarize
from rollwire.report.tokens import ROLES, Vocabulary, row_roles

__all__ = [
    "ROLES",
    "DriftEntry",
    "GroupSummary",
    "Report",
    "Summary",
    "Vocabulary",
    "build_report",
    "drift_report",
    "render_html",
    "row_roles",
    "summarize",
    "write_report",
]
