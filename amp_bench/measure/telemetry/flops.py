"""FLOPs of one full training step, counted once per case outside the timed window, and the
achieved rate and MFU derived from them."""
from __future__ import annotations


def count_step_flops(step, inputs, target) -> int:
    """FLOPs of forward + backward as torch's FlopCounterMode counts them (matmul, conv, attention at
    2 FLOPs per multiply-add; elementwise ops and the optimizer are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        step(inputs, target)
    return int(counter.get_total_flops())


def flops_columns(flops: int | None, step_time_ms: float | None, peak: float | None, peak_source: str) -> dict:
    from amp_bench.stats import achieved_rate
    return {"flops_per_step": flops, **achieved_rate(flops, step_time_ms, peak), "peak_tflops": peak,
            "peak_tflops_source": peak_source}
