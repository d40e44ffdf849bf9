"""Reuse of a CPU device probe, for a caller that starts many short runs on one machine.

The probe (session.probe) starts a worker that imports torch only to describe the device: 1.7-3 s a
run. A test suite or a script that starts dozens of runs may set AMP_BENCH_PROBE_CACHE=DIR, and a
probe is then reused while nothing it depends on changed: the boot (a new kernel, driver or CPU
microcode means a new boot id), the Python and torch installed, amp_bench's own code, the requested
device, the environment variables that steer the CPU kernels or the devices torch sees
(ONEDNN_MAX_CPU_ISA hides the bf16 instructions, CUDA_VISIBLE_DEVICES hides GPUs), and the GPU
device nodes in /dev. Only a probe that found a CPU is kept: GPUs change within a boot (MIG, another
job's CUDA_VISIBLE_DEVICES), so a GPU machine always probes afresh. And a request that could find a GPU
(`auto`, `cuda`) is never served from the cache while an NVIDIA device node exists: a CPU probe saved
after a transient CUDA failure (a driver/library mismatch, nvidia_uvm reloading) would otherwise hide
the GPU for the rest of the boot, since neither changes the key. Off unless the variable is set. No
library keys a cache on this set of facts, so it is written here.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from amp_bench.store.results import write_text_atomic

ENV_VAR = "AMP_BENCH_PROBE_CACHE"
# environment variables that change what the probe finds (kernels, visible devices, thread pools)
_ENV_PREFIXES = ("ONEDNN_", "DNNL_", "ATEN_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "OMP_", "KMP_", "GOMP_",
                 "MKL_", "TORCH_", "PYTORCH_", "LD_")
DEV = Path("/dev")


def _stamp(path: Path) -> list:
    try:
        stat = path.stat()
    except OSError:
        return [str(path), None]
    return [str(path), stat.st_mtime_ns, stat.st_size]


def cache_key(requested: str) -> str:
    """A digest of everything a CPU probe's answer depends on."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = None
    spec = importlib.util.find_spec("torch")  # finds, does not import
    torch_files = [Path(spec.origin).with_name(n)
                   for n in ("__init__.py", "version.py")] if spec and spec.origin else []
    package = Path(__file__).resolve().parents[1]
    facts = {
        "requested": requested, "boot": boot, "python": [sys.executable, sys.version],
        "torch": [_stamp(p) for p in torch_files],
        "amp_bench": [_stamp(p) for p in sorted(package.rglob("*.py"))],
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)),
        # a GPU that appears within the boot (its driver loaded): `auto` must probe afresh and find it
        "device_nodes": sorted(str(p) for pattern in ("nvidia[0-9]*", "kfd", "dri/renderD*")
                               for p in DEV.glob(pattern)),
    }
    return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:32]


def location(requested: str) -> Path | None:
    """Where this request's probe is kept, or None when the cache is off or must not answer it (a
    request that could find a GPU, on a machine with an NVIDIA device node). Computed once per probe:
    the key stats amp_bench's files."""
    folder = os.environ.get(ENV_VAR)
    if not folder or (requested != "cpu" and any(DEV.glob("nvidia[0-9]*"))):
        return None
    return Path(folder) / f"probe-{cache_key(requested)}.json"


def _found_cpu(probed) -> bool:
    return isinstance(probed, dict) and probed.get("device", {}).get("type") == "cpu"


def load(path: Path | None) -> dict | None:
    """The probe kept at `path` (location()), or None (off, never probed, or something it depends on changed)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None  # absent or torn: probe afresh
    return found if _found_cpu(found) else None


def save(path: Path | None, probed: dict) -> None:
    """Keep a probe that found a CPU (see the module's docstring for why only those)."""
    if path is None or not _found_cpu(probed):
        return
    with contextlib.suppress(OSError):  # an unwritable cache only costs the next run its probe
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(probed))
