"""``rollwire eval``: a task set run k times per task at the sampling settings you serve with.

Mean reward, success rate and unbiased pass@k per setting, with confidence intervals. A reader
of rollouts: it drives a ``RolloutClient`` and never touches the capture path.
"""

from rollwire.evaluation.estimators import (
    Estimate,
    bootstrap_interval,
    pass_at_k,
    wilson_interval,
)
from rollwire.evaluation.runner import arun_eval, mark_eval, run_eval
from rollwire.evaluation.scoring import EvalResult, EvalSetting, SettingResult, score_setting
from rollwire.evaluation.table import result_table

__all__ = [
    "Estimate",
    "EvalResult",
    "EvalSetting",
    "SettingResult",
    "arun_eval",
    "bootstrap_interval",
    "mark_eval",
    "pass_at_k",
    "result_table",
    "run_eval",
    "score_setting",
    "wilson_interval",
]
