"""Dense peak TFLOP/s per GPU model and math mode, for model-FLOPs utilisation (MFU).

Matched on the exact device name torch reports. Variants with different clocks or power (PCIe, NVL,
A10G, ...) are deliberately absent: an unknown GPU gets an empty MFU, never a guess. A user can give
the peak in the suite (`peak_tflops`) or with `--peak-tflops`.
"""
from __future__ import annotations

import re

from amp_bench import modes

# (name pattern, {mode: dense peak TFLOP/s}, source). fp32 = plain FP32 FMA rate; tf32/fp16/bf16/fp8 =
# dense tensor-core rates (no sparsity: datasheets print FP8 with sparsity, this is half of it).
# Sources: the vendor datasheet each entry names (docs/sources.md, "Hardware").
# The RTX 4090 has no FP8 entry: published dense FP8 rates for it disagree by 2x (FP16 vs FP32
# accumulate), and an unknown peak gives an empty MFU, never a guess.
PEAKS: list[tuple[str, dict[str, float], str]] = [
    (r"Tesla V100-SXM2-(16|32)GB", {"fp32": 15.7, "fp16": 125.0},
     "NVIDIA V100 datasheet (SXM2): 15.7 FP32, 125 tensor FP16"),
    (r"Tesla T4", {"fp32": 8.1, "fp16": 65.0}, "NVIDIA T4 datasheet: 8.1 FP32, 65 FP16 tensor"),
    (r"NVIDIA A100-SXM4-(40|80)GB", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
     "NVIDIA A100 datasheet (SXM): 19.5 FP32, 156 TF32, 312 FP16/BF16 dense"),
    (r"NVIDIA A10", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
     "NVIDIA A10 datasheet: 31.2 FP32, 62.5 TF32, 125 FP16/BF16 dense"),
    (r"NVIDIA GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "fp16": 165.0, "bf16": 165.0},
     "NVIDIA Ada whitepaper (RTX 4090): 82.6 FP32, 82.6 TF32, 165 FP16/BF16 dense (FP32 accumulate)"),
    (r"NVIDIA L4", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5},
     "NVIDIA L4 datasheet: 30.3 FP32, 60 TF32, 121 FP16/BF16 dense, 485 FP8 with sparsity (242.5 dense)"),
    (r"NVIDIA L40S", {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0, "fp8": 733.0},
     "NVIDIA L40S datasheet: 91.6 FP32, 183 TF32, 362 FP16/BF16 dense, 733 FP8 dense"),
    (r"NVIDIA H100 80GB HBM3", {"fp32": 67.0, "tf32": 495.0, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
     "NVIDIA H100 datasheet (SXM5): 67 FP32, 495 TF32, 989 FP16/BF16 dense, 3958 FP8 with sparsity (1979 dense)"),
    (r"NVIDIA H200", {"fp32": 67.0, "tf32": 495.0, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
     "NVIDIA H200 datasheet (SXM): 67 FP32, 495 TF32, 989 FP16/BF16 dense, 3958 FP8 with sparsity (1979 dense)"),
]


def peak_tflops(device_name: str, precision: str) -> tuple[float | None, str]:
    """(dense peak TFLOP/s, source) for a device name and precision mode; (None, why) when unknown."""
    math = modes.get(precision).peak_math
    for pattern, peaks, source in PEAKS:
        if re.fullmatch(pattern, device_name.strip()):
            if math in peaks:
                return peaks[math], source
            return None, f"the peak table has no {math} rate for {device_name} (give peak_tflops for its MFU)"
    return None, f"no peak-rate entry for {device_name!r} (give peak_tflops in the suite or --peak-tflops)"
