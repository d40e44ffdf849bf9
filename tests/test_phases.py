"""Where a case's wall time goes: the worker's phases, contiguous from launch to reap, add up to its wall
time; a cost injected into one phase shows in that phase; what cannot change between repeats is paid once."""
import pytest

import amp_bench
from amp_bench.measure.phases import PhaseClock
from amp_bench.stats import PROBE_PHASES, WORKER_PHASES, phase_column

PHASE_COLUMNS = [phase_column(name) for name in WORKER_PHASES]


class FakeClock:
    def __init__(self, start=100.0):
        self.now = start

    def __call__(self):
        return self.now


def test_marks_close_contiguous_phases_from_the_launch():
    clock = FakeClock()
    phases = PhaseClock(launched_at=99.0, clock=clock)
    clock.now = 100.5
    phases.mark("start")
    clock.now = 103.0
    phases.mark("build")
    clock.now = 104.0
    phases.mark("build")  # a phase marked twice adds up
    columns = phases.columns()
    assert columns["phase_start_s"] == 1.5 and columns["phase_build_s"] == 3.5
    assert columns["phase_window_s"] == 0.0 and "phase_exit_s" not in columns  # the parent's to add
    assert columns["worker_ended_at"] == 104.0
    with pytest.raises(ValueError, match="unknown worker phase"):
        phases.mark("lunch")


def test_a_lockstep_members_waits_for_its_partners_are_their_own_phase():
    clock, waited = FakeClock(), [0.0]
    phases = PhaseClock(launched_at=100.0, clock=clock)
    phases.waited = lambda: waited[0]
    clock.now, waited[0] = 110.0, 7.0  # 10 s went by, 7 of them waiting for the partner's turns
    phases.mark("window")
    assert phases.columns()["phase_window_s"] == 3.0 and phases.columns()["phase_wait_s"] == 7.0


def test_a_launch_time_that_is_not_a_number_starts_the_clock_now():
    assert PhaseClock.from_env({"AMP_BENCH_LAUNCHED_AT": "soon"}).seconds == {}
    assert PhaseClock.from_env({"AMP_BENCH_LAUNCHED_AT": "12.5"}).last == 12.5


PHASED_SUITE = """
models: [{{ref: "python:toy_models:slow_phases", label: phased, options: {{build_s: 0.4, first_step_s: 0.5,
                                                                        step_ms: 30}}}}]
batch_sizes: [4]
precisions: {precisions}
allow_emulated: true
warmup_steps: 2
steps: 4
repeats: 2
explain: true
timeout_s: 120
"""


@pytest.mark.slow
@pytest.mark.parametrize("precisions", [["fp32"], ["fp32", "amp_bf16"]], ids=["alone", "lockstep"])
def test_phases_add_up_to_the_workers_wall_time_and_show_the_injected_costs(write_suite, tmp_path, precisions):
    results = amp_bench.run_suite(write_suite(PHASED_SUITE.format(precisions=precisions)), device="cpu",
                                  results_dir=tmp_path / "results")
    assert set(results.status) == {"ok"} and len(results) == 2 * len(precisions)
    for row in results.to_dict("records"):
        phases = {name: row[phase_column(name)] for name in WORKER_PHASES}
        assert all(seconds >= 0 for seconds in phases.values()), phases
        # contiguous marks and the parent's reap: nothing between launch and reap goes uncounted
        assert sum(phases.values()) == pytest.approx(row["worker_wall_s"], abs=0.05), phases
        assert phases["build"] >= 0.4 and phases["first_step"] >= 0.5, phases  # the injected sleeps
        assert phases["window"] >= 4 * 0.030 and phases["window"] >= row["window_s"] * 0.99
        assert phases["first_step"] < 0.5 + 1.0 and phases["build"] < 0.4 + 1.0  # and not the others' time
        if len(precisions) > 1:  # a lockstep member: its partner's turns are waits, not its own phases
            assert row["interleave"] == "steps" and phases["wait"] > 0.4
        else:
            assert phases["wait"] == 0
        probes = {name: phases[name] for name in PROBE_PHASES}
        if row["repeat"] == 0:  # per-phase memory (in the FLOPs step or its own) and the profile
            assert probes["profile"] > 0 and (probes["flops"] > 0 or probes["memory_probe"] > 0), probes
            assert row["peak_mem_forward_bytes"] > 0  # this mode's own per-phase memory, even where it did not count
        else:  # none of the probes can change between repeats: none is paid again
            assert not any(probes.values()), probes
        assert row["flops_per_step"] > 0  # every row has the count, one worker counted it
    counted = results[results[phase_column("flops")] > 0]
    assert len(counted) == 1 and counted.iloc[0]["repeat"] == 0  # FLOPs counted once, whatever the mode
    assert results["flops_per_step"].nunique() == 1


def _case(label="mlp", precision="fp32", batch=4, repeat_id=""):
    from types import SimpleNamespace
    return SimpleNamespace(case_id=f"{label}-bs{batch}-{precision}{repeat_id}", model=SimpleNamespace(label=label),
                           precision=precision)


def _row(wall, window=1.0, wait=0.0, **probes):
    return {"status": "ok", "worker_wall_s": wall, phase_column("window"): window, phase_column("wait"): wait,
            **{phase_column(name): seconds for name, seconds in probes.items()}}


