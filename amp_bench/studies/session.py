"""The opening every study shares (a benchmark run, a fidelity study, a headroom search): load the
suite, describe the device in a throwaway worker, open a run directory with its provenance, and
turn a scheduler's SIGTERM into an interrupt that keeps what was finished.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.errors import UserError
from amp_bench.launchers.forkserver import ForkServer, launch
from amp_bench.platform.device import DeviceInfo, DeviceUnavailable, check_device_name
from amp_bench.platform.provenance import host_facts, software_record
from amp_bench.store.fingerprint import fingerprint_columns
from amp_bench.store.results import RunStore, make_run_id, utc_now
from amp_bench.studies import probe_cache
from amp_bench.suite import Suite, load_suite, validate_overrides

PROBE_TIMEOUT_S = 180.0


def probe(requested: str, server: ForkServer | None = None) -> dict:
    """Describe the device in a throwaway worker (a child of the run's fork server when there is one),
    so this process never creates a CUDA context. The software record (git commit, pip freeze, conda
    env: a second or more of subprocesses) is taken by this process meanwhile, while the worker
    imports torch: it costs no start-up of its own, and it never runs beside a case's measured window."""
    software: dict = {}
    thread = threading.Thread(target=lambda: software.update(software_record()), name="amp_bench-software-record")
    thread.start()
    kept_at = probe_cache.location(requested)  # AMP_BENCH_PROBE_CACHE: a CPU probe reused (probe_cache.py)
    kept = probe_cache.load(kept_at)
    if kept is not None:
        thread.join()
        return {**kept, "software": software}
    try:
        with tempfile.TemporaryDirectory(prefix="amp_bench_probe_") as tmp:
            result_path, log_path = Path(tmp) / "probe.json", Path(tmp) / "probe.log"
            outcome = launch(["probe", requested, str(result_path)], result_path, log_path, PROBE_TIMEOUT_S,
                             server=server)
            if outcome.result is None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
                raise UserError(f"device probe failed (exit code {outcome.exit_code}): "
                                f"{' '.join(tail) or 'no output'}")
    finally:
        thread.join()
    if "error" in outcome.result:
        raise UserError(outcome.result["error"])
    probe_cache.save(kept_at, outcome.result)
    return {**outcome.result, "software": software}


@dataclass
class Session:
    """A suite, the device it will run on (probed), and, once opened, the run directory."""
    path: Path
    suite: Suite
    probed: dict
    device: DeviceInfo
    store: RunStore | None = None
    host: dict | None = None
    fingerprint: dict | None = None
    server: ForkServer | None = None  # the run's fork server (isolation: fork), or None: fresh interpreters

    @classmethod
    def start(cls, path, device: str | None = None, overrides: dict | None = None) -> Session:
        suite = load_suite(path)
        if overrides:  # a bad override is a one-line error before any worker starts
            validate_overrides(overrides, suite.path)
        try:  # and a misspelt device, before the server imports torch
            check_device_name(device or suite.device)
        except DeviceUnavailable as exc:
            raise UserError(str(exc)) from None
        server = start_server(suite, overrides)
        try:
            probed = probe(device or suite.device, server)
        except BaseException:
            if server is not None:
                server.close()
            raise
        return cls(Path(path), suite, probed, DeviceInfo.from_json(probed["device"]), server=server)

    @property
    def versions(self) -> dict:
        return self.probed["versions"]

    def open_store(self, results_dir, overrides: dict, kind: str, **manifest) -> RunStore:
        """A new run directory with its suite copy and manifest; the host facts and fingerprint columns on the
        session. Every kind of run (benchmark, fidelity, headroom) records its provenance the same way."""
        self.store = new_store(self.suite, self.path, results_dir, make_run_id(self.device.label), overrides, kind,
                               **manifest)
        self.host, self.fingerprint = record_machine(self.store, self.probed)
        return self.store

    @contextlib.contextmanager
    def running(self, final_manifest):
        """The study's loop (module-level running()); the fork server stops with it."""
        try:
            with running(self.store, final_manifest):
                yield
        finally:
            self.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def workers_record(server: ForkServer | None) -> dict:
    """How a run's workers start, for the manifest: fork (and what the server preloaded) or spawn (and why,
    when the server could not be used)."""
    if server is None:
        return {"mode": "spawn", "why": "isolation: spawn"}
    if not server.ready():  # its imports done (a probe kept from an earlier run has not waited for them)
        return {"mode": "spawn", "why": server.unusable}
    info = server.ready_info or {}
    return {"mode": "fork", "preloaded": info.get("imported", []), "not_preloaded": info.get("failed", {}),
            "server_import_s": info.get("seconds"), "shared_zygote": bool(info.get("zygote"))}


def spawn_note(workers: dict) -> str:
    """One line for the console when the run's workers spawn although fork was asked for ('' otherwise):
    each then pays its interpreter's imports (3-7 s on a CPU, 13-25 s on an H200)."""
    if workers.get("mode") != "spawn" or workers.get("why") == "isolation: spawn":
        return ""
    return ("workers start as fresh interpreters, each paying its own imports: the fork server was not used "
            f"({workers['why']})")


def start_server(suite: Suite, overrides: dict | None = None) -> ForkServer | None:
    """The run's fork server (launchers/forkserver.py), importing what the suite's models need, unless
    the suite or the command line asks for isolation: spawn (or this platform cannot fork)."""
    isolation = {**suite.settings, **(overrides or {})}.get("isolation", "fork")
    refs = [spec.ref for block in (suite.settings, *suite.blocks.values()) for spec in block.get("models", [])]
    return server_for(isolation, refs, (str(suite.path.resolve().parent),))


def server_for(isolation: str, refs: list[str], search_dirs: tuple[str, ...]) -> ForkServer | None:
    """A fork server preloading what these model references need, where isolation is fork and this
    platform can fork and pass descriptors; else None (fresh interpreters)."""
    from amp_bench.suite.model_refs import preload_modules
    if isolation != "fork" or not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return None
    return ForkServer.start(preload_modules(refs), search_dirs=search_dirs)


@contextlib.contextmanager
def running(store: RunStore, final_manifest):
    """Run a study's loop: SIGTERM acts as Ctrl-C, and the manifest ends `complete` or `interrupted`
    with the fields `final_manifest()` returns, whatever happened."""
    status = "interrupted"
    restore = sigterm_as_interrupt()
    try:
        yield
        status = "complete"
    finally:
        restore()
        try:
            store.flush()  # the rows added since its last rewrite of the tables (RunStore.flush_every_s)
        finally:
            store.write_manifest(status=status, finished_at=utc_now().isoformat(), **final_manifest())


def new_store(suite, path, results_dir, run_id: str, overrides: dict, kind: str, **manifest) -> RunStore:
    """A new run directory with its suite copy and the manifest's opening fields (no machine yet:
    a SLURM run learns it from its jobs)."""
    store = RunStore(Path(results_dir), run_id)
    (store.dir / "suite.yaml").write_text(suite.text, encoding="utf-8")
    store.write_manifest(run_id=store.run_id, kind=kind, status="running", started_at=utc_now().isoformat(),
                         suite={"name": suite.name, "path": str(Path(path).resolve()), "sha256": suite.sha256},
                         overrides={k: v for k, v in overrides.items() if v is not None}, **manifest)
    return store


def record_machine(store: RunStore, probed: dict, **more) -> tuple[dict, dict]:
    """The machine a probe described, in the manifest (the first writer's stays; later ones add only
    `more`): (host facts, fingerprint columns for the rows)."""
    host = host_facts()
    machine = {"device": {**probed["device"], "architecture": probed["architecture"]},
               "precision_support": probed["support"], "versions": probed["versions"], "host": host,
               "gpu": probed.get("gpu", {}), "software": probed.get("software", {})}

    def add(manifest: dict) -> None:
        for key, value in machine.items():
            manifest.setdefault(key, value)
        manifest.update(more)
    store.update_manifest(add)
    return host, fingerprint_columns(probed["device"], probed["versions"], probed.get("gpu", {}), host["hostname"])


@dataclass
class Machine:
    """Where the cases run, as the rows record it: the device, versions, host and fingerprint columns,
    and (in a SLURM job) the job's columns."""
    device: DeviceInfo
    versions: dict
    hostname: str
    fingerprint: dict
    columns: dict = field(default_factory=dict)
    server: ForkServer | None = None  # the run's fork server: how its workers start (None: fresh interpreters)

    def stamp(self, row):
        """The machine's columns on a row: its host and fingerprint, and a SLURM job's."""
        return row.put("the machine", {"hostname": self.hostname, **self.fingerprint, **self.columns})


def sigterm_as_interrupt():
    """A scheduler's SIGTERM stops the run like Ctrl-C: finished cases are kept."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)
