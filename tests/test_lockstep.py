"""Lockstep sets: a repeat's modes measured by workers alive together, taking turns (measure/baton.py,
measure/conductor.py, launchers/lockstep.py, studies/run_plan.launch_units)."""
import itertools
from types import SimpleNamespace

import pytest

import amp_bench
from amp_bench.measure.baton import Baton
from amp_bench.measure.telemetry.contention import WindowWatch
from amp_bench.measure.window import CpuStepTimer, StopRule, measure_window
from amp_bench.studies.run_plan import launch_units
from amp_bench.suite import load_suite


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeBaton:
    """Turns of `turn_s`; while 'the partner' has the baton the clock moves on by `partner_s`."""

    def __init__(self, clock: FakeClock, turn_s: float, partner_s: float):
        self.clock, self.turn_s, self.partner_s = clock, turn_s, partner_s
        self.turn_started, self.passes = clock(), 0

    def turn_over(self):
        return self.clock() - self.turn_started >= self.turn_s

    def pass_turn(self):
        self.passes += 1
        self.clock.now += self.partner_s
        self.turn_started = self.clock()


def test_a_members_window_is_its_own_turns():
    """10 ms steps in 50 ms turns while the partner holds the baton 70 ms each time: the window's seconds
    and the budget the stop rule reads leave the partner's turns out; the steps are untouched."""
    clock = FakeClock()
    baton = FakeBaton(clock, turn_s=0.05, partner_s=0.07)

    def step():
        clock.now += 0.01
    per_step, window_s, reason = measure_window(step, CpuStepTimer(clock), StopRule(min_steps=3, max_steps=100,
                                                                                   budget_s=0.2), baton=baton)
    assert reason == "budget" and len(per_step) == 20
    assert per_step == pytest.approx([10.0] * 20)
    assert window_s == pytest.approx(0.2)
    assert baton.passes == 3  # after steps 5, 10 and 15; none after the last


def test_a_member_counts_its_partners_cpu_as_its_own_side(tmp_path):
    """The host was 2.0 CPU-seconds busier over a one-second window on 2 CPUs; 1.9 of them were the
    partner's (its /proc/PID/stat): not contended. The same readings without the partner: contended."""
    stat = tmp_path / "stat"
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)

    def host(busy_ticks):
        stat.write_text(f"cpu  {busy_ticks} 0 0 100000 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")

    def partner(ticks):  # utime in the 14th field
        (proc / "4242" / "stat").write_text(f"4242 (python3) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0\n")

    found = {}
    for partners in ((4242,), ()):
        clock = FakeClock()
        watch = WindowWatch(2, stat_path=str(stat), loadavg_path=str(tmp_path / "none"), clock=clock,
                            ticks_per_s=100, partners=partners, proc_path=str(proc))
        host(1000)
        partner(500)
        watch.start()
        host(1200)
        partner(690)
        clock.now += 1.0
        found[partners] = watch.stop()
    assert found[(4242,)]["contended"] is False
    assert found[(4242,)]["host_other_cpu_cores"] == pytest.approx(0.1, abs=0.05)
    assert found[()]["contended"] is True


def test_baton_reads_its_partners_then_takes_and_gives_turns():
    import os
    go_read, go_write = os.pipe()
    reply_read, reply_write = os.pipe()
    baton = Baton(go_read, reply_write)
    os.write(go_write, f"{os.getpid()} 4242 4343\n".encode() + b"g")
    baton.take()
    assert baton.partners == [4242, 4343]
    baton.give()
    assert os.read(reply_read, 1) == b"m"
    os.write(go_write, b"g")
    baton.pass_turn()  # gives b"m", then waits for b"g"
    assert os.read(reply_read, 1) == b"m"
    os.close(go_write)
    with pytest.raises(EOFError):
        baton.take()
    for fd in (go_read, reply_read, reply_write):
        os.close(fd)


def _machine(device="cpu", server=True):
    return SimpleNamespace(device=SimpleNamespace(type=device), server=object() if server else None)


