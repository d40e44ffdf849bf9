"""The GPU check's plan: which stages each part runs, what each is expected to take on an H200, and the caps,
floors and budgets the script sizes its timeouts from. One home for these figures: the script reads them
(`python3 -m amp_bench.gpu_check plan --part N`), the summary prints the estimate beside what each stage
took, and a test holds every part's estimate under 60% of its budget.

The estimates come from the first H200 reading (docs/gpu-validation/2026-12-04-h200-5436a8a, torch 2.11+cu130;
FIRST_LIGHT below), where every stage ran 2-4x over the unmeasured guesses it replaced. What that reading
could not measure is said as such: a worker forked on a GPU host (every worker there was spawned; the fork
rule that refused has changed, amp_bench/platform/forking.py) and the main job's own shape. A stage marked
`extra` is not in the estimate: it runs only with what the estimated stages left, so the readings that
have never been taken come first and cannot be starved by the ones that have.

Part 1 is the main job as a user types it (suites/resnet50.yaml: ResNet-50 bs 256 channels_last in every
mode, amp_bf16 never measured on a GPU before); part 2 is GPT-2 small compiled under amp_bf16 beside fp8, so
fp8's speedup over compiled bf16 exists, and the explain case. A suite stage's estimate is the sum of its
cases' (SUITE_CASES), so a case added to a check suite without an estimate fails the test that compares them.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

# Device time is lent 15 minutes at a time, start-up (1-2 minutes) included: both parts' budgets plus
# the start must fit inside it, with room for the idle seconds between the two calls.
DEVICE_WINDOW_S = 900
MACHINE_START_S = 120
# a part's estimated stages may use at most this share of its budget: the first reading ran 2-4x over guesses
MAX_ESTIMATE_SHARE = 0.60
CPU_BUDGET_S = 130  # without a GPU: a tiny CPU smoke of the same path

# What the first H200 reading measured (seconds), and what the estimates below are built from.
FIRST_LIGHT = {
    "spawned_start_resnet50": 14,  # launch to first step, a spawned worker: 13-15 s (imports, CUDA context)
    "spawned_start_gpt2": 22,  # 19.6-25.6 s
    "worker_resnet50_fp32": 72,  # 5 warmup + 15 steps at bs 256, settle, FLOPs and phase-memory steps
    "worker_resnet50_tf32": 36,
    "worker_resnet50_amp_fp16": 28,
    "worker_gpt2_fp8_compiled": 115,  # compile 89 s
    "env_part1": 12, "env_part2": 7,  # nvidia-smi, amp_bench env, the matmul (part 1)
    "overhead": 49, "pytest_first_six_tests": 93, "headroom_two_probes": 62,
}
# Not measured there: a forked worker's start on a GPU host. On the CPU a fork starts a worker in 0.1-0.3 s;
# the CUDA context it still creates is in each spawned figure above. Taken as 2 s.
FORK_START_S = 2


def forked(spawned_worker_s: int, spawned_start_s: int) -> int:
    """A first-light worker's seconds with its spawned start replaced by a fork's."""
    return spawned_worker_s - spawned_start_s + FORK_START_S


@dataclass(frozen=True)
class Stage:
    name: str
    estimate_s: int  # expected on an H200 (FIRST_LIGHT)
    cap_s: int  # the most its timeout may be (GPU)
    floor_s: int  # the least worth starting it with; later estimated stages reserve it
    what: str
    cpu_cap_s: int | None = None  # the cap on a machine without a GPU (its CPU smoke), if different
    extra: bool = False  # not in the estimate: runs only with what the estimated stages left


@dataclass(frozen=True)
class Part:
    number: int
    budget_s: int
    stages: tuple[Stage, ...]
    pre_s: int = 15  # wheels installed, torch imported, capability read: before any stage
    summaries_s: int = 10  # the summary after each stage (~2 s each) and the last one

    @property
    def estimate_s(self) -> int:
        return self.pre_s + sum(s.estimate_s for s in self.stages if not s.extra) + self.summaries_s


# (model label, precision, compile, explain) -> estimated seconds, per check suite.
# ResNet-50 (the main job's GPU block): its first-light worker forked, plus 10 warmup and 3 windows of 10
# steps where it took 20 steps, plus explain's profiled steps (~8 s: CUPTI's start, 3-8 steps, the trace).
# GPT-2 compiled: a cold inductor compile of forward and backward (fp8's measured; bf16's taken as its
# 70%), forked. The explain case: a 2-layer GPT-2, eager, its profile.
SUITE_CASES = {
    "suites/resnet50.yaml": {
        ("resnet50", "fp32", False, True): forked(72, 14) + 5 + 8,
        ("resnet50", "tf32", False, True): forked(36, 14) + 2 + 8,
        ("resnet50", "amp_fp16", False, True): forked(28, 14) + 1 + 8,
        ("resnet50", "amp_bf16", False, True): forked(28, 14) + 1 + 8,
    },
    "suites/gpu_check_part2.yaml": {
        ("gpt2-small", "amp_bf16", True, False): round(0.7 * forked(115, 22)),
        ("gpt2-small", "fp8", True, False): forked(115, 22),
        ("gpt2-explain", "amp_bf16", False, True): 15,
    },
}
PROBE_S = 3  # a run's device probe: a forked worker that describes the device
REPORT_S = 5  # the main job's report (skipped without plotly, which the GPU image lacks)


def suite_estimate(path: str) -> int:
    return PROBE_S + sum(SUITE_CASES[path].values()) + (REPORT_S if path == SUITES[1] else 0)


# what each part's suite stage runs (the script passes it to `amp_bench run`): part 1's is the main job; on a
# machine without a GPU, the same path in seconds (the main job's CPU block takes two minutes)
SUITES = {1: "suites/resnet50.yaml", 2: "suites/gpu_check_part2.yaml"}
CPU_SUITES = {1: "suites/gpu_check_part1.yaml", 2: "suites/gpu_check_part2.yaml"}
PARTS = {
    1: Part(1, 360, (
        Stage("env", FIRST_LIGHT["env_part1"], 60, 15, "nvidia-smi's query (nothing set), `amp_bench env --json` "
                                                       "(conda export skipped), a bf16 8192^3 matmul"),
        Stage("suite", suite_estimate(SUITES[1]), 300, 120,
              "the main job as the README types it, `amp_bench run suites/resnet50.yaml` (ResNet-50 bs 256 "
              "channels_last, fp32 / tf32 / amp_fp16 / amp_bf16, each mode's 3 repeats in one worker)", 60),
        Stage("pytest", 45, 80, 20, "`pytest -m gpu tests/test_gpu.py`, as far as it gets: TF32 vs IEEE, autocast, "
                                    "CUDA events, GradScaler first, then the real runs", 40, extra=True),
        Stage("overhead", FIRST_LIGHT["overhead"], 70, 20, "benchmarks/overhead.py: harness against a plain loop, "
                                                           "one round", 40, extra=True),
    )),
    2: Part(2, 360, (
        Stage("env", FIRST_LIGHT["env_part2"], 60, 15, "nvidia-smi's query, `amp_bench env --json` (conda export "
                                                       "skipped)"),
        Stage("suite", suite_estimate(SUITES[2]), 330, 150,
              "suites/gpu_check_part2.yaml: GPT-2 small compiled under amp_bf16 and fp8 (cold compiles), then "
              "GPT-2 eager amp_bf16 with explain on, whose breakdown must be ok", 60),
        Stage("fidelity", 35, 60, 25, "suites/gpu_check_fidelity.yaml: fp32 and amp_bf16 workers (skipped "
                                      "without scikit-learn)", extra=True),
        Stage("headroom", 60, 100, 30, "suites/gpu_check_headroom.yaml: probe + a few probes at resolution 1024",
              extra=True),
    )),
}
# the part whose suite runs fp8: on compute capability >= 8.9 the script refuses to start it without
# torchao (before it reads this plan: the refusal must not need amp_bench to import)
FP8_PART = 2


def shell(part: Part) -> str:
    """The part's plan as bash assignments for scripts/gpu_check.sh (`eval` it)."""
    names = " ".join(s.name for s in part.stages)
    lines = [f"stages=({names})", f"gpu_budget={part.budget_s}", f"cpu_budget={CPU_BUDGET_S}",
             f"suite_file={shlex.quote(SUITES[part.number])}", f"cpu_suite_file={shlex.quote(CPU_SUITES[part.number])}"]
    lines += [f"cap[{s.name}]={s.cap_s}; floor[{s.name}]={s.floor_s}; cpu_cap[{s.name}]={s.cpu_cap_s or s.cap_s}; "
              f"extra[{s.name}]={int(s.extra)}" for s in part.stages]
    return "\n".join(lines)


def describe(part: Part) -> str:
    """The part's stages and estimates, for the log and the summary."""
    rows = [f"  pre        ~{part.pre_s} s: wheels from .whl/, torch imported, capability read"]
    rows += [f"  {s.name:<10} ~{s.estimate_s} s (cap {s.cap_s} s){' extra, if time is left' if s.extra else ''}: "
             f"{s.what}" for s in part.stages]
    rows.append(f"  summaries  ~{part.summaries_s} s")
    return (f"part {part.number}: H200 estimate ~{part.estimate_s} s of a {part.budget_s} s budget (from the first "
            f"H200 reading; forked workers' start taken as {FORK_START_S} s)\n" + "\n".join(rows))


def main(argv: list[str]) -> int:
    """plan --part N [--shell]"""
    try:
        part = PARTS[int(argv[argv.index("--part") + 1])]
    except (ValueError, IndexError, KeyError):
        print("usage: python3 -m amp_bench.gpu_check plan --part 1|2 [--shell]", file=sys.stderr)
        return 2
    print(shell(part) if "--shell" in argv else describe(part))
    return 0
