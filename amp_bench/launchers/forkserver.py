"""A fork server for case workers: import torch and the suite's model libraries once per run, then
fork a fresh child for every case.

Every worker used to pay 3-7 s of imports before its first step (torch 1.8 s, torch._dynamo 1.7 s,
torchvision or transformers on top). The server is one long-lived process per run that imports them
and then only forks: each case still runs in a new process with its own address space, its own
peak-memory accounting (the server's children are reaped one by one; none includes another's memory)
and, on a GPU, its own CUDA context. The server never runs a torch op and never touches CUDA:
after its imports it checks that `torch.cuda.is_initialized()` is False, that no CUDA driver library
is mapped, and that it is still one thread (OpenMP's pool starts at import unless told not to, so the
server imports with OMP_NUM_THREADS=1 and each child sets its own thread count); a server that fails
a check is not used, and the run spawns fresh interpreters as before, saying why.

Why not `multiprocessing`'s forkserver: its children are the server's, so only the server can reap
them, and the parent needs what the reaping gives (wait4's ru_maxrss, the row's peak RSS, and a
SIGKILL status, the OOM signal); each case also needs its own session (so a timeout kills everything
it started), its log as stdout and stderr from the first byte, and its own environment (the compile
cache, the explain trace path). This server forks, sets those up in the child, runs exactly what
`python -m amp_bench.worker ARGS` (or a DDP case's torchrun launcher) would run, reaps the child and sends
the parent its pid, status and rusage over a Unix socket (fds travel with SCM_RIGHTS, as multiprocessing's
forkserver does).

A shared server (a zygote) serves many runs: `start_zygote(path, preload)` starts one listening on a
Unix socket, and every run whose environment names it (AMP_BENCH_FORK_ZYGOTE=path) joins it instead of
importing torch again: the zygote forks the run a server of its own (the same loop, a copy of a process
that already imported), which imports what the run adds (the suite's own module) and forks its cases.
The test suite starts one per command (tests/conftest.py): some 45 runs each spent ~3.5 s of CPU on the
server's imports. A zygote's children start with its imports resident, so a run that joined one
(manifest: workers.shared_zygote) records a peak RSS that includes every library the zygote preloaded:
compare peak RSS between runs started the same way. A run that would not get from it what its own
server would give it (what_a_fork_keeps: the interpreter, amp_bench, the working folder, the variables
read at import) starts its own server, as does a run that finds nothing listening.

Parent side: ForkServer.start(...), launch(...) -> WorkerOutcome (a forked child, or a spawned
interpreter where the server cannot take the case), ForkServer.close(); start_zygote(...).
Server side: `python -m amp_bench.launchers.forkserver` (the parent starts it; `--zygote PATH` for a
shared one).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amp_bench.launchers import process
from amp_bench.launchers.process import WorkerOutcome
from amp_bench.platform.forking import unsafe_to_fork

# variables a fork cannot change for a child: read when torch and its libraries load (thread pools,
# the kernels' ISA, the devices CUDA sees, the allocator's settings, the loader's paths)
IMPORT_TIME_ENV = ("OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "CUDA_VISIBLE_DEVICES", "LD_",
                   "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TORCH_NUM_THREADS")
WORKER = "amp_bench.worker"
# the programs a child of the server runs in place of `python -m MODULE`, each with the import-time variables
# it applies itself: the torchrun launcher's ranks set their thread count from OMP_NUM_THREADS as they start
# (torchrun._forked_rank, set_fresh_thread_count), and ranks it cannot fork start as fresh interpreters
FORKABLE_MODULES = {WORKER: (), "amp_bench.launchers.torchrun": ("OMP_NUM_THREADS",)}
ZYGOTE_ENV = "AMP_BENCH_FORK_ZYGOTE"  # a shared server's socket path: runs join it (start_zygote)
READY_TIMEOUT_S = 180.0
_MESSAGE = 65536


@dataclass
class Forked:
    """What the server says of one child: its pid, then how it ended."""
    pid: int
    status: int | None = None  # os.wait4's raw status
    maxrss_kib: int | None = None


class ForkServerGone(RuntimeError):
    """The server died or stopped answering: the run spawns fresh interpreters from here on."""


class ForkServer:
    """Parent side. `start` launches the server, which imports in the background; the first `run`
    waits for it to be ready (or for the reason it cannot be used: `unusable`)."""

    def __init__(self, proc: subprocess.Popen | None, sock: socket.socket, preload: list[str]):
        self.proc, self.sock, self.preload = proc, sock, preload  # proc: None for a zygote's server
        self.ready_info: dict | None = None
        self.unusable = ""  # why this server may not fork cases ('' while it may)

    @classmethod
    def start(cls, preload: list[str], search_dirs: tuple[str, ...] = (), log_path: Path | None = None) -> ForkServer:
        """The run's server: forked by the shared zygote the environment names, when it takes this run,
        else a process of its own that imports in the background."""
        zygote = os.environ.get(ZYGOTE_ENV)
        joined = cls.join(zygote, preload, search_dirs) if zygote else None
        if joined is not None:
            return joined
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = _server_process([str(theirs.fileno()), {"preload": preload, "search_dirs": list(search_dirs)}],
                                   log_path, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        return cls(proc, ours, preload)

    @classmethod
    def join(cls, path: str, preload: list[str], search_dirs: tuple[str, ...] = ()) -> ForkServer | None:
        """A server forked for this run by the zygote listening at `path`, ready (it waits for the
        zygote's imports); None when nothing answers there or it would not start a case as this process's
        own server would (what_a_fork_keeps differs: another interpreter, another amp_bench, or another
        OpenMP wait policy or oneDNN ISA cap, which are read as torch loads)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server = cls(None, sock, preload)
        try:
            sock.connect(path)
            sock.send(json.dumps({"preload": preload, "search_dirs": list(search_dirs),
                                  "same": what_a_fork_keeps(os.environ)}).encode())
            info = server._receive(READY_TIMEOUT_S)
        except (OSError, ForkServerGone):
            info = None
        if info is None or "mismatch" in info:
            sock.close()
            return None
        server.ready_info, server.unusable = info, info.get("unsafe", "")
        return server

    # ------------------------------------------------------------------ readiness

    def ready(self) -> bool:
        """Wait for the server's imports (once); False with `unusable` set when it may not fork."""
        if self.ready_info is None and not self.unusable:
            try:
                self.ready_info = self._receive(READY_TIMEOUT_S)
            except ForkServerGone as exc:
                self.unusable = f"the fork server did not start ({exc})"
            else:
                self.unusable = self.ready_info.get("unsafe", "")
            if self.unusable:
                self.close()
        return not self.unusable

    def _receive(self, timeout_s: float | None) -> dict:
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(_MESSAGE)
        except (TimeoutError, OSError) as exc:
            raise ForkServerGone(f"no answer: {exc}") from None
        if not data:
            code = self.proc.poll() if self.proc is not None else None
            raise ForkServerGone("it exited" + (f" with code {code}" if code is not None else ""))
        return json.loads(data)

    # ------------------------------------------------------------------ one child

    def fork(self, args: list[str], env: dict[str, str], event_fd: int, log_fd: int, module: str = WORKER) -> Forked:
        """Ask for a child running `python -m MODULE ARGS` (FORKABLE_MODULES) with this environment, its events
        on `event_fd` and its output in `log_fd`; returns once it exists."""
        request = json.dumps({"module": module, "args": args, "env": env, "cwd": os.getcwd()}).encode()
        try:
            socket.send_fds(self.sock, [request], [event_fd, log_fd])
            answer = self._receive(30.0)
        except (OSError, ForkServerGone) as exc:
            self.unusable = f"the fork server stopped answering ({exc})"
            self.close()
            raise ForkServerGone(self.unusable) from None
        if "error" in answer:
            raise ForkServerGone(answer["error"])
        return Forked(int(answer["pid"]))

    def wait(self, child: Forked, event_fd: int, deadline: float, on_event, watch=None) -> bool | str:
        """Forward the child's events until the server says it exited (True), the deadline passes
        (False) or the contention watch says stop (its evidence). The server's word is the only exit
        notice: the child is not this process's."""
        selector = selectors.DefaultSelector()
        selector.register(event_fd, selectors.EVENT_READ, "events")
        selector.register(self.sock, selectors.EVENT_READ, "exit")
        buffer = [b""]
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                for key, _ in selector.select(min(remaining, 0.5) if watch is not None else remaining):
                    if key.data == "events" and not process._read_events(event_fd, buffer, on_event):
                        selector.unregister(event_fd)
                    elif key.data == "exit":
                        self._exited(child, self._receive(5.0))
                        process._drain(event_fd, buffer, on_event)
                        return True
                evidence = watch.check() if watch is not None else ""
                if evidence:
                    return evidence
        finally:
            selector.close()

    def reap(self, child: Forked, timeout_s: float = 30.0) -> None:
        """After the child's group was killed: the server's exit notice, so the next request starts clean."""
        try:
            self._exited(child, self._receive(timeout_s))
        except ForkServerGone as exc:
            self.unusable = f"the fork server stopped answering ({exc})"
            self.close()

    @staticmethod
    def _exited(child: Forked, message: dict) -> None:
        if message.get("exited") != child.pid:
            raise ForkServerGone(f"expected the exit of {child.pid}, got {message}")
        child.status, child.maxrss_kib = int(message["status"]), int(message["maxrss_kib"])

    def close(self) -> None:
        """Stop the server (closing its socket ends its loop; a kill makes sure)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _server_process(args: list, log_path: Path | None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """`python -m amp_bench.launchers.forkserver ARGS` (a dict argument as JSON) in its own session, with
    server_env (which names this process as the parent it dies with) and its output in `log_path`."""
    argv = [json.dumps(a) if isinstance(a, dict) else a for a in args]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to Popen
    try:
        return subprocess.Popen([sys.executable, "-m", "amp_bench.launchers.forkserver", *argv],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=server_env(os.environ), pass_fds=pass_fds, start_new_session=True)
    finally:
        if log_path:
            log.close()


def server_env(environ) -> dict[str, str]:
    """The server's environment: a worker's (process.worker_env; OpenMP reads its wait policy as it
    loads, so the children keep the server's, which is the parent's), with OpenMP held to one thread
    while it imports (the pool would otherwise start, and it does not survive a fork; each child sets
    its own count)."""
    env = process.worker_env(-1, "", environ)
    for key in ("AMP_BENCH_EVENT_FD", "AMP_BENCH_CASE_TOKEN", "AMP_BENCH_LAUNCHED_AT"):
        env.pop(key, None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # an import that asks is_available() must not initialise CUDA
    return env


# what a process that imported torch and the model libraries keeps of its environment besides
# IMPORT_TIME_ENV: their settings read once at import (huggingface_hub's cache and offline switches,
# torch's logs, dynamo's and inductor's config defaults) and where Python finds modules
READ_AT_IMPORT_ENV = IMPORT_TIME_ENV + ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "PYTHONPATH")
# set by a library as it loads, however the process was started: torch's TORCHINDUCTOR_CACHE_DIR (read when a
# compile uses it; each case sets its own, launch.worker_setting), scikit-learn's KMP_DUPLICATE_LIB_OK (read when
# a second OpenMP runtime loads: in the child, with the run's environment) and KMP_INIT_AT_FORK (whether Intel's
# or LLVM's OpenMP starts afresh in a forked child: a server's children need its default, a zygote's have it)
SET_BY_LIBRARIES_ENV = ("TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")


def what_a_fork_keeps(environ) -> dict:
    """What a forked child inherits from its server and cannot change: the interpreter, the amp_bench
    it imported, the folder its module search path starts from, and the server environment's variables
    read at import (READ_AT_IMPORT_ENV). A zygote serves a run only when these are the run's own."""
    env = server_env(environ)
    return {"python": sys.executable, "amp_bench": process.package_pythonpath(), "cwd": os.getcwd(),
            "env": {key: value for key, value in env.items()
                    if key.startswith(READ_AT_IMPORT_ENV) and key not in SET_BY_LIBRARIES_ENV}}


def forked_program(launcher: list[str] | None, args: list[str], extra_env: dict[str, str] | None = None):
    """(module, its argv) that a child of the server runs for `LAUNCHER... ARGS` (no launcher: the worker); None where
    only a fresh interpreter can: another program or interpreter, or a variable of the case's own that torch reads as
    it loads (IMPORT_TIME_ENV) and the program does not apply itself (FORKABLE_MODULES)."""
    launcher = launcher or [sys.executable, "-m", WORKER]
    module = launcher[2] if len(launcher) > 2 and launcher[:2] == [sys.executable, "-m"] else ""
    if module not in FORKABLE_MODULES or any(key.startswith(IMPORT_TIME_ENV) and key not in FORKABLE_MODULES[module]
                                             for key in (extra_env or {})):
        return None
    return module, [*launcher[3:], *args]


def launch(args: list[str], result_path: Path, log_path: Path, timeout_s: float, on_event=None,
           launcher: list[str] | None = None, extra_env: dict[str, str] | None = None,
           server: ForkServer | None = None, contention=None) -> WorkerOutcome:
    """Run `python -m amp_bench.worker ARGS` (or `LAUNCHER... ARGS`): a child of the fork server where it can take
    the case (forked_program, a server that is ready and safe), else a fresh interpreter (process.run_worker).
    Never raises for worker failures. `contention(pid)`: a watch that may stop it early."""
    program = forked_program(launcher, args, extra_env)
    if server is not None and program is not None and server.ready():
        try:
            return _run_forked(server, program, result_path, log_path, timeout_s, on_event, extra_env, contention)
        except ForkServerGone:
            pass  # the server is gone (server.unusable says why): this case and the rest spawn
    return process.run_worker(args, result_path, log_path, timeout_s, on_event=on_event, launcher=launcher,
                              extra_env=extra_env, contention=contention)


def launch_spec(job: str, spec: dict, log_path: Path | None, timeout_s: float,
                server: ForkServer | None = None) -> WorkerOutcome:
    """A worker job outside a run's store (an inventory recording, the emulation probe): its spec and
    result in a throwaway folder, its log at `log_path` (in that folder, so gone, when None)."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix=f"amp_bench-{job}-") as work:
        spec_path, result_path = Path(work) / "spec.json", Path(work) / "result.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        log_path = log_path or Path(work) / f"{job}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return launch([job, str(spec_path), str(result_path)], result_path, log_path, timeout_s, server=server)


def _run_forked(server: ForkServer, program: tuple[str, list[str]], result_path: Path, log_path: Path,
                timeout_s: float, on_event, extra_env, contention=None) -> WorkerOutcome:
    """process.run_worker's contract, with the child forked by the server: the same deadline, events,
    kill of the case's session and sweep of what it started, and the outcome from the server's reap."""
    result_path.unlink(missing_ok=True)
    child, read_fd, token, started, watch = process.start_worker(
        lambda env, write_fd, log_fd: server.fork(program[1], env, write_fd, log_fd, program[0]), log_path,
        extra_env, contention)
    deadline_hit, stopped = False, ""
    try:
        ended = server.wait(child, read_fd, started + timeout_s, process._watched(on_event, watch), watch)
        if ended is not True:
            stopped = ended if isinstance(ended, str) else ""
            deadline_hit = not stopped
            process._kill_group(child.pid)
            server.reap(child)
    except ForkServerGone as exc:  # the server died under the case: the case died with it
        server.unusable = f"the fork server died ({exc})"
        process._kill_group(child.pid)
    except BaseException:
        process._kill_group(child.pid)
        server.reap(child, 10.0)
        process._sweep(token)
        raise
    finally:
        os.close(read_fd)
    process._kill_group(child.pid)  # anything the child left behind in its session
    process._sweep(token)  # and anything that left it
    exit_code = os.waitstatus_to_exitcode(child.status) if child.status is not None else None
    found = process.outcome(result_path, exit_code, deadline_hit, child.maxrss_kib, started, log_path, timeout_s,
                            started_by="fork")
    return process.with_contention(found, stopped, watch)


# --------------------------------------------------------------------------- the server process

def import_modules(names: list[str], search_dirs: list[str]) -> tuple[list[str], dict[str, str]]:
    for directory in search_dirs:
        if directory not in sys.path:
            sys.path.insert(0, directory)
    imported, failed = [], {}
    for name in names:
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception as exc:  # a worker that needs it will fail in its own row
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return imported, failed


def _child(request: dict, event_fd: int, log_fd: int, server_pid: int) -> None:
    """In the forked child: become the case's own session with its log and environment, set the
    thread count a fresh worker would have had, and run what `python -m MODULE` runs (FORKABLE_MODULES). It
    ends with os._exit once its output is flushed: its result is already written, and tearing down
    an interpreter that holds a model, its optimizer and oneDNN's caches cost about a second a case
    (ResNet-50 on a 2-core CPU), which nothing reads. A process the case started is killed with its
    session (forkserver.launch), as after any worker."""
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(AMP_BENCH_EVENT_FD=str(event_fd), AMP_BENCH_PARENT_PID=str(server_pid))
        os.chdir(request["cwd"])
        set_fresh_thread_count()
        sys.argv = [request["module"], *request["args"]]
        import runpy
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # as an interpreter would: the traceback in the log, exit 1
        import traceback
        traceback.print_exc()
    from amp_bench.measure.ending import exit_without_teardown
    exit_without_teardown(code)


def set_fresh_thread_count() -> None:
    """In a forked child: the thread count a fresh worker would start with (its OMP_NUM_THREADS, else one per CPU
    it may use); the server imported torch with OpenMP held to one."""
    import torch  # preloaded: already imported
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else len(os.sched_getaffinity(0)))


def _serve(sock: socket.socket) -> None:
    """One child at a time: fork it, say its pid, reap it, say how it ended; until the parent hangs up."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 2)
        except OSError:
            return
        if not data:
            return
        request = json.loads(data)
        if len(fds) != 2:
            sock.send(json.dumps({"error": f"expected 2 descriptors, got {len(fds)}"}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(request, fds[0], fds[1], os.getppid())
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        status, usage = _reap(pid, sock)
        try:
            sock.send(json.dumps({"exited": pid, "status": status, "maxrss_kib": usage.ru_maxrss}).encode())
        except OSError:
            return


def _reap(pid: int, sock: socket.socket):
    """wait4 the child; a parent that hangs up meanwhile (killed) has its case's session killed first
    (a zygote's server does not die with the run's parent, as a run's own server does by
    PR_SET_PDEATHSIG). A process the case started outside its session is the parent's to sweep, and a
    killed parent sweeps nothing, as with a run's own server."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: the case ends by itself or at its own deadline
        return os.wait4(pid, 0)[1:]
    with selectors.DefaultSelector() as selector:
        selector.register(pidfd, selectors.EVENT_READ, "exited")
        selector.register(sock, selectors.EVENT_READ, "parent")
        while True:
            events = {key.data for key, _ in selector.select()}
            if "exited" in events:
                break
            try:
                if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    selector.unregister(sock)  # a message mid-case is the protocol's error, not a hang-up
                    continue
            except BlockingIOError:
                continue
            except OSError:
                pass  # reset: hung up
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:  # not yet its own session (the parent hung up before the child's setsid)
                os.kill(pid, signal.SIGKILL)
            break
    os.close(pidfd)
    return os.wait4(pid, 0)[1:]


# --------------------------------------------------------------------------- a shared server (zygote)

def start_zygote(path: str | Path, preload: list[str], log_path: Path | None = None) -> subprocess.Popen:
    """Start a shared server listening at `path` (a Unix socket's path: at most 107 bytes); returns once
    it listens (it accepts once its imports are done), has died, or 30 s passed: the caller checks
    `os.path.exists(path)` and `poll()`. Runs join it while AMP_BENCH_FORK_ZYGOTE=path is in their
    environment. It ends with the process that started it, or when killed."""
    proc = _server_process(["--zygote", str(path), {"preload": preload, "same": what_a_fork_keeps(os.environ)}],
                           log_path)
    listening_by = time.monotonic() + 30.0
    while not os.path.exists(path) and proc.poll() is None and time.monotonic() < listening_by:
        time.sleep(0.02)
    return proc


def _zygote(path: str, preload: list[str], same: dict) -> int:
    """Listen at `path`; fork each run that connects a server of its own (_run_session), if it would get
    there what its own server would give it: `same`, what_a_fork_keeps of the starter's environment."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)  # listening before the imports: a run that connects meanwhile waits for them
    os.rename(path + ".new", path)  # the path appears once it listens (start_zygote waits for it)
    import_modules(preload, [])
    unsafe = unsafe_to_fork()
    if unsafe:
        print(f"fork zygote: not used: {unsafe}", flush=True)
        return 1
    listener.settimeout(1.0)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        if conn is not None:
            zygote_pid = os.getpid()
            if os.fork() == 0:
                listener.close()
                _session_process(conn, zygote_pid, same)
            conn.close()
        while _reaped_one():
            pass


def _reaped_one() -> bool:
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(-1, os.WNOHANG)[0] > 0
    return False


def _session_process(conn: socket.socket, zygote_pid: int, same: dict) -> None:
    """The forked copy of the zygote serving one run: never back into the accept loop, never torn down
    (an error in it is its run's: in the log, and the run's join or next case says the server is gone)."""
    from amp_bench.measure.ending import exit_without_teardown
    code = 1
    try:
        code = _run_session(conn, zygote_pid, same)
    except BaseException:  # a run that hung up mid-handshake, a malformed request
        import traceback
        traceback.print_exc()
    finally:
        exit_without_teardown(code)


def _run_session(conn: socket.socket, zygote_pid: int, same: dict) -> int:
    """In a run's server forked by the zygote: check the run would get what its own server would give
    it (what_a_fork_keeps), import what the run adds, say ready, then serve it as its own server would."""
    from amp_bench.measure.ending import die_with_parent
    os.environ["AMP_BENCH_PARENT_PID"] = str(zygote_pid)
    die_with_parent()  # the zygote ended: so does this server (and, through theirs, its children)
    conn.settimeout(None)
    options = json.loads(conn.recv(_MESSAGE) or b"{}")
    theirs = options.get("same") or {}
    if theirs != same:
        conn.send(json.dumps({"mismatch": sorted(k for k in same if theirs.get(k) != same[k])}).encode())
        return 0
    _, unsafe = _import_and_answer(conn, options, zygote=True)
    if not unsafe:
        _serve(conn)
    return 0


def _import_and_answer(sock: socket.socket, options: dict, **also) -> tuple[dict, str]:
    """Import what the run asks for, then tell it so, and why its server may not fork: (failed, unsafe)."""
    started = time.monotonic()
    imported, failed = import_modules(options.get("preload", []), options.get("search_dirs", []))
    unsafe = unsafe_to_fork()
    sock.send(json.dumps({"imported": imported, "failed": failed, "unsafe": unsafe, **also,
                          "seconds": round(time.monotonic() - started, 3)}).encode())
    return failed, unsafe


def main(argv: list[str]) -> int:
    from amp_bench.measure.ending import die_with_parent
    die_with_parent()  # AMP_BENCH_PARENT_PID: the run's parent (a zygote's: whoever started it)
    if argv[0] == "--zygote":
        options = json.loads(argv[2])
        return _zygote(argv[1], options["preload"], options["same"])
    sock = socket.socket(fileno=int(argv[0]))
    options = json.loads(argv[1])
    failed, unsafe = _import_and_answer(sock, options)
    if failed:
        print(f"fork server: not preloaded (the workers import them): {failed}", flush=True)
    if unsafe:
        print(f"fork server: not used: {unsafe}", flush=True)
        return 0
    _serve(sock)
    return 0


if __name__ == "__main__":
    from amp_bench.measure.ending import exit_without_teardown
    exit_without_teardown(main(sys.argv[1:]))  # the server holds torch: its teardown cost every run 1.5 s