def _order(write_suite, extra=""):
    from amp_bench.studies.run_plan import schedule
    suite = load_suite(write_suite(f"""
models: [python:toy_models:mlp]
batch_sizes: [4, 8]
precisions: [fp32, amp_bf16]
repeats: 2
steps: 3
{extra}
"""))
    return [(i, case, repeat) for i, (case, repeat) in enumerate(schedule(suite.cases("cpu")))]


def test_a_repeats_modes_form_one_set_where_lockstep_can_be_had(write_suite):
    order = _order(write_suite)
    units = launch_units(order, _machine())
    assert [[(c.batch_size, c.precision, r) for _, c, r in unit] for unit in units] == [
        [(4, "fp32", 0), (4, "amp_bf16", 0)], [(4, "amp_bf16", 1), (4, "fp32", 1)],
        [(8, "fp32", 0), (8, "amp_bf16", 0)], [(8, "amp_bf16", 1), (8, "fp32", 1)]]
    for machine in (_machine("cuda"), _machine(server=False)):
        assert all(len(unit) == 1 for unit in launch_units(order, machine))
    assert all(len(unit) == 1 for unit in launch_units(_order(write_suite, "interleave: repeats"), _machine()))
    notes = []
    reporter = SimpleNamespace(note=notes.append)
    launch_units(_order(write_suite, "interleave: steps"), _machine("cuda"), reporter)
    assert len(notes) == 1 and "interleave: steps needs" in notes[0]


def _stamps(path):
    rows = [line.split() for line in path.read_text().splitlines()]
    return sorted((float(start), float(end), int(pid)) for pid, start, end in rows)


def test_members_take_turns_and_never_overlap(write_suite, tmp_path):
    """Two repeats of fp32 and amp_bf16 (emulated or not: the toy model is tiny) as lockstep sets: no two
    steps of any worker ever overlap in time, each set's two workers hand over several times, and a
    window's seconds are its own steps (the partner's turns are not in it)."""
    stamps = tmp_path / "stamps.txt"
    suite = write_suite(f"""
models: [{{ref: "python:toy_models:stamped", options: {{path: "{stamps}", ms: 20}}}}]
batch_sizes: [4]
precisions: [fp32, amp_bf16]
allow_emulated: true
explain: false
warmup_steps: 1
steps: 8
repeats: 2
""")
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results")
    assert list(results.status) == ["ok"] * 4 and set(results.interleave) == {"steps"}
    assert (results.window_gap_fraction < 0.25).all()  # ~0.5 if the partner's turns were in the window
    found = _stamps(stamps)
    for (_, end, _), (start, _, _) in itertools.pairwise(found):
        assert start >= end - 1e-4  # one step at a time, across every worker of the run
    pids = [pid for _, _, pid in found]
    assert len(set(pids)) == 4
    handovers = sum(1 for a, b in itertools.pairwise(pids) if a != b)
    assert handovers >= 2 * 4  # each set: warmups, then at least three window turns a side
    from amp_bench.analysis.speedups import summarize
    method = summarize(results).set_index("precision").loc["amp_bf16", "speedup_vs_fp32_method"]
    assert method == "paired, trimmed t on log ratios (2 repeats, in lockstep)"


def test_one_member_dying_leaves_the_other_measured(write_suite, tmp_path):
    suite = write_suite("""
models: [python:toy_models:dies_under_autocast]
batch_sizes: [4]
precisions: [fp32, amp_bf16]
allow_emulated: true
explain: false
warmup_steps: 1
steps: 5
""")
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results").set_index("precision")
    assert results.loc["fp32", "status"] == "ok" and results.loc["fp32", "steps"] == 5
    assert results.loc["amp_bf16", "status"] == "error"
    assert "exited with code 3" in results.loc["amp_bf16", "reason"]
    assert set(results.interleave) == {"steps"}


def test_a_hung_member_is_killed_at_its_own_timeout_and_its_partner_goes_on(write_suite, tmp_path):
    """amp_bf16's first step hangs: the conductor kills it once its own turns outlast timeout_s (the
    parent's deadline for the set is far later), and fp32, its partner, keeps its row."""
    suite = write_suite("""
models: [python:toy_models:hangs_under_autocast]
batch_sizes: [4]
precisions: [fp32, amp_bf16]
allow_emulated: true
explain: false
warmup_steps: 1
steps: 5
timeout_s: 3
""")
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results").set_index("precision")
    assert results.loc["fp32", "status"] == "ok" and results.loc["fp32", "steps"] == 5
    assert results.loc["amp_bf16", "status"] == "timeout"
    assert "timeout_s=3 of its own turns in a lockstep set; killed, its partners went on" in \
        results.loc["amp_bf16", "reason"]
    assert set(results.interleave) == {"steps"}


