"""Contention that ends a case early (amp_bench/launchers/busy.py), on /proc readings recorded on a 2-core
VM (tests/fixtures/contention_readings.json: a 2-thread torch worker alone for 3 s, then beside three
`python3 -c 'while True: pass'`), replayed through a fake clock; and what a stopped case becomes."""
import itertools
import json
from pathlib import Path

import pytest

from amp_bench.launchers import busy
from amp_bench.launchers.busy import ContentionWatch, Snapshot
from conftest import FIXTURES

RECORDED = json.loads((FIXTURES / "contention_readings.json").read_text())


def _snapshots(readings):
    return [Snapshot(r["at"], r["busy_s"], r["steal_s"], r["cpus"],
                     {int(pid): tuple(v) for pid, v in r["processes"].items()}) for r in readings]


def _replay(readings, needed=2):
    """Tick a watch through the readings; (the time it said stop, or None; its evidence)."""
    snaps = iter(_snapshots(readings))
    now = {"t": readings[0]["at"]}
    watch = ContentionWatch(RECORDED["worker_pid"], needed, read=lambda: next(snaps, None),
                            clock=lambda: now["t"])
    for reading in readings:
        now["t"] = reading["at"]
        watch.next_tick = 0.0  # one check per recorded reading
        evidence = watch.check()
        if evidence:
            return reading["at"], evidence
    return None, ""


def test_a_worker_alone_is_never_stopped():
    quiet = [r for r in RECORDED["readings"] if r["at"] <= 3.0]
    assert _replay(quiet) == (None, "")


def test_three_busy_neighbours_stop_the_case_once_they_held_it_for_three_seconds_with_the_evidence():
    stopped_at, evidence = _replay(RECORDED["readings"])
    started = next(r["at"] for r in RECORDED["readings"] if str(RECORDED["spinners"][0]) in r["processes"])
    # three one-second spans each contended: about 3 s (readings every 0.5 s: 2.5-3.5 s) after they started
    assert stopped_at is not None and 2.4 <= stopped_at - started <= 4.0, (stopped_at, started)
    assert evidence.startswith("3 other processes (python x3) used 1.") or \
        evidence.startswith("3 other processes (python3 x3) used 1."), evidence
    assert "of 2 cores for 3." in evidence and "could have had" in evidence and "stopped early" in evidence


def test_a_burst_shorter_than_the_hold_passes():
    """The three neighbours for the first ~2 s of their run only: then the worker has its cores back."""
    readings = RECORDED["readings"]
    spin = next(i for i, r in enumerate(readings) if str(RECORDED["spinners"][0]) in r["processes"])
    burst = readings[:spin + 4]
    # after the burst, replay the quiet stretch's increments again: the worker alone
    quiet = readings[1:6]
    for before, after in itertools.pairwise(quiet):
        last = burst[-1]
        step = {k: after[k] - before[k] for k in ("at", "busy_s", "steal_s")}
        mine = after["processes"][str(RECORDED["worker_pid"])][1] - before["processes"][str(RECORDED["worker_pid"])][1]
        procs = dict(last["processes"])
        w = str(RECORDED["worker_pid"])
        procs[w] = [procs[w][0], procs[w][1] + mine, procs[w][2]]
        burst.append({**last, **{k: last[k] + step[k] for k in step}, "processes": procs})
    assert _replay(burst)[0] is None


def test_a_gpu_case_needs_one_host_core_so_the_same_neighbours_on_a_16_core_host_leave_it_be():
    """The same neighbours' 1.2 cores on a 16-core GPU host: a GPU step needs one host core, and 14.8 are
    free. (On the 2-core VM itself, one core is not free: a GPU worker there would be stopped too.)"""
    host = [{**r, "cpus": 16} for r in RECORDED["readings"]]
    assert _replay(host, needed=1)[0] is None
    assert _replay(RECORDED["readings"], needed=1)[0] is not None
    assert busy.cores_needed("cuda", 16, 2) == 2 and busy.cores_needed("cpu", 2, 1) == 2


def test_the_watch_stops_at_the_end_of_the_measured_window():
    """One last reading as the window ends (it closes the span a short worker is judged over), none after."""
    reads = []
    watch = ContentionWatch(1, 2, read=lambda: reads.append(1), clock=lambda: 100.0)
    watch.on_event({"event": "phase", "phase": "after"})
    assert watch.check() == "" and len(reads) == 1
    watch.on_event({"event": "phase", "phase": "after"})
    assert watch.check() == "" and len(reads) == 1


class _StarvedOnce:
    """Stands in for the watch: the first case it watches is 'starved' half a second in; later ones never."""
    watched = 0

    def __init__(self, pid, needed):
        type(self).watched += 1
        self.first = type(self).watched == 1
        self.ticks = 0

    def on_event(self, event):
        pass

    def lifetime(self):
        return ""

    def check(self):
        self.ticks += 1
        return "3 other processes (python3 x3) used 1.50 of 2 cores for 3.0 s: stopped early" \
            if self.first and self.ticks >= 2 else ""


