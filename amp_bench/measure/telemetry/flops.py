"""FLOPs of one full training step, counted once per case outside the timed window, and the
achieved rate and MFU derived from them."""
from __future__ import annotations


def count_step_flops(step, inputs, target, marks=None) -> int:
    """FLOPs of forward + backward as torch's FlopCounterMode counts them (matmul, conv, attention at
    2 FLOPs per multiply-add; elementwise ops and the optimizer are not counted). A compiled model is
    counted on its original module (`_orig_mod`), run eagerly for this one step: the compiled graph's
    kernels (Triton GEMM templates under max-autotune) are invisible to the counter. `marks`: the
    step's phase marks (a per-phase memory probe's), for one step that serves both."""
    from torch.utils.flop_counter import FlopCounterMode
    compiled = step.model
    step.model = getattr(compiled, "_orig_mod", compiled)
    try:
        with FlopCounterMode(display=False) as counter:
            step(inputs, target, marks=marks) if marks is not None else step(inputs, target)
    finally:
        step.model = compiled
    return int(counter.get_total_flops())


def flops_columns(flops: int | None, step_time_ms: float | None, peak: float | None, peak_source: str,
                  bf16_peak: float | None = None) -> dict:
    """`mfu` is against the case's own mode's dense peak (peak_tflops_source says which);
    `mfu_bf16_basis` against the device's bf16 dense peak, one basis for every mode: fp8 trains only
    the linear layers in float8 (GPT-2's lm_head and attention stay bf16), so its `mfu` against the
    fp8 peak alone understates it and does not compare with a bf16 case's. Not counted here: the peaks alone."""
    from amp_bench.stats import achieved_rate
    peaks = {"peak_tflops": peak, "peak_tflops_source": peak_source, "peak_tflops_bf16": bf16_peak}
    return peaks if flops is None else {"flops_per_step": flops, **achieved_rate(flops, step_time_ms, peak), **peaks,
                                        "mfu_bf16_basis": achieved_rate(flops, step_time_ms, bf16_peak)["mfu"]}