def test_time_left_prices_later_repeats_without_the_first_repeats_probes():
    from amp_bench.studies.time_left import TimeLeft
    fp32, bf16 = _case(), _case(precision="amp_bf16")
    left = TimeLeft([(fp32, 0), (bf16, 0), (fp32, 1), (bf16, 1)])
    assert left.seconds() is None  # nothing measured yet: no guess
    left.finished(fp32, 0, _row(10.0, window=2.0, flops=3.0, profile=1.0))
    # bf16 r0 as the first repeat so far (10 s); fp32 r1 without its probes (10 - 4 = 6 s), and bf16 r1 too
    assert left.seconds() == pytest.approx(10.0 + 6.0 + 6.0)
    left.finished(bf16, 0, _row(9.0, window=1.0, wait=5.0, memory_probe=1.0))  # a lockstep member: 4 s its own
    assert left.seconds() == pytest.approx(6.0 + (4.0 - 1.0))
    left.finished(fp32, 1, _row(6.0))
    left.finished(bf16, 1, _row(3.0))
    assert left.seconds() == 0.0


def test_time_left_caps_the_windows_at_what_is_left_of_the_budget():
    from amp_bench.studies.time_left import TimeLeft
    clock = FakeClock(0.0)
    fp32 = _case()
    left = TimeLeft([(fp32, 0), (fp32, 1), (fp32, 2)], budget_s=30.0, clock=clock)
    clock.now = 25.0
    left.finished(fp32, 0, _row(25.0, window=20.0))
    assert left.seconds() == pytest.approx(2 * 5.0 + 5.0)  # two starts of 5 s, and the 5 s of budget left


def test_the_console_names_the_slowest_workers_and_their_largest_phases():
    import pandas as pd

    from amp_bench.analysis.wall_time import run_lines
    rows = [{"model_label": "resnet50", "batch_size": 8, "image_size": 224, "precision": "fp32", "repeat": 0,
             "worker_wall_s": 30.0, **{phase_column(n): 0.0 for n in WORKER_PHASES},
             phase_column("first_step"): 20.0, phase_column("window"): 8.0, phase_column("build"): 2.0},
            {"model_label": "resnet50", "batch_size": 8, "image_size": 224, "precision": "amp_bf16", "repeat": 0,
             "worker_wall_s": 12.0, **{phase_column(n): 0.0 for n in WORKER_PHASES},
             phase_column("window"): 4.0, phase_column("wait"): 8.0}]
    total, slowest = run_lines(pd.DataFrame(rows))
    assert total.startswith("worker time: 34.0 s in 2 workers (first step 59%, window 35%, build 6%)")
    assert slowest.startswith("slowest: resnet50 bs 8 224px fp32 r0 30.0 s (first step 20.0 s, window 8.0 s, "
                              "build 2.0 s); resnet50 bs 8 224px amp_bf16 r0 4.0 s (window 4.0 s)")
    assert run_lines(pd.DataFrame([{"status": "ok"}])) == []  # rows from before the phases: nothing to say


def test_repeats_that_share_a_worker_are_one_unit_in_the_run_order(write_suite):
    from types import SimpleNamespace

    from amp_bench.studies.run_plan import launch_units, schedule
    from amp_bench.suite import load_suite
    suite = load_suite(write_suite(PHASED_SUITE.format(precisions=["fp32", "amp_bf16"]).replace(
        "repeats: 2", "repeats: 5\nrepeats_per_worker: 3")))
    order = schedule(suite.cases("cpu"))
    assert [(c.precision, r) for c, r in order] == [
        ("fp32", 0), ("fp32", 1), ("fp32", 2), ("amp_bf16", 0), ("amp_bf16", 1), ("amp_bf16", 2),
        ("amp_bf16", 3), ("amp_bf16", 4), ("fp32", 3), ("fp32", 4)]  # the next workers' turn rotates
    machine = SimpleNamespace(device=SimpleNamespace(type="cpu"), server=object())  # where lockstep could run
    units = launch_units([(i, c, r) for i, (c, r) in enumerate(order)], machine)
    assert [[r for _, _, r in unit] for unit in units] == [[0, 1, 2], [0, 1, 2], [3, 4], [3, 4]]


@pytest.mark.slow
def test_repeats_that_share_a_worker_pay_its_fixed_costs_once(write_suite, tmp_path):
    suite = write_suite(PHASED_SUITE.format(precisions=["fp32", "amp_bf16"]).replace(
        "repeats: 2", "repeats: 3\nrepeats_per_worker: 3"))
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results")
    assert set(results.status) == {"ok"} and len(results) == 6
    assert results["log_file"].nunique() == 2  # one worker per mode
    for _, rows in results.groupby("log_file"):
        rows = rows.sort_values("repeat")
        assert list(rows["worker_window"]) == [0, 1, 2] and list(rows["repeat"]) == [0, 1, 2]
        first, later = rows.iloc[0], rows.iloc[1:]
        assert first[phase_column("build")] >= 0.4 and first[phase_column("first_step")] >= 0.5
        for _, row in later.iterrows():  # a later repeat pays its window only
            own = {name: row[phase_column(name)] for name in WORKER_PHASES if name != "window"}
            assert not any(own.values()), own
            assert row[phase_column("window")] >= 4 * 0.030
            assert row["worker_wall_s"] == pytest.approx(row[phase_column("window")], abs=1e-3)
        assert rows[PHASE_COLUMNS].sum().sum() == pytest.approx(rows["worker_wall_s"].sum(), abs=0.05)
    assert results["flops_per_step"].nunique() == 1 and results["flops_per_step"].notna().all()
    from amp_bench.analysis.speedups import paired_speedups
    speedup = paired_speedups(results, "fp32").reset_index()
    method = speedup.loc[speedup["precision"] == "amp_bf16", "speedup_vs_fp32_method"].iloc[0]
    assert method == "paired, trimmed t on log ratios (3 repeats, windows of one worker per mode)"
