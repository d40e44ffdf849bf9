"""Batch-size headroom: the largest batch each precision trains at without running out of memory.

Per model and precision: double the batch from the start size until a probe runs out of memory
(or the limit is reached), then bisect between the last batch that fit and the first that did not
until they are `resolution` apart. Every probe is a few real training steps in its own worker
under the memory cap, with OOM as the signal, so a probe that runs out can never take the run down.
Then, optionally, a full measurement at each precision's own largest batch gives the throughput
AMP's extra headroom buys.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from amp_bench.analysis.headroom import FITS, ratios_vs_fp32
from amp_bench.store.columns import STUDY_TABLES
from amp_bench.store.flags import peak_memory


@dataclass
class SearchResult:
    largest_fit: int | None  # None: not even the start batch fits
    smallest_oom: int | None  # None: no probe ran out (the limit fits)
    status: str  # ok, nothing fits, or the status of a probe that failed for another reason
    reason: str = ""
    probes: list[tuple[int, str]] = field(default_factory=list)

    @property
    def limit_reached(self) -> bool:
        return self.status == "ok" and self.smallest_oom is None


class _ProbeFailed(Exception):
    pass


def search_max_batch(probe: Callable[[int], tuple[str, str]], start: int, limit: int,
                     resolution: int = 1) -> SearchResult:
    """Doubling, then bisection. `probe(batch)` returns (status, reason); status ok/nonfinite means the
    batch fits, oom that it does not; anything else stops the search with that status."""
    resolution = max(1, resolution)  # 0 would never stop bisecting
    limit = max(1, limit)
    start = min(max(1, start), limit)
    result = SearchResult(None, None, "ok")

    def fits(batch: int) -> bool:
        status, reason = probe(batch)
        result.probes.append((batch, status))
        if status in FITS:
            return True
        if status == "oom":
            return False
        raise _ProbeFailed(status, f"batch {batch}: {reason}")

    try:
        batch = start
        while True:
            if not fits(batch):
                result.smallest_oom = batch
                break
            result.largest_fit = batch
            if batch >= limit:
                break
            batch = min(batch * 2, limit)
        if result.largest_fit is None:
            result.status, result.reason = "nothing fits", f"batch {start} already runs out of memory"
            return result
        while result.smallest_oom is not None and result.smallest_oom - result.largest_fit > resolution:
            middle = (result.largest_fit + result.smallest_oom) // 2
            if fits(middle):
                result.largest_fit = middle
            else:
                result.smallest_oom = middle
    except _ProbeFailed as exc:
        result.status, result.reason = exc.args
    return result


def default_cpu_cap() -> int:
    """Half the memory available now: a CPU search with no cap given stays clear of the OOM killer."""
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


class HeadroomReporter:
    def started(self, store, device, spec, searches: int) -> None: ...
    def probe_finished(self, case, batch: int, row: dict) -> None: ...
    def search_finished(self, case, row: dict) -> None: ...


def run_headroom(path, *, device: str | None = None, results_dir="results", reporter=None, **overrides) -> pd.DataFrame:
    """Search every model x precision of the suite; returns the headroom table (attrs: run_dir).
    Tables are saved after every probe."""
    from amp_bench.studies.session import Session
    reporter = reporter or HeadroomReporter()
    session = Session.start(path, device)
    try:
        spec, templates, shared_cap = _plan(session, path, overrides)
    except BaseException:
        session.close()
        raise
    store = session.open_store(results_dir, overrides, kind="headroom",
                               headroom={**dataclasses.asdict(spec), "default_cpu_cap": shared_cap},
                               cases_planned=len(templates))
    store.flush()
    search = _Search(session, store, spec, shared_cap, reporter)
    reporter.started(store, session.device, spec, len(templates))
    with session.running(lambda: {"cases_finished": len(search.table), "probes": len(search.probes)}):
        for template in templates:
            search.search(template)
    frame = ratios_vs_fp32(pd.DataFrame(search.table, columns=list(STUDY_TABLES["headroom"])))
    frame.attrs["run_dir"] = str(store.dir)
    return frame


def _plan(session, path, overrides: dict) -> tuple:
    """(the headroom spec, one case per model, sizes, layout and precision to search the batch of, whether
    the CPU's default memory cap is shared out)."""
    from amp_bench.errors import UserError
    suite, info = session.suite, session.device
    headroom_keys = {"memory_cap_gb", "start_batch_size", "max_batch_size", "resolution", "probe_steps", "measure"}
    spec = suite.headroom_spec(info.type, {k: v for k, v in overrides.items() if k in headroom_keys})
    cases = suite.cases(info.type, {k: v for k, v in overrides.items() if k not in headroom_keys})
    if any(c.nnodes > 1 for c in cases):
        raise UserError(f"{path}: nnodes: headroom searches run on one node (each node would search alone "
                        "and wait for the others at every probe); use nnodes: 1")
    shared_cap = info.type == "cpu" and spec.memory_cap_bytes is None
    if shared_cap:
        # without a cap the search would end in the kernel's OOM killer, which may pick another process;
        # a cap holds per process, so DDP ranks share this one out
        spec = dataclasses.replace(spec, memory_cap_bytes=default_cpu_cap())
    templates: dict[tuple, object] = {}  # one per case's axes but the batch (searched), and precision
    for case in cases:
        key = (*(v for axis, v in case.axes.items() if axis != "batch_size"), case.precision)
        templates.setdefault(key, case)
    return spec, list(templates.values()), shared_cap


class _Search:
    """One run's searches: each template's largest batch (probes under the cap), then, with `measure`,
    the throughput at it; the tables saved after every probe."""

    def __init__(self, session, store, spec, shared_cap: bool, reporter):
        self.session, self.store, self.spec, self.shared_cap, self.reporter = session, store, spec, shared_cap, reporter
        self.table: list[dict] = []
        self.probes: list[dict] = []

    def run(self, case, stem: str, support) -> tuple[dict, list]:
        from amp_bench.launchers.launch import run_one
        return run_one(case, 0, self.session.device, self.session.versions, self.store, support,
                       stem=stem, server=self.session.server)  # a probe forks as a run's case does: ~0.1 s, not ~4 s

    def probe(self, base, batch: int, support) -> tuple[str, str]:
        case = dataclasses.replace(base, batch_size=batch)
        row, _ = self.run(case, f"probe-{case.case_id}", support)
        memory = peak_memory(row, self.session.device.type)
        self.probes.append({"run_id": self.store.run_id, "model_label": case.model.label, "precision": case.precision,
                            "probe": len(self.probes), "batch_size": batch, "status": row["status"],
                            "reason": row.get("reason", ""), "peak_mem_bytes": memory,
                            "worker_seconds": row.get("worker_seconds"), "worker_start": row.get("worker_start"),
                            "log_file": row.get("log_file")})
        self.store.write_table("headroom_probes", self.probes)
        self.reporter.probe_finished(case, batch, row)
        return row["status"], row.get("reason", "")

    def search(self, template) -> None:
        from amp_bench.platform.device import precision_support
        from amp_bench.store.results import utc_now
        spec, info = self.spec, self.session.device
        support = precision_support(template.precision, info)  # the gate's decision, once for every probe
        cap = spec.memory_cap_bytes // (template.nproc_per_node or 1) if self.shared_cap else spec.memory_cap_bytes
        base = dataclasses.replace(template, warmup_steps=1, steps=spec.probe_steps, repeats=1, memory_cap_bytes=cap,
                                   instrument=False, count_flops=False)
        found = search_max_batch(lambda batch: self.probe(base, batch, support), spec.start_batch_size,
                                 spec.max_batch_size, spec.resolution)
        axes = {axis: value for axis, value in template.axes.items() if axis != "batch_size"}
        row = {"run_id": self.store.run_id, "suite": self.session.suite.name, **axes, "precision": template.precision,
               "device": info.type, "device_name": info.name, "status": found.status, "reason": found.reason,
               "max_batch_size": found.largest_fit, "first_oom_batch_size": found.smallest_oom,
               "limit_reached": found.limit_reached, "start_batch_size": spec.start_batch_size,
               "max_batch_size_limit": spec.max_batch_size, "resolution": spec.resolution, "memory_cap_bytes": cap,
               "probes": len(found.probes), "hostname": self.session.host["hostname"],
               "fingerprint": self.session.fingerprint.get("fingerprint", "")}
        if found.status == "ok" and spec.measure:
            row.update(self.measure_at(template, found.largest_fit, support))
        row["timestamp"] = utc_now().isoformat()
        self.table.append(row)
        frame = ratios_vs_fp32(pd.DataFrame(self.table, columns=list(STUDY_TABLES["headroom"])))
        self.store.write_table("headroom", frame.to_dict("records"))
        self.reporter.search_finished(template, frame.iloc[-1].to_dict())

    def measure_at(self, template, batch: int, support) -> dict:
        """The throughput this batch buys: a full measurement, without the cap (on the CPU the cap
        changes how malloc works; the batch is known to fit in less memory than that)."""
        case = dataclasses.replace(template, batch_size=batch, repeats=1)
        measured, samples = self.run(case, f"measure-{case.case_id}", support)
        measured.put("the worker", measured.held).put("the headroom search", {
            "hostname": self.session.host["hostname"], "headroom_max_batch": True, **self.session.fingerprint})
        self.store.add(measured, samples)
        return {"measure_status": measured["status"], "throughput_at_max": measured.get("throughput"),
                "step_time_ms_at_max": measured.get("step_time_ms_median"),
                "peak_mem_at_max_bytes": peak_memory(measured, self.session.device.type)}
