"""Versions and machine facts recorded next to every result (the run's manifest holds them all:
studies/session.record_machine)."""
from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata

# Variables that change speed or memory: the caching allocator's settings (fragmentation, expandable
# segments), lazy kernel loading (memory), the device order, TF32 overrides, threads; NCCL_* by prefix.
RESULT_AFFECTING_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS",
                        "CUBLAS_WORKSPACE_CONFIG", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "PYTORCH_CUDA_ALLOC_CONF",
                        "PYTORCH_ALLOC_CONF", "CUDA_MODULE_LOADING", "CUDA_DEVICE_ORDER")
RESULT_AFFECTING_PREFIXES = ("NCCL_",)


# Environment variables that override the TF32 flags inside NVIDIA's libraries: (the value that acts,
# what it does, the modes it breaks). NVIDIA's NGC PyTorch containers set the first.
TF32_OVERRIDES = {
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": ("1", "makes cuBLAS use TF32 whatever the flags say", "ieee"),
    "NVIDIA_TF32_OVERRIDE": ("0", "disables TF32 inside NVIDIA's libraries", "tf32"),
}


def tf32_override_problems(fp32_math: str, environ=None) -> list[str]:
    """Why `fp32_math` ("ieee" or "tf32") cannot run as it says under the environment's overrides."""
    environ = os.environ if environ is None else environ
    return [f"{name}={value} {what} (`unset {name}` to measure it)"
            for name, (value, what, breaks) in TF32_OVERRIDES.items()
            if environ.get(name) == value and breaks == fp32_math]


def tf32_override_notes(environ=None) -> list[str]:
    """One line per TF32 override set in `environ`, with the modes it stops and how to clear it."""
    environ = os.environ if environ is None else environ
    stops = {"ieee": "fp32 and the AMP modes cannot run as IEEE FP32 and are refused",
             "tf32": "tf32 cannot run as TF32 and is refused"}
    return [f"{name}={value} {what}, so {stops[breaks]}: `unset {name}` to measure every mode"
            for name, (value, what, breaks) in TF32_OVERRIDES.items() if environ.get(name) == value]


def result_affecting_env(environ=None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ)
            if k in RESULT_AFFECTING_ENV or k.startswith(RESULT_AFFECTING_PREFIXES)}


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def versions() -> dict[str, str]:
    """Library versions; importing torch is needed for its CUDA/cuDNN builds but creates no context."""
    import torch
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "torch_git_version": getattr(torch.version, "git_version", "") or "",
        "torch_cuda_version": torch.version.cuda or "",
        "cudnn_version": str(cudnn) if cudnn else "",
        "torchvision_version": package_version("torchvision"),
        "transformers_version": package_version("transformers"),
        "amp_bench_version": package_version("amp_bench"),
    }


def host_facts() -> dict[str, object]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "env": result_affecting_env(),
        "argv": sys.argv,
    }


