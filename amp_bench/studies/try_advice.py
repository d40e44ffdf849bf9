"""`run --try ADVICE RUN_DIR`: an advice item checked by measuring it. For every case of RUN_DIR whose
profiled step the item applies to (analysis/advice), the case and its variant (the item applied: channels_last,
the fused optimizer, a doubled batch, a padded vocabulary) run side by side in a new run directory, paired and
interleaved as a run's modes are (a lockstep set on the CPU, one after the other elsewhere), each repeat one
pair; the measured gain is the paired throughput ratio's trimmed mean with its 95% interval, beside the
prediction. Every item tried is a row of the new run's `advice` table: the rule, the predicted and measured
gains with their intervals, the error, how it was predicted. docs/advice.md publishes the scores."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from amp_bench.analysis.advice import Advice, assess, from_row
from amp_bench.analysis.intervals import paired_log_interval
from amp_bench.analysis.speedups import MIN_CLEAN_PAIRS
from amp_bench.errors import UserError
from amp_bench.store.flags import true_rows
from amp_bench.store.results import load_results, read_manifest
from amp_bench.suite import Case

ADVICE_TABLE = "advice"  # its columns and their kinds: store/columns.py


@dataclass
class Trial:
    advice: Advice
    original: Case
    variant: Case


def variant_case(case: Case, variant: dict) -> Case:
    """The case with an advice item's `variant` (the case fields it changes) applied; the variant names it,
    so its rows are a case of their own."""
    change = dict(variant)
    name = ",".join(f"{k}={v}" for k, v in sorted(change.items()))
    fields: dict = {"variant": name}
    if "optimizer_impl" in change:
        fields["optimizer"] = dataclasses.replace(case.optimizer, impl=change.pop("optimizer_impl"))
    if "pad_vocab_to_multiple_of" in change:
        pad = change.pop("pad_vocab_to_multiple_of")
        fields["model"] = dataclasses.replace(case.model, pad_vocab_to_multiple_of=pad)
    return dataclasses.replace(case, **fields, **change)


def trials(run_dir: Path, rule: str) -> list[Trial]:
    """Each (case, item) of RUN_DIR that `rule` names (or every rule: "all") and that has a variant to try, from
    its first repeat's profiled step, whatever its verdict (advice, uncertain or expected slower: each is a
    prediction to check); the cases as its plan ran them."""
    rows = load_results(run_dir)
    plan = {f"{case.suite}/{case.case_id}": case for case in plan_cases(run_dir)}
    found, seen = [], []
    for row in rows[(rows["status"] == "ok") & (rows["repeat"] == 0)].to_dict("records"):
        for advice in assess(from_row(row, run_dir)):
            seen.append(advice.rule)
            case = plan.get(f"{row['suite']}/{row['case_id']}")
            if advice.variant and case is not None and rule in (advice.rule, "all"):
                found.append(Trial(advice, case, variant_case(case, advice.variant)))
    if not found:
        said = f"advice found: {', '.join(sorted(set(seen)))}" if seen else "no advice applies to its cases"
        raise UserError(f"{run_dir}: nothing to try for {rule!r} ({said}; the run's `advice:` lines and its "
                        "report list what applies)")
    return found


def _plan(run_dir: Path) -> dict:
    import json
    path = Path(run_dir) / "plan.json"
    if not path.is_file() or read_manifest(run_dir) is None:
        raise UserError(f"{run_dir}: not a run directory with a plan (plan.json)")
    return json.loads(path.read_text(encoding="utf-8"))


def plan_cases(run_dir: Path) -> list[Case]:
    """The cases of RUN_DIR as its plan ran them (plan.json)."""
    return [Case.from_json(item["case"]) for item in _plan(run_dir)["items"]]


def order(found: list[Trial], repeats: int) -> tuple[list[tuple[Case, int]], list[int]]:
    """The try run's order and the sizes of its sets: per original case and repeat, the case and every variant of
    it tried (one original serves all its items' pairs), which goes first rotating as a run's modes do."""
    by_case: dict[str, list[Case]] = {}
    for trial in found:
        by_case.setdefault(trial.original.case_id, [trial.original]).append(trial.variant)
    out, sizes = [], []
    for cases in by_case.values():
        for repeat in range(repeats):
            shift = repeat % len(cases)
            # throughput is what is compared: no probe after the window (FLOPs, phase memory, the profile)
            out.extend((dataclasses.replace(case, repeats=repeats, explain=False, instrument=False, count_flops=False),
                        repeat) for case in cases[shift:] + cases[:shift])
            sizes.append(len(cases))
    return out, sizes


def _pair_logs(ok: pd.DataFrame, trial: Trial) -> tuple[pd.Series, bool]:
    """The trial's per-pair log throughput ratios (variant over original), from the pairs neither side of which
    ran contended while MIN_CLEAN_PAIRS such remain (else every pair: said as contended), as a run's speedups."""
    sides = [ok[ok["case_id"] == case.case_id].set_index("repeat") for case in (trial.original, trial.variant)]
    logs = np.log((sides[1]["throughput"] / sides[0]["throughput"]).dropna())
    busy = (true_rows(sides[0]["contended"]).reindex(logs.index, fill_value=False)
            | true_rows(sides[1]["contended"]).reindex(logs.index, fill_value=False))
    clean = logs[~busy]
    return (clean, False) if len(clean) >= MIN_CLEAN_PAIRS else (logs, bool(busy.any()))


def score(results: pd.DataFrame, found: list[Trial], tried_run: str) -> list[dict]:
    """The advice table's rows: each trial's predicted gain beside the paired measured one."""
    ok = results[results["status"] == "ok"]
    rows = []
    for trial in found:
        logs, contended = _pair_logs(ok, trial)
        interval = paired_log_interval(logs) if len(logs) >= 2 else None  # one pair: a figure, no interval
        point, low, high = interval if interval else (float(np.exp(logs.mean())) if len(logs) else None, None, None)
        a = trial.advice
        rows.append({"run_id": results["run_id"].iloc[0] if len(results) else "", "tried_run": tried_run,
                     "rule": a.rule, "case_id": trial.original.case_id, "variant_case_id": trial.variant.case_id,
                     "precision": trial.original.precision, "device_name": results["device_name"].iloc[0],
                     "change": a.change, "predicted_speedup": a.speedup, "predicted_low": a.step_ms / a.high_ms,
                     "predicted_high": a.step_ms / a.low_ms, "verdict": a.verdict, "measured_speedup": point,
                     "measured_low": low, "measured_high": high, "pairs": len(logs), "contended": contended,
                     "error": a.speedup / point - 1 if point else None, "evidence": a.evidence, "how": a.how,
                     "source": a.source})
    return rows


def set_units(indexed: list[tuple], sizes: list[int], machine) -> list[list[tuple]]:
    """Each original's set of one repeat (the case and its variants) as one launch: a lockstep set where all may
    take turns (the CPU, eager, forked), else one after the other."""
    from amp_bench.studies.run_plan import in_lockstep
    units, start = [], 0
    for size in sizes:
        members = indexed[start:start + size]
        start += size
        together = size > 1 and all(in_lockstep(case, machine) for _, case, _ in members)
        units.extend([members] if together else [[member] for member in members])
    return units


def run_trials(run_dir, rule: str, *, repeats: int | None = None, results_dir="results", reporter=None,
               on_contention: str | None = None):
    """Try `rule` (an advice rule's name, or "all") on RUN_DIR's cases: the new run's rows (their `advice`
    attribute: the advice table's rows). `on_contention` replaces the cases' own (--on-contention)."""
    from amp_bench.store.run_state import Heartbeat
    from amp_bench.studies.benchmark import Reporter, finished_counts, results_frame, run_cases
    from amp_bench.studies.run_plan import make_plan
    from amp_bench.studies.session import Machine, Session, workers_record
    run_dir, reporter = Path(run_dir), reporter or Reporter()
    found = trials(run_dir, rule)
    request = _plan(run_dir).get("device_request", "auto")
    # the suite where it was: its folder is where a python: model's module is found (the run keeps a copy)
    original = Path(((read_manifest(run_dir) or {}).get("suite") or {}).get("path") or "")
    session = Session.start(original if original.is_file() else run_dir / "suite.yaml", request)
    planned, sizes = order(found, repeats or max(2, found[0].original.repeats))
    if on_contention:
        planned = [(dataclasses.replace(case, on_contention=on_contention), repeat) for case, repeat in planned]
    store = session.open_store(results_dir, {}, kind="try", tried_run=run_dir.name, rule=rule,
                               cases_planned=len(planned), executor={"type": "local"},
                               workers=workers_record(session.server))
    store.write_plan(make_plan(planned, session.device.type, request))
    reporter.run_started(store, session.device, len(planned))
    machine = Machine(session.device, session.versions, session.host["hostname"], session.fingerprint,
                      server=session.server)
    indexed = [(i, case, repeat) for i, (case, repeat) in enumerate(planned)]
    with session.running(lambda: finished_counts(store)), Heartbeat(store.dir, "parent") as heartbeat:
        run_cases(store, indexed, machine, reporter, heartbeat=heartbeat, units=set_units(indexed, sizes, machine))
    results = results_frame(store)
    scored = score(results, found, run_dir.name)
    store.write_table(ADVICE_TABLE, scored)
    results.attrs["advice"] = scored
    return results