SLOW_SUITE = """
models: [{ref: "python:toy_models:sleepy", label: slow, options: {ms: 300, judged: false}}]
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 1
steps: 4
timeout_s: 60
explain: false
"""


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False])
def test_a_starved_case_is_saved_as_contended_then_run_again_if_the_machine_is_quiet(write_suite, tmp_path,
                                                                                    monkeypatch, quiet):
    import amp_bench
    from amp_bench.launchers import launch
    monkeypatch.setenv("AMP_BENCH_ON_CONTENTION", "stop")
    monkeypatch.setattr(_StarvedOnce, "watched", 0)
    monkeypatch.setattr(launch, "ContentionWatch", _StarvedOnce)
    monkeypatch.setattr(busy, "quiet_now", lambda needed, **kw: (quiet, "other processes used 0.05 of 2 cores"
                                                                 if quiet else "other processes used 1.70 of 2 cores"))
    results = amp_bench.run_suite(write_suite(SLOW_SUITE), device="cpu", results_dir=tmp_path / "results")
    row = results.iloc[0]
    manifest = json.loads((Path(results.attrs["run_dir"]) / "manifest.json").read_text())
    if quiet:
        assert row["status"] == "ok" and "its pair's first run was disturbed" in row["warnings"]
        assert row["rerun_reason"].startswith("contended: 3 other processes")  # what the replaced row said
        assert "contended_not_retried" not in manifest
    else:
        assert row["status"] == "contended" and bool(row["contended"])
        assert row["reason"].startswith("3 other processes") and row["contention"] == row["reason"]
        assert manifest["contended_not_retried"] == "1 pair(s): other processes used 1.70 of 2 cores"
    assert len(results) == 1  # the retry replaced the stopped row


def test_a_worker_too_short_to_stop_is_judged_over_its_life():
    """Two seconds beside the three neighbours: under the three-second hold, so not stopped, but its
    whole life was starved: the row is marked contended (a few-step window is too short for its own check)."""
    readings = RECORDED["readings"]
    spin = next(i for i, r in enumerate(readings) if str(RECORDED["spinners"][0]) in r["processes"])
    short = readings[spin:spin + 5]
    snaps = iter(_snapshots(short))
    now = {"t": short[0]["at"]}
    watch = ContentionWatch(RECORDED["worker_pid"], 2, read=lambda: next(snaps, None), clock=lambda: now["t"])
    for reading in short:
        now["t"] = reading["at"]
        watch.next_tick = 0.0
        assert watch.check() == ""
    evidence = watch.lifetime()
    assert evidence.startswith("3 other processes") and evidence.endswith("over the worker's life")
    # a worker whose window ended before a second tick: the window's end is the span's other reading
    snaps = iter(_snapshots([short[0], short[2]]))
    now["t"] = short[0]["at"]
    watch = ContentionWatch(RECORDED["worker_pid"], 2, read=lambda: next(snaps, None), clock=lambda: now["t"])
    assert watch.check() == "" and watch.lifetime() == ""  # one reading: nothing to judge yet
    watch.on_event({"event": "phase", "phase": "after"})
    assert watch.lifetime().endswith("over the worker's life") and watch.check() == ""
    quiet = [r for r in RECORDED["readings"] if r["at"] <= 2.5]
    snaps = iter(_snapshots(quiet))
    watch = ContentionWatch(RECORDED["worker_pid"], 2, read=lambda: next(snaps, None), clock=lambda: now["t"])
    for reading in quiet:
        now["t"] = reading["at"]
        watch.next_tick = 0.0
        watch.check()
    assert watch.lifetime() == ""


class _AlwaysStarved(_StarvedOnce):
    """Every case it watches is 'starved' (a machine that stays busy)."""

    def __init__(self, pid, needed):
        super().__init__(pid, needed)
        self.first = True


@pytest.mark.slow
@pytest.mark.parametrize("quiet_after", [False, True])
def test_a_machine_that_stays_busy_is_asked_before_each_case_after_a_streak(write_suite, tmp_path, monkeypatch,
                                                                            quiet_after):
    """Four cases stopped as contended in a row: each next case first reads half a second of /proc/stat and,
    while the machine is still busy, is saved as contended without a worker (the busy smoke must end within 4 minutes);
    once it is quiet, cases run again."""
    import amp_bench
    from amp_bench.launchers import launch
    from amp_bench.studies import benchmark
    monkeypatch.setenv("AMP_BENCH_ON_CONTENTION", "stop")
    monkeypatch.setattr(_StarvedOnce, "watched", 0)
    monkeypatch.setattr(launch, "ContentionWatch", _StarvedOnce if quiet_after else _AlwaysStarved)
    asked = []

    def quiet_now(needed, seconds=2.0, **kw):
        asked.append(seconds)
        return quiet_after, "other processes used 1.70 of 2 cores"
    monkeypatch.setattr(busy, "quiet_now", quiet_now)
    if quiet_after:  # the streak was earlier: start the run as if four cases had just been contended
        monkeypatch.setattr(benchmark, "BUSY_STREAK", 0)
    suite = write_suite(SLOW_SUITE.replace("steps: 4", "steps: 2\nrepeats: 6").replace("ms: 300", "ms: 50"))
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results").sort_values("repeat")
    if quiet_after:
        assert asked == [0.5] * 6 + [2.0]  # before every case, quiet each time; then the end's retry
        assert list(results["status"]) == ["ok"] * 6  # the one starved case ran again at the end
        assert results["warnings"].str.contains("its pair's first run was disturbed").sum() == 1
        return
    assert _AlwaysStarved.watched == 4 and list(results["status"]) == ["contended"] * 6
    skipped = results[results["reason"].str.startswith("not run: the machine was still busy")]
    assert list(skipped["repeat"]) == [4, 5] and skipped["contention"].equals(skipped["reason"])
    reason = skipped["reason"].iloc[0]
    assert "other processes used 1.70 of 2 cores over 0.5 s, after 4 contended cases in a row" in reason
    assert asked == [0.5, 0.5, 2.0]  # half a second before each skipped case; the end's retry asked for two
