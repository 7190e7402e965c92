"""The eval plot: a PNG of pass@k per setting (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

from rollwire.data.protocol import Group
from rollwire.evaluation import EvalResult, EvalSetting, score_setting
from rollwire.evaluation.plot import plot_result
from rollwire.testing.samples import single_turn_rollout


def _groups(rewards: list[float]) -> list[Group]:
    rs = [single_turn_rollout(f"r{i}", "t", rw) for i, rw in enumerate(rewards)]
    return [Group(group_id="t", task_id="t", rollouts=rs)]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from matplotlib import image

    settings = [
        score_setting(
            EvalSetting("cold", {}), _groups([0, 0, 1, 0]), success_threshold=1, ks=[1, 2, 4]
        ),
        score_setting(
            EvalSetting("hot", {}), _groups([1, 0, 1, 1]), success_threshold=1, ks=[1, 2, 4]
        ),
    ]
    path = plot_result(EvalResult(settings, 4, [1, 2, 4], 1.0, 0.95), tmp_path / "sub" / "eval.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 400
    assert pixels.std() > 0.01  # something was drawn
