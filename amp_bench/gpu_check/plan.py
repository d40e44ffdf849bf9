"""The GPU check's plan: which stages each part runs, what each is expected to take on an H200, and
the caps, floors and budgets the script sizes its timeouts from. One home for these figures: the
script reads them (`python3 -m amp_bench.gpu_check plan --part N`), the summary prints the estimate
beside what each stage took, and a test holds every part's estimate under its budget with margin.

The estimates are for an H200 host (16 cores, torch 2.11) and have not been measured yet: the first
reading replaces them. A suite stage's estimate is the sum of its cases' (SUITE_CASES), so a case
added to a check suite without an estimate fails the test that compares the two.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

# Device time is lent 15 minutes at a time, start-up (1-2 minutes) included: both parts' budgets plus
# the start must fit inside it, with room for the idle seconds between the two calls.
DEVICE_WINDOW_S = 900
MACHINE_START_S = 120
# a part's estimate may use at most this share of its budget: the estimates are unmeasured guesses
MAX_ESTIMATE_SHARE = 0.85
CPU_BUDGET_S = 130  # without a GPU: a tiny CPU smoke of the same path


@dataclass(frozen=True)
class Stage:
    name: str
    estimate_s: int  # expected on an H200 (unmeasured)
    cap_s: int  # the most its timeout may be (GPU)
    floor_s: int  # the least worth starting it with; later stages reserve it
    what: str
    cpu_cap_s: int | None = None  # the cap on a machine without a GPU (its CPU smoke), if different


@dataclass(frozen=True)
class Part:
    number: int
    budget_s: int
    stages: tuple[Stage, ...]
    pre_s: int = 15  # wheels installed, torch imported, capability read: before any stage
    summaries_s: int = 10  # the summary after each stage (~2 s each) and the last one

    @property
    def estimate_s(self) -> int:
        return self.pre_s + sum(s.estimate_s for s in self.stages) + self.summaries_s

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


# (model label, precision, compile, explain) -> estimated seconds, per check suite. ResNet-50 cases: worker
# start, cuDNN autotuning at batch 256, 20 steps of 0.1-0.3 s. GPT-2 compiled: a cold inductor compile of
# forward + backward (fp8: torchao's float8 linears compile too). The explain case adds CUPTI start-up, a
# few profiled steps and the trace's export and reading.
SUITE_CASES = {
    "suites/gpu_check_part1.yaml": {
        ("resnet50", "fp32", False, False): 15, ("resnet50", "tf32", False, False): 15,
        ("resnet50", "amp_fp16", False, False): 15, ("resnet50", "amp_bf16", False, False): 15,
        ("gpt2-small", "amp_bf16", True, False): 70,
    },
    "suites/gpu_check_part2.yaml": {
        ("gpt2-small", "fp8", True, False): 90,
        ("gpt2-explain", "amp_bf16", False, True): 20,
    },
}
PROBE_S = 10  # a run's device probe (a worker that imports torch)


def suite_estimate(path: str) -> int:
    return PROBE_S + sum(SUITE_CASES[path].values())


PARTS = {
    1: Part(1, 360, (
        Stage("env", 25, 60, 15, "nvidia-smi's query (nothing set), `amp_bench env --json` (conda export skipped), "
                                 "a bf16 8192^3 matmul"),
        Stage("suite", suite_estimate("suites/gpu_check_part1.yaml"), 200, 60,
              "suites/gpu_check_part1.yaml, explain off: the ResNet-50 channels_last bs256 anchors in fp32, tf32, "
              "amp_fp16, amp_bf16 (~15 s each), GPT-2 small compiled amp_bf16 (~70 s, a cold compile)", 60),
        Stage("overhead", 30, 60, 20, "benchmarks/overhead.py: harness against a plain loop, one round "
                                      "(probe ~8 s, 2 workers ~9 s each)", 40),
        Stage("headroom", 65, 100, 30, "suites/gpu_check_headroom.yaml: probe + ~7 probes at resolution 1024"),
    )),
    2: Part(2, 330, (
        Stage("env", 15, 60, 15, "nvidia-smi's query, `amp_bench env --json` (conda export skipped)"),
        Stage("suite", suite_estimate("suites/gpu_check_part2.yaml"), 170, 60,
              "suites/gpu_check_part2.yaml: GPT-2 small compiled fp8 (~90 s, a cold compile), and GPT-2 eager "
              "amp_bf16 with explain on (~20 s), whose breakdown must be ok", 60),
        Stage("pytest", 80, 130, 30, "`pytest -m gpu tests/test_gpu.py`: TF32 vs IEEE, autocast, CUDA events, "
                                     "GradScaler, GPT-2 in fp32 and amp_fp16, one DDP launch, NVML", 40),
        Stage("fidelity", 35, 60, 30, "suites/gpu_check_fidelity.yaml: fp32 and amp_bf16 workers (skipped "
                                      "without scikit-learn)"),
    )),
}
# what each part's suite stage runs (the script passes it to `amp_bench run`)
SUITES = {1: "suites/gpu_check_part1.yaml", 2: "suites/gpu_check_part2.yaml"}
# the part whose suite runs fp8: on compute capability >= 8.9 the script refuses to start it without
# torchao (before it reads this plan: the refusal must not need amp_bench to import)
FP8_PART = 2


def shell(part: Part) -> str:
    """The part's plan as bash assignments for scripts/gpu_check.sh (`eval` it)."""
    names = " ".join(s.name for s in part.stages)
    lines = [f"stages=({names})", f"gpu_budget={part.budget_s}", f"cpu_budget={CPU_BUDGET_S}",
             f"suite_file={shlex.quote(SUITES[part.number])}"]
    for stage in part.stages:
        lines.append(f"cap[{stage.name}]={stage.cap_s}; floor[{stage.name}]={stage.floor_s}; "
                     f"cpu_cap[{stage.name}]={stage.cpu_cap_s or stage.cap_s}")
    return "\n".join(lines)


def describe(part: Part) -> str:
    """The part's stages and estimates, for the log and the summary."""
    rows = [f"  pre        ~{part.pre_s} s: wheels from .whl/, torch imported, capability read"]
    rows += [f"  {s.name:<10} ~{s.estimate_s} s (cap {s.cap_s} s): {s.what}" for s in part.stages]
    rows.append(f"  summaries  ~{part.summaries_s} s")
    return (f"part {part.number}: H200 estimate ~{part.estimate_s} s of a {part.budget_s} s budget "
            "(unmeasured)\n" + "\n".join(rows))


def main(argv: list[str]) -> int:
    """plan --part N [--shell]"""
    try:
        part = PARTS[int(argv[argv.index("--part") + 1])]
    except (ValueError, IndexError, KeyError):
        print("usage: python3 -m amp_bench.gpu_check plan --part 1|2 [--shell]", file=sys.stderr)
        return 2
    print(shell(part) if "--shell" in argv else describe(part))
    return 0
