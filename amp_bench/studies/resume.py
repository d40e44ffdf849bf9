"""`run --resume RUN_DIR` for a local run: the planned cases without a row, or whose job died, run here on the
machine that measured the rest (a SLURM run's resume is studies/cluster.py's)."""
from __future__ import annotations

import pandas as pd

from amp_bench.errors import UserError
from amp_bench.platform.device import DeviceInfo
from amp_bench.store.results import RunStore, utc_now
from amp_bench.store.run_state import RERUN_STATUSES, Heartbeat, run_state
from amp_bench.studies import run_plan as planning
from amp_bench.studies.benchmark import Reporter, finished_counts, results_frame, run_cases
from amp_bench.studies.session import Machine, probe, record_machine, running, server_for


def resume_local(run_dir, reporter: Reporter | None = None) -> pd.DataFrame:
    """`run --resume RUN_DIR` for a local run: run here the planned cases that have no row (the parent
    was killed, or Ctrl-C) or whose row says their job died, on the machine that measured the rest."""
    reporter = reporter or Reporter()
    store = RunStore.reopen(run_dir)
    state = run_state(store.dir, store.manifest)
    if state.state == "running":
        raise UserError(f"{store.dir}: still running ({state.detail}): let it finish, or stop it first")
    plan = store.read_plan()
    rows = planning.rows_by_index(store)
    todo = [i for i, _, _ in planning.plan_order(plan) if i not in rows or rows[i].get("status") in RERUN_STATUSES]
    order = planning.plan_order(plan, todo)
    # the workers start as the run's first ones did (its manifest's `workers`): their peak RSS compares;
    # the server first, so the probe is one of its children rather than an interpreter of its own
    server = server_for((store.manifest.get("workers") or {}).get("mode", "spawn"),
                        [case.model.ref for _, case, _ in order], order[0][1].search_dirs) if order else None
    try:
        machine = _same_machine(store, plan, rows, server)
        reporter.run_started(store, machine.device, len(todo))
        if not todo:
            store.write_manifest(status="complete")
            return results_frame(store)
        store.update_manifest(lambda m: (m.update(status="running"), m.setdefault("resumed", []).append(
            {"at": utc_now().isoformat(), "cases": len(todo)})))
        with running(store, lambda: finished_counts(store)), Heartbeat(store.dir, "parent") as heartbeat:
            run_cases(store, order, machine, reporter, heartbeat=heartbeat)
    finally:
        if server is not None:
            server.close()
    return results_frame(store)


def _same_machine(store: RunStore, plan: dict, rows: dict, server) -> Machine:
    """This machine, probed, recorded, and checked to be the one (and the software) that measured the run."""
    probed = probe(plan["device_request"], server)
    info = DeviceInfo.from_json(probed["device"])
    host, fingerprint = record_machine(store, probed)
    measured = {str(r.get("fingerprint")) for r in rows.values() if r.get("fingerprint")}
    if info.type != plan["device_type"] or (measured and fingerprint["fingerprint"] not in measured):
        raise UserError(f"{store.dir}: was measured on another machine or software (fingerprint "
                        f"{', '.join(sorted(measured)) or plan['device_type']}; here {fingerprint['fingerprint']} "
                        f"on {info.name}): resume it where it ran, or run the suite again here")
    return Machine(info, probed["versions"], host["hostname"], fingerprint, server=server)
