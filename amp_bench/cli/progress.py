"""The progress reporters the command line draws with rich: a run's (per case and step), a cluster run's (its
SLURM jobs), the fidelity study's and the headroom search's. Each subclasses its study's progress base, which
loads pandas and the study machinery, so cli/console.py imports this module only when a command reports."""
from __future__ import annotations

from rich import box
from rich.markup import escape
from rich.table import Table

from amp_bench.cli.formats import _fmt, _fmt_bytes
from amp_bench.platform.provenance import tf32_override_notes
from amp_bench.store.flags import peak_memory, text
from amp_bench.studies.benchmark import Reporter
from amp_bench.studies.cluster import ClusterReporter
from amp_bench.studies.fidelity.orchestration import FidelityReporter
from amp_bench.studies.headroom_search import HeadroomReporter


def _fmt_duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '1 h 05 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def case_line(case, row: dict, said: set) -> str:
    """A finished case in one line: its figures when ok, else its status and why; a case the hardware
    cannot run says its reason the first time only ('' after that: one line per reason a run)."""
    status = row.get("status")
    if status == "unsupported":
        key = (row.get("precision"), row.get("reason"))
        if key in said:
            return ""
        said.add(key)
    colour = {"ok": "green", "unsupported": "dim", "nonfinite": "yellow", "contended": "yellow"}.get(status, "red")
    if status == "ok":
        detail = (f"{_fmt(row.get('step_time_ms_median'), '.1f', ' ms/step')}  "
                  f"{_fmt(row.get('throughput'), '.1f', ' samples/s')}  "
                  f"cv {_fmt(row.get('step_time_cv'), '.1%')}  peak {_fmt_bytes(peak_memory(row))}")
        if row.get("scaler_skipped_steps"):
            detail += f"  scaler skipped {row['scaler_skipped_steps']}"
    else:
        detail = escape(str(row.get("reason", "")))
        if status == "unsupported":
            detail += " [dim](every repeat)[/]"
    return f"[{colour}]{status:>11}[/] {escape(case.case_id)} r{row.get('repeat')}  {detail}"


