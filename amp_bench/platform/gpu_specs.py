"""The GPUs `predict` can scale a profiled step to: memory bandwidth, SM count, boost clock, power and
compute capability, each with its source; torch-free data.

One home per figure: the dense peak TFLOP/s per math unit come from peaks.PEAKS (the MFU table),
matched on the same torch device name. The variants that table deliberately leaves out (PCIe cards
with their own clocks and power: V100 PCIe, A100 PCIe 40/80GB, H100 PCIe; an unknown GPU gets an empty
MFU there, never a guess) carry their own datasheet rates here, used only for prediction. Every rate
is dense (no 2:4 sparsity). Achievable fractions of those peaks are in ACHIEVABLE, with theirs.

Units: bandwidth GB/s (1e9 bytes/s), clocks MHz, TFLOP/s (1e12). Math units: "fp32" (FP32 FMA on the
SIMT cores), "tf32", "fp16", "bf16", "fp8" (dense tensor-core rates).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from amp_bench.platform.peaks import PEAKS

# Compute capability -> architecture family (first match wins on major.minor, then major).
_ARCH_BY_CC = {(7, 0): "Volta", (7, 2): "Volta", (7, 5): "Turing", (8, 0): "Ampere", (8, 6): "Ampere",
               (8, 7): "Ampere", (8, 9): "Ada", (9, 0): "Hopper"}
_ARCH_BY_MAJOR = {6: "Pascal", 10: "Blackwell", 12: "Blackwell"}


def architecture(capability: tuple[int, int]) -> str:
    return _ARCH_BY_CC.get(tuple(capability)) or _ARCH_BY_MAJOR.get(capability[0], f"sm_{capability[0]}{capability[1]}")


@dataclass(frozen=True)
class GpuSpec:
    key: str  # what --target takes: "h100-sxm"
    label: str  # how a table names it: "H100 SXM 80GB"
    device_name: str  # torch.cuda.get_device_name() of this GPU: the source run's name is matched on it
    capability: tuple[int, int]
    sms: int
    boost_mhz: int
    bandwidth_gbs: float
    tdp_w: int
    source: str  # where bandwidth, SMs, clock and power come from
    own_peaks: dict = field(default_factory=dict)  # only for GPUs peaks.PEAKS leaves out
    own_peaks_source: str = ""
    chip: str = ""  # the silicon (GV100, GA100, ...): boards of one chip share its measured fractions

    def peaks(self) -> tuple[dict[str, float], str]:
        """{math unit: dense peak TFLOP/s} and their source."""
        if self.own_peaks:
            return dict(self.own_peaks), self.own_peaks_source
        for pattern, rates, source in PEAKS:
            if re.fullmatch(pattern, self.device_name):
                return dict(rates), source
        return {}, f"no peak rates for {self.device_name}"

    def peak(self, unit: str) -> float | None:
        return self.peaks()[0].get(unit)


# Datasheet sources (NVIDIA product datasheets and architecture whitepapers):
_V100 = "NVIDIA Tesla V100 datasheet (2020) and Volta whitepaper: 80 SMs, HBM2 900 GB/s"
_A100 = "NVIDIA A100 datasheet (2021) and Ampere GA100 whitepaper: 108 SMs, boost 1410 MHz"
_ADA = "NVIDIA Ada Lovelace (AD10x) whitepaper v1.1 and the product datasheet"
_H100 = "NVIDIA H100 datasheet (2023) and Hopper whitepaper"

SPECS: list[GpuSpec] = [
    GpuSpec("v100-sxm2", "V100 SXM2", "Tesla V100-SXM2-16GB", (7, 0), 80, 1530, 900, 300,
            _V100 + ", SXM2 boost 1530 MHz, 300 W", chip="GV100"),
    GpuSpec("v100-pcie", "V100 PCIe", "Tesla V100-PCIE-32GB", (7, 0), 80, 1380, 900, 250,
            _V100 + ", PCIe boost 1380 MHz, 250 W",
            {"fp32": 14.0, "fp16": 112.0}, "NVIDIA Tesla V100 datasheet (PCIe): 14 FP32, 112 tensor FP16",
            chip="GV100"),
    GpuSpec("t4", "T4", "Tesla T4", (7, 5), 40, 1590, 320, 70,
            "NVIDIA T4 datasheet and Turing whitepaper: 40 SMs, boost 1590 MHz, GDDR6 320 GB/s, 70 W", chip="TU104"),
    GpuSpec("a100-40gb", "A100 SXM 40GB", "NVIDIA A100-SXM4-40GB", (8, 0), 108, 1410, 1555, 400,
            _A100 + ", SXM 40GB HBM2 1555 GB/s, 400 W", chip="GA100"),
    GpuSpec("a100-80gb", "A100 SXM 80GB", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 1410, 2039, 400,
            _A100 + ", SXM 80GB HBM2e 2039 GB/s, 400 W", chip="GA100"),
    GpuSpec("a100-pcie-40gb", "A100 PCIe 40GB", "NVIDIA A100-PCIE-40GB", (8, 0), 108, 1410, 1555, 250,
            _A100 + ", PCIe 40GB HBM2 1555 GB/s, 250 W",
            {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
            "NVIDIA A100 datasheet (PCIe): 19.5 FP32, 156 TF32, 312 FP16/BF16 dense", chip="GA100"),
    GpuSpec("a100-pcie-80gb", "A100 PCIe 80GB", "NVIDIA A100 80GB PCIe", (8, 0), 108, 1410, 1935, 300,
            _A100 + ", PCIe 80GB HBM2e 1935 GB/s, 300 W",
            {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
            "NVIDIA A100 datasheet (PCIe): 19.5 FP32, 156 TF32, 312 FP16/BF16 dense", chip="GA100"),
    GpuSpec("a10", "A10", "NVIDIA A10", (8, 6), 72, 1695, 600, 150,
            "NVIDIA A10 datasheet and Ampere GA102 whitepaper: 72 SMs, boost 1695 MHz, GDDR6 600 GB/s, 150 W",
            chip="GA102"),
    GpuSpec("l4", "L4", "NVIDIA L4", (8, 9), 58, 2040, 300, 72,
            _ADA + ": L4, 58 SMs, boost 2040 MHz, GDDR6 300 GB/s, 72 W", chip="AD104"),
    GpuSpec("l40s", "L40S", "NVIDIA L40S", (8, 9), 142, 2520, 864, 350,
            _ADA + ": L40S, 142 SMs, boost 2520 MHz, GDDR6 864 GB/s, 350 W", chip="AD102"),
    GpuSpec("rtx-4090", "RTX 4090", "NVIDIA GeForce RTX 4090", (8, 9), 128, 2520, 1008, 450,
            _ADA + ": RTX 4090, 128 SMs, boost 2520 MHz, GDDR6X 1008 GB/s, 450 W", chip="AD102"),
    GpuSpec("h100-sxm", "H100 SXM 80GB", "NVIDIA H100 80GB HBM3", (9, 0), 132, 1980, 3350, 700,
            _H100 + ": SXM5, 132 SMs, boost 1980 MHz, HBM3 3350 GB/s, 700 W", chip="GH100"),
    GpuSpec("h100-pcie", "H100 PCIe 80GB", "NVIDIA H100 PCIe", (9, 0), 114, 1755, 2000, 350,
            _H100 + ": PCIe, 114 SMs, boost 1755 MHz, HBM2e 2000 GB/s, 350 W",
            {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
            "NVIDIA H100 datasheet (PCIe): 51 FP32; 756 TF32, 1513 FP16/BF16, 3026 FP8 with sparsity "
            "(378, 756, 1513 dense)", chip="GH100"),
    GpuSpec("h200", "H200 SXM 141GB", "NVIDIA H200", (9, 0), 132, 1980, 4800, 700,
            "NVIDIA H200 datasheet (2024): SXM, HBM3e 4800 GB/s, 700 W; SMs and clock as H100 SXM5 "
            "(Hopper whitepaper)", chip="GH100"),
]

# Achievable fractions of the datasheet peaks. The default is what this project measured on an H200
# (docs/sources.md, "Hardware"): a bf16 8192^3 matmul reached ~790 of 989 TFLOP/s (0.80)
# and a device copy ~4.3 of 4.8 TB/s (0.90); it stands for every GPU and unit not measured, an assumption.
ACHIEVABLE = {"compute": 0.80, "bandwidth": 0.90}
ACHIEVABLE_SOURCE = ("measured on an H200 by this project: bf16 matmul 790/989 TFLOP/s, device copy 4.3/4.8 TB/s "
                     "(docs/sources.md)")
# Measured per GPU: the 90th percentile of the FP32 TFLOP/s (TF32 off) of 1040 standalone linear layers and
# of the GB/s of ~650 standalone elementwise ops per GPU, in NeuSight's operator dataset (github.com/
# sitar-lab/NeuSight, MIT: scripts/asplos/data/dataset/test/linear.csv and elem.csv; torch 2.1, CUDA 12.1),
# over the datasheet figure; `python benchmarks/predict_neusight.py fractions --repo ...` recomputes them.
# Microbenchmarks only: NeuSight's model labels, which docs/predict.md scores, played no part.
MEASURED_FRACTIONS = {
    "v100-pcie": {"fp32": 0.99, "bandwidth": 0.92},
    "a100-pcie-40gb": {"fp32": 0.84, "bandwidth": 0.89},
    "a100-pcie-80gb": {"fp32": 0.93, "bandwidth": 0.87},
    "h100-sxm": {"fp32": 0.77},
    "l4": {"fp32": 0.33, "bandwidth": 0.79},
    "t4": {"fp32": 0.52, "bandwidth": 0.77},
}
MEASURED_SOURCE = "NeuSight's operator microbenchmarks (90th percentile over the datasheet figure)"


def measured_fraction(spec: GpuSpec, resource: str) -> float | None:
    """The measured achievable fraction of a resource on this GPU or, failing that, on a board of its chip
    (an A100 SXM takes its PCIe sibling's: the same GA100 at other clocks and power); None when neither."""
    own = MEASURED_FRACTIONS.get(spec.key, {}).get(resource)
    if own is not None or not spec.chip:
        return own
    siblings = [MEASURED_FRACTIONS[s.key][resource] for s in SPECS
                if s.chip == spec.chip and resource in MEASURED_FRACTIONS.get(s.key, {})]
    return siblings[0] if siblings else None


def achievable(spec: GpuSpec, resource: str) -> tuple[float, str]:
    """(fraction of the datasheet figure reachable, where it comes from) for a math unit or 'bandwidth'."""
    measured = MEASURED_FRACTIONS.get(spec.key, {}).get(resource)
    if measured is not None:
        return measured, MEASURED_SOURCE
    default = ACHIEVABLE["bandwidth" if resource == "bandwidth" else "compute"]
    return default, "not measured for this GPU: " + ACHIEVABLE_SOURCE


def by_key() -> dict[str, GpuSpec]:
    return {spec.key: spec for spec in SPECS}


def find(name: str) -> GpuSpec | None:
    """The spec whose key, label or torch device name is `name` (case-insensitive; the 16/32GB V100 and
    40/80GB names of the same part match their entry); None when none does."""
    low = name.strip().lower()
    found = next((spec for spec in SPECS if low in (spec.key, spec.label.lower(), spec.device_name.lower())), None)
    aliases = {r"tesla v100-sxm2-(16|32)gb": "v100-sxm2", r"tesla v100-pcie-(16|32)gb": "v100-pcie"}
    return found or next((by_key()[key] for pattern, key in aliases.items() if re.fullmatch(pattern, low)), None)
