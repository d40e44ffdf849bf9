"""GradScaler health: what the loss scale did over a run, and which gradients fp16 loses.

Two views, both read outside any timed window:
  * the scale after every step (TrainStep keeps it on the device): skipped steps are exactly the
    steps after which the scale fell, and a scale below 1 means the scaler was shrinking gradients
    that already overflowed at scale 1 (the model is not fp16-safe);
  * a gradient-underflow probe: on the same weights and batch, the fraction of gradient elements
    that are non-zero in FP32 but exactly zero under autocast, with the scaler's current scale and
    without any scaling. The second figure is what GradScaler is there to prevent.
"""
from __future__ import annotations

import contextlib
import math

import torch

from amp_bench import modes
from amp_bench.measure.models import forward
from amp_bench.measure.precision import autocast_region


def scale_history(initial_scale: float | None, scales: list[float]) -> dict:
    """Summary of a loss-scale series (scales[i] is the scale after step i)."""
    if initial_scale is None or not scales:
        return {}
    values = [initial_scale, *scales]
    skipped = [i for i in range(len(scales)) if values[i + 1] < values[i]]
    grown = [i for i in range(len(scales)) if values[i + 1] > values[i]]
    low = min(values)
    return {
        "scaler_initial_scale": initial_scale,
        "scaler_final_scale": scales[-1],
        "scaler_min_scale": low,
        "scaler_max_scale": max(values),
        "scaler_skipped_steps": len(skipped),
        "scaler_skipped_step_indices": skipped,
        "scaler_growth_steps": len(grown),
        "scaler_scale_below_one": bool(low < 1.0),
    }


class _Untouched:
    """Probe passes without a trace: every pass starts from the same buffers (batch-norm
    statistics) and RNG streams (dropout masks), and both are restored afterwards, so the passes
    compare like with like and training continues exactly as it would have without the probe."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (torch.cuda.get_rng_state_all()
                         if torch.cuda.is_available() and torch.cuda.is_initialized() else None)

    def reset(self) -> None:
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(self.buffers[name])
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _grads(model, loss_fn, inputs, target, mode: modes.Mode | None, device_type: str, scale: float):
    params = [p for p in model.parameters() if p.requires_grad]
    with autocast_region(mode, device_type) if mode is not None else contextlib.nullcontext():
        loss = loss_fn(forward(model, inputs), target)
    grads = torch.autograd.grad(loss.float() * scale, params, allow_unused=True)
    return [(g.float() / scale) if g is not None else torch.zeros_like(p, dtype=torch.float32)
            for g, p in zip(grads, params, strict=True)]


def gradient_underflow(model, loss_fn, inputs, target, mode: modes.Mode, device_type: str, scale: float | None) -> dict:
    """Fractions of gradient elements that are zero under FP32 and under `mode`'s autocast, and the
    fraction that underflowed (non-zero in FP32, zero under autocast), with `scale` and unscaled."""
    state = _Untouched(model)
    try:
        reference = torch.cat([g.flatten() for g in _grads(model, loss_fn, inputs, target, None, device_type, 1.0)])
        runs = {"unscaled": 1.0}
        if scale is not None and scale != 1.0:
            runs["scaled"] = float(scale)
        out = {"grad_elements": reference.numel(), "grad_zero_fraction_fp32": float((reference == 0).float().mean())}
        nonzero = reference != 0
        for name, factor in runs.items():
            state.reset()
            amp = torch.cat([g.flatten() for g in _grads(model, loss_fn, inputs, target, mode, device_type, factor)])
            finite = torch.isfinite(amp)
            out[f"grad_zero_fraction_{name}"] = float(((amp == 0) & finite).float().mean())
            out[f"grad_underflow_fraction_{name}"] = float(((amp == 0) & nonzero).float().mean())
            out[f"grad_nonfinite_fraction_{name}"] = float((~finite).float().mean())
    finally:
        state.reset()
    if "scaled" not in runs:  # no scaler (bf16) or scale 1: the scaled view is the unscaled one
        for key in ("zero", "underflow", "nonfinite"):
            out[f"grad_{key}_fraction_scaled"] = out[f"grad_{key}_fraction_unscaled"]
    out["probe_scale"] = float(scale) if scale is not None else math.nan
    return out