def _conductor(tmp_path, **fields):
    from amp_bench.launchers.process import WorkerOutcome
    log = tmp_path / "conductor.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: the conductor broke\n")
    return WorkerOutcome(**{"result": None, "exit_code": 1, "timed_out": False, "peak_rss_bytes": None,
                            "wall_s": 1.0, "log_path": log, "started_by": "fork", **fields})


def _member_spec(tmp_path, n):
    (tmp_path / f"m{n}.log").write_text("")
    return {"result": str(tmp_path / f"m{n}.result.json"), "log": str(tmp_path / f"m{n}.log"), "timeout_s": 60}


def test_members_the_conductor_never_reaped_take_its_ending(tmp_path):
    """A conductor that died says so in its members' rows (its reason, its log); a member it had
    reaped keeps its own exit even when the set was then stopped as contended."""
    from amp_bench.launchers.lockstep import _member_outcome, _set_ending
    died = _conductor(tmp_path)
    found = _member_outcome(died, None, _member_spec(tmp_path, 0), 0.0, _set_ending(died, "g-r0-lockstep", 150, 2))
    assert found.result["status"] == "error"
    assert found.result["reason"] == ("the lockstep set's conductor failed: conductor exited with code 1 without a "
                                      "result: RuntimeError: the conductor broke (logs/g-r0-lockstep.log)")
    hung = _conductor(tmp_path, exit_code=-9, timed_out=True)
    found = _member_outcome(hung, None, _member_spec(tmp_path, 0), 0.0, _set_ending(hung, "g-r0-lockstep", 150, 2))
    assert found.result["status"] == "timeout" and "deadline (150 s" in found.result["reason"]
    stopped = _conductor(tmp_path, exit_code=-9, contention="3 other processes used 1.9 of 2 cores for 4 s")
    ending = _set_ending(stopped, "g-r0-lockstep", 150, 2)
    crashed = _member_outcome(stopped, {"pid": 1, "exit_code": 3, "timed_out": False}, _member_spec(tmp_path, 0),
                              0.0, ending)
    running = _member_outcome(stopped, None, _member_spec(tmp_path, 1), 0.0, ending)
    assert crashed.result is None and crashed.exit_code == 3 and crashed.contention == ""
    assert running.result is None and running.contention.startswith("3 other processes")


def test_a_stop_during_a_set_cuts_short_every_member_and_keeps_saved_rows(write_suite, tmp_path, monkeypatch):
    """A job's stop arrives while the second lockstep set runs: the first set's rows stay as measured,
    both members of the second say the stop came while they ran, the rest that it came before."""
    import signal

    from amp_bench.executors.job_env import StopSignals
    from amp_bench.launchers.launch import base_row
    from amp_bench.platform.device import DeviceInfo
    from amp_bench.store.results import RunStore
    from amp_bench.studies import benchmark
    from amp_bench.studies.session import Machine
    order = _order(write_suite, "allow_emulated: true\nexplain: false")
    stop, sets = StopSignals(None), []

    def fake_lockstep(members, device, versions, store, supports, **_):
        sets.append(members)
        if len(sets) == 2:
            stop.signum = signal.SIGTERM
            raise KeyboardInterrupt
        return [(base_row(case, repeat, device, versions, store.run_id).put("the worker", {"status": "ok"}), [])
                for case, repeat, _ in members]
    monkeypatch.setattr(benchmark, "run_lockstep", fake_lockstep)
    store = RunStore(tmp_path, "20261203T000000Z-host-cpu")
    machine = Machine(DeviceInfo(type="cpu", name="cpu"), {}, "host", {}, server=object())
    benchmark.run_cases(store, order, machine, benchmark.Reporter(), stop=stop)
    reasons = {(r["batch_size"], r["precision"], r["repeat"]): (r["status"], r.get("reason") or "")
               for r in store.rows}
    assert len(reasons) == 8 and len(sets) == 2
    assert reasons[(4, "fp32", 0)] == ("ok", "") and reasons[(4, "amp_bf16", 0)] == ("ok", "")
    for key in [(4, "fp32", 1), (4, "amp_bf16", 1)]:
        assert reasons[key][0] == "cancelled" and reasons[key][1].endswith("while this case ran")
    for key in [(8, "fp32", 0), (8, "amp_bf16", 0), (8, "fp32", 1), (8, "amp_bf16", 1)]:
        assert reasons[key][1].endswith("before this case started")


