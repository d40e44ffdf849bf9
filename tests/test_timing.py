"""Timers and step statistics, with fake clocks and fake CUDA events."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_bench.measure.window import CpuStepTimer, CudaStepTimer
from amp_bench.stats import StepStats


def test_stats_of_known_samples():
    stats = StepStats.from_samples([10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
    assert stats.median == 14.5 and stats.mean == 14.5
    assert stats.p10 == pytest.approx(10.9) and stats.p90 == pytest.approx(18.1)
    assert stats.iqr == pytest.approx(4.5)
    assert stats.cv == pytest.approx(np.std(range(10, 20), ddof=1) / 14.5)
    assert "CV is 21%" in stats.instability()
    cols = stats.to_columns()
    assert set(cols) >= {"step_time_ms_median", "step_time_ms_mean", "step_time_ms_p10", "step_time_ms_p90",
                         "step_time_cv", "step_time_ms_iqr"}


def test_instability_warning_pyperf_style():
    assert "CV is" in StepStats.from_samples([10, 10, 10, 30, 10, 10]).instability()
    assert StepStats.from_samples([100.0] * 5).instability() is None


@given(st.lists(st.floats(0.01, 1e5), min_size=1, max_size=200))
def test_stats_are_ordered(samples):
    s = StepStats.from_samples(samples)
    assert s.min <= s.p10 <= s.median <= s.p90 <= s.max
    assert s.min <= s.mean * (1 + 1e-9) and s.mean <= s.max * (1 + 1e-9)
    assert s.cv >= 0 and s.n == len(samples)


def test_cpu_timer_with_fake_clock():
    ticks = iter([0.0, 1.0, 1.5, 1.5, 2.25, 3.0])
    timer = CpuStepTimer(clock=lambda: next(ticks))
    timer.begin_window()
    for _ in range(2):
        timer.step_started()
        timer.step_ended()
    per_step, window = timer.end_window()
    assert per_step == [500.0, 750.0] and window == 3.0


class FakeEvent:
    """Replays GPU timestamps (ms) the way torch.cuda.Event does: elapsed_time between records."""
    def __init__(self, timeline):
        self.timeline, self.t = timeline, None

    def record(self):
        self.t = next(self.timeline)

    def elapsed_time(self, end):
        return end.t - self.t


def test_cuda_timer_uses_events_per_step_and_syncs_only_at_the_window_edges():
    gpu_times = iter([-1.0] * 6 + [0.0, 7.5, 7.5, 15.25, 15.25, 23.0])  # 6 creation records, then the steps
    syncs = []
    host = iter([100.0, 100.5])
    created = []
    timer = CudaStepTimer(lambda: created.append(1) or FakeEvent(gpu_times), lambda: syncs.append("sync"), steps=3,
                          clock=lambda: next(host))
    assert len(created) == 6  # all events exist before the window opens
    timer.begin_window()
    for _ in range(3):
        timer.step_started()
        timer.step_ended()
    assert syncs == ["sync"]  # nothing inside the loop
    per_step, window = timer.end_window()
    assert syncs == ["sync", "sync"]
    assert per_step == [7.5, 7.75, 7.75] and window == 0.5


def test_empty_window_is_an_error():
    with pytest.raises(ValueError):
        StepStats.from_samples([])
    assert math.isnan(StepStats.from_samples([0.0]).cv)


def test_median_interval_ranks_are_scipys_binomial_ones():
    """The pure-Python rank (the stop rule calls it between measured steps) is the binomial one."""
    from scipy.stats import binom

    from amp_bench.stats import _median_rank
    for n in [6, 7, 8, 9, 10, 17, 50, 99, 100, 257, 1000, 4001]:
        for confidence in (0.9, 0.95, 0.99):
            m = int(binom.ppf((1 - confidence) / 2, n, 0.5))
            if binom.cdf(m, n, 0.5) > (1 - confidence) / 2:
                m -= 1
            assert _median_rank(n, confidence) == max(m, 0), (n, confidence)


def test_the_stop_rule_imports_nothing_inside_the_window():
    """A first import inside the measured window is host gap (scipy.stats took 0.5 s): the interval
    the adaptive rule computes at its checkpoints must not import anything."""
    import subprocess
    import sys
    code = ("import sys; from amp_bench.stats import median_ci, relative_half_width; "
            "before = set(sys.modules); relative_half_width([1.0 + i / 100 for i in range(40)]); "
            "print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
