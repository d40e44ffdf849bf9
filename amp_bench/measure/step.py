"""The measured unit: one full training step, AMP done the way users write it.

zero_grad -> autocast(forward + loss) -> GradScaler.scale(loss).backward() -> scaler.step ->
scaler.update. The scaler is inside the timed step (no dummy scaler), so fp16's real cost shows.
"""
from __future__ import annotations

import torch

from amp_bench import modes
from amp_bench.measure.models import forward
from amp_bench.measure.precision import autocast_region, make_grad_scaler
from amp_bench.suite import OptimizerSpec


class UnsupportedCase(Exception):
    """The hardware or this torch cannot run the case as asked; recorded as status 'unsupported'."""


def build_optimizer(params, spec: OptimizerSpec) -> torch.optim.Optimizer:
    impl = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[spec.impl]
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, **impl)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.name]
    return cls(params, lr=spec.lr, weight_decay=spec.weight_decay, **impl)


class TrainStep:
    """Callable that runs one training step and returns a detached copy of the loss (no host sync)."""

    def __init__(self, model, loss_fn, optimizer, mode: modes.Mode, device_type: str):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.mode = mode
        self.device_type = device_type
        self.scaler = make_grad_scaler(mode, device_type)
        self.initial_scale = float(self.scaler.get_scale()) if self.scaler.is_enabled() else None
        self.scales: list[torch.Tensor] = []  # loss scale after each step, kept on the device
        self._untimed: list[int] = []  # indices into scales of steps outside warmup and window
        self.output_dtype: torch.dtype | None = None

    def __call__(self, inputs, target, marks=None) -> torch.Tensor:
        """`marks(phase)` is called at each phase boundary (forward, backward, optimizer, end); only
        the instrumented step outside the timed window passes it."""
        self.optimizer.zero_grad(set_to_none=True)
        if marks:
            marks("forward")
        with autocast_region(self.mode, self.device_type):
            output = forward(self.model, inputs)
            loss = self.loss_fn(output, target)
        if self.output_dtype is None:
            self.output_dtype = _dtype_of(output)
        if marks:
            marks("backward")
        if self.scaler.is_enabled():
            self.scaler.scale(loss).backward()
            if marks:
                marks("optimizer")
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # GradScaler keeps its scale as a device tensor; cloning it avoids the host sync that
            # get_scale() would add to every step. The skip count is read once, after the window.
            scale = getattr(self.scaler, "_scale", None)
            self.scales.append(scale.detach().clone() if isinstance(scale, torch.Tensor)
                               else torch.tensor(float(self.scaler.get_scale())))
        else:
            loss.backward()
            if marks:
                marks("optimizer")
            self.optimizer.step()
        if marks:
            marks("end")
        # a copy, not a view: under reduce-overhead (CUDA graphs) the loss can be a view of a graph
        # output that the next replay overwrites. One scalar copy on the device, no host sync.
        return loss.detach().clone()

    @property
    def scaler_host_sync(self) -> bool:
        """Whether GradScaler.step() syncs host and device every step: with an optimizer that cannot
        take the scale itself it reads found_inf with .item() (a sync the bf16 and fp32 steps don't
        pay); fused optimizers (_step_supports_amp_scaling) take it on the device."""
        return self.scaler.is_enabled() and not getattr(self.optimizer, "_step_supports_amp_scaling", False)

    def untimed_step(self, inputs, target) -> None:
        """One step outside both warmup and the measured window (the settle step before the window):
        it moves the loss scale like any step but takes no place in the step numbering; a skip there
        counts as a skip of the step before it (warmup)."""
        self(inputs, target)
        if self.scaler.is_enabled():
            self._untimed.append(len(self.scales) - 1)

    def skipped_steps(self, first: int | None = None, last: int | None = None) -> list[int]:
        """Indices of steps whose update was skipped: a skip is exactly a scale decrease."""
        from amp_bench.measure.scaler_health import scale_history
        if not self.scales:
            return []
        scales = torch.stack([s.float().cpu() for s in self.scales]).tolist()
        raw = scale_history(self.initial_scale, scales)["scaler_skipped_step_indices"]
        skipped = [i - sum(u <= i for u in self._untimed) for i in raw]  # renumbered without untimed steps
        last = len(scales) - len(self._untimed) if last is None else last
        return [i for i in skipped if (first is None or first <= i) and i < last]

    def final_scale(self) -> float | None:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else None


def _dtype_of(output) -> torch.dtype | None:
    if isinstance(output, torch.Tensor):
        return output.dtype
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits.dtype
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0].dtype
    return None