def gpu_facts(device) -> dict[str, object]:
    """Driver and board facts through NVML (empty values, with the reason, where unreadable). The
    UUID comes from torch first (device.uuid), so two GPUs of one node differ without NVML too."""
    facts: dict[str, object] = {"nvml": ""}
    if device.type != "cuda":
        return facts
    facts["gpu_uuid"] = getattr(device, "uuid", "") or None
    from amp_bench.platform.nvml import cuda_identity, device_handle, load_nvml
    try:
        nvml = load_nvml()
        handle, note = device_handle(nvml, *cuda_identity(device.index or 0))
        if note:
            facts["nvml_device"] = note
    except Exception as exc:
        facts["nvml"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return facts

    def read(name, call, convert=lambda v: v):
        try:
            facts[name] = convert(call())
        except Exception as exc:
            facts[name] = None
            facts.setdefault("unreadable", {})[name] = f"{type(exc).__name__}: {exc}"

    def text(value):
        return value.decode() if isinstance(value, bytes) else str(value)

    read("driver_version", nvml.nvmlSystemGetDriverVersion, text)
    from_torch = facts.get("gpu_uuid")
    read("gpu_uuid", lambda: nvml.nvmlDeviceGetUUID(handle), text)
    facts["gpu_uuid"] = facts["gpu_uuid"] or from_torch
    read("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
    read("application_sm_clock_mhz", lambda: nvml.nvmlDeviceGetApplicationsClock(handle, nvml.NVML_CLOCK_SM))
    read("application_mem_clock_mhz", lambda: nvml.nvmlDeviceGetApplicationsClock(handle, nvml.NVML_CLOCK_MEM))
    read("persistence_mode", lambda: nvml.nvmlDeviceGetPersistenceMode(handle), bool)
    read("mig_mode", lambda: nvml.nvmlDeviceGetMigMode(handle)[0], bool)
    return facts


def _run(command: list[str], timeout: float = 60) -> str | None:
    import subprocess
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


CONDA_EXPORT_TIMEOUT_S = 30.0  # `conda env export` can take minutes on a large conda image
CONDA_EXPORT_ENV = "AMP_BENCH_CONDA_EXPORT"  # "0": skip it (the GPU check does)


def software_record() -> dict[str, object]:
    """What it takes to rebuild the environment: the git commit, the installed packages as pip freeze
    lists them (`pip_freeze`), and the conda environment (without its prefix line) when running inside
    one. The conda export is bounded (CONDA_EXPORT_TIMEOUT_S) and skipped where AMP_BENCH_CONDA_EXPORT=0;
    either way `conda_env` says why."""
    record: dict[str, object] = {}
    commit = _run(["git", "rev-parse", "HEAD"], 10)
    if commit:
        dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], 10)
        record["git_commit"] = commit.strip() + ("-dirty" if dirty and dirty.strip() else "")
    record["pip_freeze"] = installed_packages()
    if os.environ.get("CONDA_PREFIX"):
        record["conda_env"] = conda_export()
    return record


def installed_packages() -> list[str]:
    """pip freeze's lines read from the packages' own metadata (importlib.metadata, the standard
    library's reader of what pip wrote): `name==version`, or `-e URL` / `name @ URL` for an editable or
    direct-URL install (PEP 610's direct_url.json), sorted, without pip's own tools, as pip freeze
    lists them. Starting `pip freeze` instead cost about 0.5 s of CPU each run. An installed
    .dist-info is preferred to a source checkout's .egg-info of the same name (the checkout is on
    sys.path when a run starts from it)."""
    found: dict[str, list] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in PIP_FREEZE_SKIPS:
            found.setdefault(name.lower(), []).append(dist)
    chosen = (next((d for d in dists if str(getattr(d, "_path", "")).endswith(".dist-info")), dists[0])
              for _, dists in sorted(found.items()))
    return [_freeze_line(dist.metadata["Name"], dist) for dist in chosen]


PIP_FREEZE_SKIPS = ("pip", "setuptools", "wheel", "distribute")  # pip freeze leaves them out too


def _freeze_line(name: str, dist) -> str:
    import json
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except (OSError, ValueError):
        direct = None
    if isinstance(direct, dict) and direct.get("url"):
        if (direct.get("dir_info") or {}).get("editable"):
            return f"-e {direct['url']}"
        if "dir_info" in direct or "archive_info" in direct or "vcs_info" in direct:
            return f"{name} @ {direct['url']}"
    return f"{name}=={dist.version}"


def conda_export(timeout_s: float = CONDA_EXPORT_TIMEOUT_S) -> str:
    if os.environ.get(CONDA_EXPORT_ENV) == "0":
        return f"not recorded ({CONDA_EXPORT_ENV}=0)"
    export = _run(["conda", "env", "export", "--no-builds"], timeout_s)
    if export is None:
        return f"not recorded (`conda env export` failed or took over {timeout_s:.0f} s)"
    return "".join(line for line in export.splitlines(keepends=True) if not line.startswith("prefix:"))