class RichReporter(Reporter):
    """The run's reporter: progress per case and per step, a line per finished case, warnings pyperf-style."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.run_task = None
        self.case_task = None
        self.said: set = set()  # the not-run reasons already printed: each once per run

    def run_started(self, store, device, total):
        self.console.print(f"[bold]device[/]: {device.name} ({device.architecture})   "
                           f"[bold]results[/]: {store.dir}")
        if device.type == "cuda":
            for note in tf32_override_notes():
                self.console.print(f"[yellow]note[/]: {escape(note)}", highlight=False, soft_wrap=True)
        self.progress.start()
        self.run_task = self.progress.add_task("cases", total=total)

    def case_started(self, case, repeat, index, total):
        label = f"{case.case_id} r{repeat}"
        if self.case_task is not None:
            self.progress.remove_task(self.case_task)
        self.case_task = self.progress.add_task(f"  {label}: starting", total=case.warmup_steps + case.steps)

    def worker_event(self, case, event):
        if event.get("event") == "phase":
            self.progress.update(self.case_task, description=f"  {case.case_id}: {event['phase']}")
        elif event.get("event") == "step":
            self.progress.update(self.case_task, completed=event["step"] + 1)

    def case_finished(self, case, row):
        self.progress.advance(self.run_task)
        line = case_line(case, row, self.said)
        if line:
            self.console.print(line, highlight=False)
        for warning in filter(None, text(row.get("warnings")).split(" | ")):
            self.console.print(f"            [yellow]warning:[/] {escape(warning)}", highlight=False)

    def time_left(self, seconds):
        if seconds is not None and self.run_task is not None:
            self.progress.update(self.run_task, description=f"cases (~{_fmt_duration(seconds)} left)")

    def note(self, text):
        self.console.print(f"[yellow]note[/]: {escape(text)}", highlight=False, soft_wrap=True)

    def close(self):
        self.progress.stop()


class RichClusterReporter(ClusterReporter):
    """A cluster run's progress: per partition, its jobs (queued, running, ended) and its cases (ok,
    failed, of planned). A terminal gets a live table; a log gets a line whenever a figure changes."""

    def __init__(self, console):
        self.console, self.live, self.last = console, None, {}

    def submitted(self, run, spec, device_type, time_min, gpus):
        where = f"{len(run.job_ids)} job(s) {', '.join(run.job_ids[:4])}{' ...' if len(run.job_ids) > 4 else ''}"
        self.console.print(f"[bold]{escape(run.partition)}[/]: {run.planned} cases for {device_type}, {where} "
                           f"({time_min} min, {gpus} GPU(s) each) -> {escape(str(run.store.dir))}",
                           highlight=False, soft_wrap=True)

    def _table(self, runs, states):
        table = Table("partition", "queued", "running", "ended", "ok", "not run", "failed", "planned", "jobs",
                      box=box.SIMPLE_HEAD, title="SLURM jobs", title_justify="left")
        lines = {}
        for run in runs:
            mine = [states[j] for j in run.job_ids if j in states]
            queued = sum(s.queued for s in mine)
            running = sum(s.active and not s.queued for s in mine)
            ended = len(mine) - queued - running
            counts = run.counts()
            words = sorted({s.state for s in mine})
            cells = [run.partition, str(queued), str(running), str(ended), str(counts["ok"]),
                     str(counts["unsupported"]), str(counts["failed"]), str(counts["planned"]), ", ".join(words)]
            lines[run.partition] = cells
            table.add_row(*map(escape, cells))
        return table, lines

    def progress(self, runs, states):
        table, lines = self._table(runs, states)
        if self.console.is_terminal:
            from rich.live import Live
            if self.live is None:
                self.live = Live(table, console=self.console, refresh_per_second=2, transient=False)
                self.live.start()
            self.live.update(table)
            return
        for partition, cells in lines.items():  # a log: a line when something changed
            if self.last.get(partition) != cells:
                self.last[partition] = cells
                self.console.print(f"{partition}: jobs queued {cells[1]}, running {cells[2]}, ended {cells[3]}; "
                                   f"cases ok {cells[4]}, not run {cells[5]}, failed {cells[6]} of {cells[7]} "
                                   f"({cells[8]})", highlight=False, soft_wrap=True)

    def cancelling(self, job_ids):
        self.close()
        self.console.print(f"[yellow]cancelling[/] {len(job_ids)} SLURM job(s): {', '.join(job_ids)} "
                           "(they write rows for their cases before they end)", highlight=False, soft_wrap=True)

    def close(self):
        if self.live is not None:
            self.live.stop()
            self.live = None


class FidelityProgress(FidelityReporter):
    """The fidelity study's reporter: the plan, then a line per precision and seed."""

    def __init__(self, console):
        self.console = console

    def started(self, store, device, spec):
        self.console.print(f"[bold]fidelity[/]: {spec.model} on {spec.dataset}, {spec.epochs} epochs x "
                           f"{len(spec.seeds)} seed(s), batch {spec.batch_size}, on {device.name}   "
                           f"[bold]results[/]: {store.dir}", highlight=False, soft_wrap=True)

    def precision_finished(self, precision, rows):
        if rows and len({(r.get("status"), r.get("reason")) for r in rows}) == 1 and rows[0].get("status") != "ok":
            seeds = ", ".join(str(r["seed"]) for r in rows)  # alike for every seed: say it once
            self.console.print(f"{rows[0]['status']:>11} {precision} (seeds {seeds})  "
                               f"{escape(str(rows[0].get('reason')))}", highlight=False)
            return
        for r in rows:
            detail = (f"test accuracy {r['test_accuracy']:.2%}, final train loss {r['final_train_loss']:.4f}"
                      if r.get("status") == "ok" else escape(str(r.get("reason", ""))))
            self.console.print(f"{r.get('status', '?'):>11} {precision} seed {r['seed']}  {detail}", highlight=False)


class HeadroomProgress(HeadroomReporter):
    """The headroom search's reporter: the plan, then a line per probe."""

    def __init__(self, console):
        self.console = console

    def started(self, store, device, spec, searches):
        cap = f"{spec.memory_cap_bytes / 2**30:.3g} GiB" if spec.memory_cap_bytes else "none (the whole device)"
        if (store.manifest.get("headroom") or {}).get("default_cpu_cap"):
            cap += " (default: half the memory available now, shared by DDP ranks)"
        self.console.print(f"[bold]headroom[/]: {searches} searches on {device.name}, memory cap {cap}, batch "
                           f"{spec.start_batch_size}..{spec.max_batch_size}, resolution {spec.resolution}   "
                           f"[bold]results[/]: {store.dir}", highlight=False, soft_wrap=True)

    def probe_finished(self, case, batch, row):
        colour = {"ok": "green", "oom": "yellow"}.get(row["status"], "red")
        self.console.print(f"  probe {escape(case.model.label)} {case.precision} batch {batch}: "
                           f"[{colour}]{row['status']}[/]", highlight=False)