def test_a_refusing_conductor_has_its_members_run_one_after_another(write_suite, tmp_path, monkeypatch):
    """A conductor that may not fork (CUDA initialised in it) refuses: each member then runs alone, in
    order, and its row says why and that it ran one worker after another."""
    from amp_bench.launchers import lockstep
    from amp_bench.launchers.process import WorkerOutcome
    from amp_bench.platform.device import DeviceInfo, Support
    from amp_bench.store.columns import Row
    from amp_bench.store.results import RunStore
    order = _order(write_suite, "allow_emulated: true\nexplain: false")
    refused = WorkerOutcome({"status": "refused", "reason": "lockstep set not conducted: an import initialised CUDA"},
                            0, False, None, 0.1, tmp_path / "c.log", "fork")
    monkeypatch.setattr(lockstep.launch, "run_job", lambda *args, **kwargs: refused)
    alone = []
    monkeypatch.setattr(lockstep.launch, "run_one", lambda case, repeat, *args, stem, **kwargs: (
        alone.append(stem) or (Row("the worker", {"status": "ok", "precision": case.precision}), [])))
    store = RunStore(tmp_path, "20261203T000000Z-host-cpu")
    members = [(case, repeat, f"{case.case_id}-r{repeat}") for _, case, repeat in order[:2]]
    rows = lockstep.run_lockstep(members, DeviceInfo(type="cpu", name="cpu"), {}, store,
                                 [Support(True)] * 2)
    assert alone == [stem for _, _, stem in members]
    assert [row["interleave"] for row, _ in rows] == ["repeats", "repeats"]
    assert all(row["warnings"] == "lockstep set not conducted: an import initialised CUDA; run alone"
               for row, _ in rows)


def test_the_run_table_says_how_its_pairs_ran():
    import pandas as pd

    from amp_bench.cli.console import lockstep_note
    lockstep = "paired, trimmed t on log ratios (6 repeats, in lockstep)"
    alone = "paired, trimmed t on log ratios (6 repeats)"
    assert lockstep_note(pd.Series(["the baseline itself", lockstep, lockstep])) == " (in lockstep)"
    assert lockstep_note(pd.Series(["the baseline itself", lockstep, alone])) == " (some in lockstep)"
    assert lockstep_note(pd.Series(["the baseline itself", alone, None])) == ""
    assert lockstep_note(None) == ""


def test_a_pair_is_in_lockstep_only_when_both_its_rows_are():
    import pandas as pd

    from amp_bench.analysis.speedups import paired_speedups
    rows = []
    for repeat in range(3):
        for precision, ms in (("fp32", 100.0), ("amp_bf16", 60.0)):
            rows.append({"run_id": "r", "group_id": "g", "model": "m", "batch_size": 8, "precision": precision,
                         "repeat": repeat, "step_time_ms_median": ms + repeat, "interleave": "steps"})
    frame = pd.DataFrame(rows)
    from amp_bench.analysis.speedups import group_keys
    for key in group_keys():
        frame[key] = frame.get(key, "x")
    method = lambda f: paired_speedups(f, "fp32")["speedup_vs_fp32_method"].dropna().tolist()
    assert "paired, trimmed t on log ratios (3 repeats, in lockstep)" in method(frame)
    frame.loc[(frame.precision == "fp32") & (frame.repeat == 1), "interleave"] = "repeats"
    assert "paired, trimmed t on log ratios (3 repeats)" in method(frame)
