"""The rows of planned cases no worker measured: cut short or never started by a job's stop, or not run while
the machine stayed busy. Torch-free."""
from __future__ import annotations

from amp_bench.launchers.launch import BUSY_LOOK_S, base_row
from amp_bench.store.results import RunStore
from amp_bench.store.row import Row
from amp_bench.studies.run_plan import part_key
from amp_bench.studies.session import Machine

RUN_LOOP = "the run loop"  # the writer of what its rows say of why no worker measured them


def save_busy(store: RunStore, item, machine: Machine, reporter, evidence: str, streak: int) -> Row:
    """The row of a case not run because the machine was still busy after `streak` contended cases."""
    text = (f"not run: the machine was still busy ({evidence} over {BUSY_LOOK_S:g} s, after {streak} contended "
            "cases in a row)")
    row = save_unrun(store, item, machine, status="contended", reason=text, contended=True, contention=text)
    reporter.case_finished(item[1], row)
    return row


def save_died(store: RunStore, rest, machine: Machine, stop, running: set = frozenset()) -> None:
    """Rows for the cases a stop cut short (their plan indexes in `running`: a lockstep set's members
    run together) and for those it never started."""
    status, reason = stop.status_and_reason()
    for item in rest:
        before = "while this case ran" if item[0] in running else "before this case started"
        save_unrun(store, item, machine, status=status, reason=f"{reason} {before}")


def save_unrun(store: RunStore, item, machine: Machine, **columns) -> Row:
    """A planned case's row without a worker's result (stopped, died, not run): its identity, the
    machine's columns and `columns`, saved under its plan key."""
    index, case, repeat = item
    row = machine.stamp(base_row(case, repeat, machine.device, machine.versions, store.run_id).put(RUN_LOOP, columns))
    store.add(row, [], key=part_key(index, case, repeat))
    return row
