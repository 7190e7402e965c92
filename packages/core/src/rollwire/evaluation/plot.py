"""A small PNG of an evaluation: pass@k per setting with its intervals (matplotlib, an extra)."""

from __future__ import annotations

from pathlib import Path

from rollwire.evaluation.scoring import EvalResult

__all__ = ["MissingPlotExtra", "plot_result"]


class MissingPlotExtra(ImportError):
    """matplotlib is not installed."""


def plot_result(result: EvalResult, path: str | Path) -> Path:
    """Write pass@k (with error bars) for every setting to ``path`` as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingPlotExtra(
            'the eval plot needs matplotlib, which is not installed: pip install "rollwire[plot]"'
        ) from exc
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    for s in result.settings:
        ks = [k for k in result.ks if k in s.pass_at_k]
        vals = [s.pass_at_k[k].value for k in ks]
        lo = [s.pass_at_k[k].value - s.pass_at_k[k].low for k in ks]
        hi = [s.pass_at_k[k].high - s.pass_at_k[k].value for k in ks]
        ax.errorbar(ks, vals, yerr=[lo, hi], marker="o", capsize=3, label=s.setting.name)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(result.ks)
    ax.legend(fontsize=8)
    ax.set_title(f"pass@k ({round(result.confidence * 100)} % intervals)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
