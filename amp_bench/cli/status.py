"""`amp_bench status [RESULTS ...]`: where every run stands (complete, running, queued, interrupted),
its cases (ok, failed, planned) and, for a SLURM run, what SLURM says of its jobs. It changes nothing:
`run --resume RUN_DIR` acts on what it shows."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich import box
from rich.markup import escape
from rich.table import Table


def add_parsers(sub) -> None:
    status = sub.add_parser("status", help="where each run stands: complete, running, queued or interrupted "
                                           "(a killed parent, ended SLURM jobs), with its cases and jobs")
    status.add_argument("results", nargs="*", default=["results"], help="run directories, trees of them, or globs "
                        "(default: results)")
    status.set_defaults(func=cmd_status)


def _jobs_line(manifest: dict, state) -> tuple[str, dict]:
    """For a SLURM run: its jobs by SLURM's state ("2 RUNNING, 1 PENDING"), and those states."""
    executor = manifest.get("executor") or {}
    jobs = list(manifest.get("jobs") or {})
    if executor.get("type") != "slurm" or not jobs or state.state == "complete":
        return "", {}
    from amp_bench.executors import job_states
    states = job_states.states(jobs, executor.get("cluster", "slurm"))
    counts = Counter(s.state for s in states.values())
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), states


def cmd_status(args, console) -> int:
    from amp_bench.store.results import find_runs, read_manifest
    from amp_bench.store.run_state import DIED_STATUSES, row_statuses, run_state
    table = Table("run", "kind", "where", "state", "ok", "not run", "failed", "planned", "jobs", "detail",
                  box=box.SIMPLE_HEAD, title="runs", title_justify="left")
    for run_dir in find_runs(args.results):
        manifest = read_manifest(run_dir) or {}
        state = run_state(run_dir, manifest)
        jobs, states = _jobs_line(manifest, state)
        name, detail = state.state, state.detail
        if states and state.state in ("queued", "interrupted", "unknown"):
            # SLURM's word wins over the files: a job still queued, or ended without writing its rows
            active = [s for s in states.values() if s.active]
            ended = [s for s in states.values() if not s.active]
            if active:
                name = "queued" if all(s.queued for s in active) else "running"
                detail = "; ".join(s.describe() for s in active[:3])
            elif ended and state.state != "interrupted":
                name, detail = "interrupted", "; ".join(s.describe() for s in ended[:3])
        statuses = row_statuses(run_dir)
        ok, unsupported = statuses.count("ok"), statuses.count("unsupported")
        failed = len(statuses) - ok - unsupported
        died = sum(s in DIED_STATUSES for s in statuses)
        if name == "complete" and manifest.get("finished_at"):
            detail = f"finished {str(manifest['finished_at'])[:16].replace('T', ' ')} UTC"
        if name == "interrupted":
            detail += f"; `python -m amp_bench run --resume {run_dir}` runs the {died or 'missing'} case(s) left"
        executor = manifest.get("executor") or {}
        where = (f"slurm {executor.get('partition', '')}" if executor.get("type") == "slurm"
                 else (manifest.get("host") or {}).get("hostname", ""))
        planned = manifest.get("cases_planned")
        colour = {"complete": "green", "running": "cyan", "queued": "cyan", "interrupted": "red"}.get(name, "yellow")
        cells = [Path(run_dir).name, str(manifest.get("kind", "")), where, name, str(ok), str(unsupported), str(failed),
                 "-" if planned is None else str(planned), jobs, detail]
        table.add_row(*[escape(c) for c in cells[:3]], f"[{colour}]{name}[/]", *[escape(c) for c in cells[4:]])
    console.print(table)
    return 0
