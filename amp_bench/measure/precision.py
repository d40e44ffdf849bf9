"""A precision mode's torch side: the FP32 math flags, the autocast region and the GradScaler.

The mode itself is the registry's (amp_bench.modes.Mode, one definition); applying it sets the
process-wide FP32 math flags (workers are fresh processes, so nothing leaks between cases). Autocast is
entered per step by the step itself, never as global state.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

from amp_bench import modes
from amp_bench.platform.provenance import tf32_override_problems


def torch_dtype(mode: modes.Mode) -> torch.dtype | None:
    """The torch dtype of a mode's autocast region (modes.Mode names it; None: no autocast)."""
    return getattr(torch, mode.autocast_dtype) if mode.autocast_dtype else None


def _has_fp32_precision_api() -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def set_fp32_math(fp32_math: str) -> None:
    """Set TF32 on or off for matmul *and* cuDNN (cuDNN's TF32 is on by default).

    Written through the legacy allow_tf32 flags on purpose: on torch 2.9-2.14 a write through the
    newer per-backend fp32_precision API makes every later read of a legacy flag raise (as user
    code, inductor or a library may do), while a legacy write keeps both APIs readable.
    """
    if fp32_math not in ("ieee", "tf32"):
        raise ValueError(f"fp32_math must be 'ieee' or 'tf32', not {fp32_math!r}")
    allow = fp32_math == "tf32"
    try:
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
    except (RuntimeError, AttributeError):  # a torch that dropped the legacy flags
        torch.backends.cuda.matmul.fp32_precision = fp32_math
    if _has_fp32_precision_api():
        # cuDNN conv and RNN explicitly as well: the legacy False writes "none" (inherit), which still
        # resolves to TF32 when the cuDNN- or generic-level fp32_precision says tf32. The same value as
        # the legacy flag keeps the two APIs consistent, so legacy reads stay valid.
        for backend in (torch.backends.cudnn.conv, torch.backends.cudnn.rnn):
            with contextlib.suppress(RuntimeError, AttributeError):
                backend.fp32_precision = fp32_math


class Fp32MathError(RuntimeError):
    """FP32 math would not run as the mode says (TF32 still used, or TF32 disabled): the case errors."""


def fp32_math_problems(fp32_math: str, flags: dict, env=None) -> list[str]:
    """Why FP32 math outside autocast would not run as `fp32_math` says, from the flags as they
    resolved (read_fp32_math_flags) and, on CUDA, the environment (`env`); empty when it will."""
    tf32 = fp32_math == "tf32"
    problems = []
    for key, what in (("tf32_matmul", "matmul (cuBLAS)"), ("tf32_cudnn", "cuDNN")):
        if flags.get(key) is None:
            problems.append(f"{what}: the TF32 flag cannot be read (legacy and per-backend settings are mixed)")
        elif bool(flags[key]) != tf32:
            problems.append(f"{what} resolves to {'TF32' if flags[key] else 'IEEE FP32'}")
    for key, what in (("fp32_precision_matmul", "matmul"), ("fp32_precision_cudnn_conv", "cuDNN conv"),
                      ("fp32_precision_cudnn_rnn", "cuDNN RNN")):
        if flags.get(key) and (flags[key] == "tf32") != tf32:  # torch >= 2.9: the per-backend setting, resolved
            problems.append(f"{what} fp32_precision resolves to {flags[key]}")
    matmul_precision = flags.get("float32_matmul_precision")
    if matmul_precision and (matmul_precision != "highest") != tf32:
        problems.append(f"float32_matmul_precision is {matmul_precision}")
    return problems + tf32_override_problems("tf32" if tf32 else "ieee", env or {})


def check_fp32_math(mode_name: str, fp32_math: str, flags: dict, env=None) -> None:
    """Raise Fp32MathError (one line) when FP32 math would not run as the mode says."""
    problems = fp32_math_problems(fp32_math, flags, env)
    if problems:
        want = "TF32" if fp32_math == "tf32" else "strict IEEE FP32"
        raise Fp32MathError(f"{mode_name} needs {want} outside autocast, but " + "; ".join(problems))


def _read(getter):
    with contextlib.suppress(RuntimeError, AttributeError):
        return getter()
    return None


def read_fp32_math_flags() -> dict[str, object]:
    """The TF32-related settings as they stand now, through both APIs, for the result row."""
    flags = {
        "tf32_matmul": _read(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "tf32_cudnn": _read(lambda: bool(torch.backends.cudnn.allow_tf32)),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision) or "",
        "fp32_precision_matmul": "",
        "fp32_precision_cudnn_conv": "",
        "fp32_precision_cudnn_rnn": "",
    }
    if _has_fp32_precision_api():
        flags["fp32_precision_matmul"] = _read(lambda: torch.backends.cuda.matmul.fp32_precision) or ""
        flags["fp32_precision_cudnn_conv"] = _read(lambda: torch.backends.cudnn.conv.fp32_precision) or ""
        flags["fp32_precision_cudnn_rnn"] = _read(lambda: torch.backends.cudnn.rnn.fp32_precision) or ""
        if flags["tf32_matmul"] is None:  # legacy reads refused: derive from the new API
            flags["tf32_matmul"] = flags["fp32_precision_matmul"] == "tf32"
            flags["tf32_cudnn"] = flags["fp32_precision_cudnn_conv"] == "tf32"
    return flags


def autocast_region(mode: modes.Mode, device_type: str):
    """A fresh autocast context for one step (disabled for the FP32 modes)."""
    return torch.autocast(device_type, dtype=torch_dtype(mode) or torch.bfloat16, enabled=mode.uses_autocast)


def make_grad_scaler(mode: modes.Mode, device_type: str) -> torch.amp.GradScaler:
    return torch.amp.GradScaler(device_type, enabled=mode.grad_scaler)


def autocast_engages(mode: modes.Mode, device_type: str) -> tuple[bool, str]:
    """Prove autocast is really active: it silently disables itself on an unsupported device/dtype.

    Runs a tiny linear inside the region and checks the output dtype.
    """
    if not mode.uses_autocast:
        return True, ""
    x = torch.ones(2, 2, device=device_type)
    w = torch.ones(2, 2, device=device_type)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with autocast_region(mode, device_type):
                out = torch.nn.functional.linear(x, w)
        except Exception as exc:  # an unsupported combination may also raise
            return False, f"autocast({device_type}, {mode.autocast_dtype}) failed: {exc}"
    if out.dtype != torch_dtype(mode):
        why = "; ".join(str(w.message) for w in caught) or "no warning given"
        return False, (f"autocast({device_type}, {mode.autocast_dtype}) did not engage: linear returned "
                       f"{out.dtype} ({why})")
    return True, ""
