"""The GPU check (scripts/gpu_check.sh --part 1|2 and amp_bench.gpu_check): its verdict from generated
result tables, its summary pages, and the script itself on this CPU machine: each part with its
default budget, a small budget that a hung stage must not overrun, and the early refusal without
torchao on an fp8-capable GPU."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from amp_bench.gpu_check import summary as gpu_check
from conftest import ROOT

H200 = "NVIDIA H200"


def _case(model, precision, channels_last=False, status="ok", ms=100.0, batch=64, **extra):
    layout = "-cl" if channels_last else ""
    group = f"{model}-bs{batch}{'-224px' if model == 'resnet50' else '-seq256'}{layout}"
    return {"run_id": "r", "case_id": f"{group}-{precision}", "group_id": group, "model_label": model,
            "model": "torchvision/resnet50" if model == "resnet50" else "transformers/gpt2",
            "image_size": 224 if model == "resnet50" else None, "seq_len": None if model == "resnet50" else 256,
            "batch_size": batch, "precision": precision, "channels_last": channels_last, "status": status,
            "reason": "" if status == "ok" else f"why {status}", "device": "cuda", "device_name": H200,
            "compute_capability": "9.0", "step_time_ms_median": ms if status == "ok" else None,
            "throughput": batch / ms * 1e3 if status == "ok" else None, "scaler_host_sync": False,
            "tf32_matmul": precision == "tf32", "tf32_cudnn": precision == "tf32", "warnings": "", **extra}


def _suite(layouts=(False, True), **overrides):
    ms = {"fp32": 120.0, "tf32": 40.0, "amp_fp16": 25.0, "amp_bf16": 24.0}
    rows = [_case("resnet50", p, cl, ms=ms[p] * (0.8 if cl else 1.0),
                  achieved_tflops=300.0 if p == "amp_bf16" else 80.0)
            for cl in layouts for p in ms]
    rows += [_case("gpt2-small", p, ms=ms[p] * 3, flops_per_step=1.4e14, model_parameters=124_439_808) for p in ms]
    for case_id, changes in overrides.items():
        rows = [{**r, **changes} if r["case_id"] == case_id else r for r in rows]
    return pd.DataFrame(rows)


def _data(suite=None, stages=None, fidelity=None, headroom=None, overhead=None, matmul=None, cap=(9, 0), part=None):
    names = gpu_check.PARTS[part] if part else gpu_check.STAGES
    done = {s: {"stage": s, "status": "ok", "seconds": "10", "timeout": "60", "note": ""} for s in names}
    done.update(stages or {})
    return {"part": part, "stages": done, "env": {"device": {"type": "cuda", "name": H200, "capability": list(cap)}},
            "matmul": matmul or {}, "suite": _default_suite(part) if suite is None else suite,
            "fidelity": pd.DataFrame() if fidelity is None else fidelity,
            "headroom": pd.DataFrame() if headroom is None else headroom,
            "overhead": pd.DataFrame() if overhead is None else overhead}


def _default_suite(part):
    """Part 2's suite is fp8 and the explain case; the others, the anchors and GPT-2."""
    return pd.DataFrame([_explain_row(), _case("gpt2-small", "fp8", compile_mode="default")]) if part == 2 \
        else _suite()


def test_every_case_ok_on_a_gpu_passes():
    assert gpu_check.verdict(_data()) == ("PASSED", [])


# --------------------------------------------------------------------------- the plan

def test_each_part_fits_its_budget_with_margin_and_both_fit_the_device_window():
    """The estimated stages (from the first H200 reading) sum under 60% of each part's budget; both budgets
    plus the machine's start fit the 15-minute device window; each stage's cap leaves its estimate room;
    what has never been measured on a GPU (the main job, compiled bf16 beside fp8) is estimated, the rest
    runs as extras on what is left."""
    from amp_bench.gpu_check import plan
    assert plan.MAX_ESTIMATE_SHARE == 0.60
    for part in plan.PARTS.values():
        assert part.estimate_s <= plan.MAX_ESTIMATE_SHARE * part.budget_s, (part.number, part.estimate_s)
        for stage in part.stages:
            assert stage.estimate_s <= 0.75 * stage.cap_s, (part.number, stage.name)
            assert stage.floor_s <= stage.cap_s
        assert part.pre_s + sum(s.floor_s for s in part.stages if not s.extra) + part.summaries_s < part.budget_s
    assert sum(p.budget_s for p in plan.PARTS.values()) + plan.MACHINE_START_S <= plan.DEVICE_WINDOW_S - 60
    assert gpu_check.PARTS == {1: ("env", "suite", "pytest", "overhead"), 2: ("env", "suite", "fidelity", "headroom")}
    assert [s.name for s in plan.PARTS[1].stages if s.extra] == ["pytest", "overhead"]
    assert [s.name for s in plan.PARTS[2].stages if s.extra] == ["fidelity", "headroom"]
    assert plan.SUITES[1] == "suites/resnet50.yaml"  # the main job as a user types it
    assert {s.name: s for s in plan.PARTS[1].stages}["suite"].estimate_s <= 300  # the main job's target on an H200


def test_the_check_suites_are_the_cases_the_plan_estimates_and_explain_is_where_the_plan_says():
    """A case added to a check suite without an estimate fails here; part 1 is the main job as users run it
    (explain on, as by default); part 2 explains exactly one eager case; fp8 is in part 2 only, beside its
    compiled amp_bf16 baseline of the same model, batch and sequence length, so its speedup is a pair."""
    from amp_bench.gpu_check import plan
    from amp_bench.suite import load_suite
    for number, path in plan.SUITES.items():
        cases = load_suite(ROOT / path).cases("cuda")
        found = {(c.model.label, c.precision, c.compiled, c.explain) for c in cases}
        assert found == set(plan.SUITE_CASES[path]), (path, found)
        assert {s.name: s for s in plan.PARTS[number].stages}["suite"].estimate_s == plan.suite_estimate(path)
        assert ("fp8" in {c.precision for c in cases}) == (number == plan.FP8_PART)
    part2 = load_suite(ROOT / plan.SUITES[2]).cases("cuda")
    assert [(c.model.label, c.compiled) for c in part2 if c.explain] == [("gpt2-explain", False)]
    fp8 = next(c for c in part2 if c.precision == "fp8")
    bf16 = next(c for c in part2 if c.model.label == "gpt2-small" and c.precision == "amp_bf16")
    assert fp8.group_id == bf16.group_id and fp8.compiled  # one group: the summary's fp8-over-bf16 pair


def test_the_script_reads_the_plan_and_sets_nothing_on_the_gpu():
    """The check must not change the machine it measures: nvidia-smi is only queried (-L, --query-gpu),
    never given a setting (-pm, -pl, -ac, -lgc, -r, -c, ...)."""
    import re

    from amp_bench.gpu_check import plan
    script = "\n".join(line for line in (ROOT / "scripts" / "gpu_check.sh").read_text().splitlines()
                       if not line.lstrip().startswith("#"))
    options = re.findall(r"nvidia-smi\s+(-\S+)", script)
    assert options, "the script queries nvidia-smi"
    assert set(options) == {"-L", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,"
                                  "persistence_mode"}, options
    assert "gpu_check plan --part" in script
    shell = plan.shell(plan.PARTS[1])
    assert "stages=(env suite pytest overhead)" in shell and "cap[suite]=300" in shell and "extra[pytest]=1" in shell


def _explain_row(**changes):
    row = _case("gpt2-explain", "amp_bf16", explain_status="ok", explain_busy_ms=80.0, explain_gemm_ms=45.0,
                explain_other_share=0.04, explain_reason="")
    return {**row, **changes}


@pytest.mark.parametrize("changes, words", [
    ({}, None),
    ({"explain_status": "unavailable", "explain_reason": "the trace has no GPU kernel events"}, "unavailable"),
    ({"explain_gemm_ms": 0.0}, "GEMM time is 0.0"),
    ({"explain_busy_ms": None}, "busy time"),
    ({"explain_other_share": 0.41}, "'other' is 41% of the busy time"),
])
def test_part_2_fails_unless_the_explain_case_gives_a_breakdown_that_explains(changes, words):
    suite = pd.DataFrame([_explain_row(**changes), _case("gpt2-small", "fp8", compile_mode="default")])
    status, reasons = gpu_check.verdict(_data(suite=suite, part=2))
    if words is None:
        assert status == "PASSED", reasons
    else:
        assert status == "FAILED" and any(words in r for r in reasons), reasons
    no_explain = pd.DataFrame([_case("gpt2-small", "fp8", compile_mode="default")])
    assert "explain: no case ran with explain on" in gpu_check.verdict(_data(suite=no_explain, part=2))[1]


def test_the_summary_lists_the_explain_case_longest_kernels_with_their_category(tmp_path):
    import gzip
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "dur": 900},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "dur": 800},
        {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4, ...>", "dur": 300},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 5000}]}
    (tmp_path / "traces").mkdir()
    with gzip.open(tmp_path / "traces" / "t.json.gz", "wt") as fh:
        json.dump(trace, fh)
    row = pd.Series(_explain_row(explain_trace="traces/t.json.gz", run_dir=str(tmp_path)))
    kernels = gpu_check.tables.longest_kernels(row)
    assert list(kernels["category"]) == ["gemm", "elementwise", "layout"]
    assert list(kernels["calls"]) == [2, 1, 1] and kernels["total ms"].iloc[0] == pytest.approx(1.7)
    page = "\n".join(gpu_check.tables.explain_section(pd.DataFrame([row])))
    assert "20 longest kernels" in page and "sm90_xmma_gemm" in page and "| gemm |" in page


def test_an_unsupported_case_fails_from_compute_capability_8_but_not_below():
    suite = _suite(**{"resnet50-bs64-224px-tf32": {"status": "unsupported", "reason": "TF32 needs cc 8.0"}})
    status, reasons = gpu_check.verdict(_data(suite))
    assert status == "FAILED" and reasons == ["suite resnet50-bs64-224px-tf32: unsupported (TF32 needs cc 8.0)"]
    assert gpu_check.verdict(_data(suite, cap=(7, 0)))[0] == "PASSED"
    errored = _suite(**{"gpt2-small-bs64-seq256-amp_fp16": {"status": "error", "reason": "Fp32MathError: x"}})
    assert gpu_check.verdict(_data(errored, cap=(7, 0)))[0] == "FAILED"


def test_fidelity_and_headroom_rows_must_all_be_ok():
    fidelity = pd.DataFrame([{"precision": "fp32", "seed": 0, "status": "ok"},
                             {"precision": "amp_bf16", "seed": 0, "status": "timeout", "reason": "past 60 s"}])
    headroom = pd.DataFrame([{"model_label": "resnet18", "precision": "fp32", "status": "ok", "measure_status": None},
                             {"model_label": "resnet18", "precision": "amp_bf16", "status": "nothing fits",
                              "reason": "batch 256 already runs out of memory", "measure_status": None}])
    status, reasons = gpu_check.verdict(_data(fidelity=fidelity, headroom=headroom))
    assert status == "FAILED"
    assert reasons == ["fidelity amp_bf16 seed 0: timeout (past 60 s)",
                       "headroom resnet18 amp_bf16: nothing fits (batch 256 already runs out of memory)"]


def _fidelity(bf16_accuracy, fp32_accuracy=0.98):
    return pd.DataFrame([{"run_id": "f", "dataset": "digits", "model": "small_cnn", "precision": p, "seed": 0,
                          "status": "ok", "test_accuracy": a, "final_train_loss": 0.01}
                         for p, a in (("fp32", fp32_accuracy), ("amp_bf16", bf16_accuracy))])


def _headroom(amp_batch, fp32_batch=1024):
    return pd.DataFrame([{"model_label": "resnet18", "precision": p, "status": "ok", "max_batch_size": b,
                          "measure_status": None} for p, b in (("fp32", fp32_batch), ("amp_bf16", amp_batch))])


def test_a_worse_fidelity_verdict_or_less_amp_headroom_than_fp32_fails():
    """Every row ok is not enough."""
    assert gpu_check.verdict(_data(fidelity=_fidelity(0.975), headroom=_headroom(2048), part=2)) == ("PASSED", [])
    status, reasons = gpu_check.verdict(_data(fidelity=_fidelity(0.95), part=2))  # -3 pp, tolerance 1 pp here
    assert status == "FAILED" and reasons == ["fidelity amp_bf16: worse than fp32 (-3.00 pp test accuracy, "
                                              "tolerance 1.0 pp)"]
    assert gpu_check.verdict(_data(fidelity=_fidelity(0.99), part=2))[0] == "PASSED"  # better is no failure
    status, reasons = gpu_check.verdict(_data(headroom=_headroom(512), part=2))
    assert status == "FAILED" and reasons == ["headroom resnet18 amp_bf16: largest batch 512 is below fp32's 1024"]
    assert gpu_check.verdict(_data(headroom=_headroom(1024), part=2))[0] == "PASSED"  # equal, at a coarse resolution


def test_a_stage_that_failed_timed_out_or_never_ran_does_not_pass():
    timed_out = {"pytest": {"stage": "pytest", "status": "timeout", "seconds": "150", "timeout": "150",
                            "note": "stopped at its 150 s limit"}}
    assert gpu_check.verdict(_data(stages=timed_out)) == ("FAILED",
                                                          ["stage pytest: timeout (stopped at its 150 s limit)"])
    pending = {"headroom": {"stage": "headroom", "status": "pending", "seconds": "", "timeout": "", "note": ""}}
    assert gpu_check.verdict(_data(stages=pending)) == ("INCOMPLETE", ["stage headroom: not finished"])
    cut = {"headroom": {"stage": "headroom", "status": "budget", "seconds": "0", "timeout": "0",
                        "note": "12 s of the budget left"}}
    assert gpu_check.verdict(_data(stages=cut))[0] == "INCOMPLETE"
    skipped = {"fidelity": {"stage": "fidelity", "status": "skipped", "seconds": "0", "timeout": "0",
                            "note": "scikit-learn is not installed"}}
    assert gpu_check.verdict(_data(stages=skipped))[0] == "PASSED"  # said, not hidden: the page lists it


def test_an_extra_stage_cut_short_passes_as_planned_and_the_verdict_names_it():
    """An extra stage runs on what the estimated ones left (docs/gpu-validation/README.md): cut at its limit, or
    left no time, it does not fail the part, and the verdict's own words say so rather than a bare PASSED."""
    timed_out = {"overhead": {"stage": "overhead", "status": "timeout", "seconds": "34", "timeout": "34",
                              "note": "stopped at its 34 s limit"}}
    assert gpu_check.verdict(_data(stages=timed_out, part=1)) == ("PASSED; extra stage cut short: overhead (timeout)",
                                                                  [])
    no_time = {**timed_out, "pytest": {"stage": "pytest", "status": "budget", "seconds": "0", "timeout": "0",
                                       "note": "3 s of the budget left"}}
    status, _ = gpu_check.verdict(_data(stages=no_time, part=1))
    assert status == "PASSED; extra stages cut short: pytest (budget), overhead (timeout)"
    assert gpu_check.render(_data(stages=timed_out, part=1)).count("extra stage cut short: overhead") == 1


def test_stages_file_keeps_each_stages_last_word(tmp_path):
    path = tmp_path / "stages.tsv"
    path.write_text("env\tok\t5\t40\t\nsuite\ttimeout\t200\t200\tstopped\n")
    stages = gpu_check.read_stages(path, part=1)
    assert list(stages) == ["env", "suite", "pytest", "overhead"]  # part 1's stages, in running order
    assert stages["env"]["status"] == "ok" and stages["suite"]["note"] == "stopped"
    assert stages["overhead"]["status"] == "pending"  # a stage the check never reached
    from amp_bench.gpu_check import plan
    assert stages["suite"]["estimate_s"] == plan.suite_estimate("suites/resnet50.yaml")  # beside what it took
    assert list(gpu_check.read_stages(path, part=2)) == ["env", "suite", "fidelity", "headroom"]
    # read as the script wrote it: a quote is text, a stray tab in a note drops what follows it
    path.write_text('env\tok\t5\t40\t\nsuite\ttimeout\t9\t9\tcut "hard"\textra\n')
    assert gpu_check.read_stages(path, part=1)["suite"]["note"] == 'cut "hard"'
    path.write_text("pre\tfailed\t0\t0\ta GPU is present but torch cannot see it\n")
    assert list(gpu_check.read_stages(path, part=1))[0] == "pre"  # only when the pre-checks failed


def test_summary_puts_our_figures_beside_the_anchors_and_the_plain_loop(tmp_path):
    written = pd.DataFrame([{"round": i, "device": "cuda", "model": "resnet50", "image_size": 224, "batch": 64,
                              "channels_last": True, "optimizer": "adamw", "impl": "fused", "device_name": H200,
                              "precision": "amp_bf16", "warmup": 10, "steps": 30, "harness_throughput": 64e3 / h,
                              "plain_throughput": 64e3 / p, "ratio": h / p, "harness_ms": h - 0.2, "plain_ms": p - 0.2,
                              "harness_gap_fraction": 0.001, "target": 1.02}
                             for i, (h, p) in enumerate([(19.4, 19.2), (19.6, 19.3)])])
    written.to_csv(tmp_path / "overhead.csv", index=False)  # as benchmarks/overhead.py leaves it in the work folder
    overhead = gpu_check.load(tmp_path, part=1)["overhead"]  # typed through the store, its kinds declared there
    assert overhead["channels_last"].dtype == "boolean" and overhead["round"].dtype == "Int64"
    page = gpu_check.render(_data(overhead=overhead, matmul={"tflops": 781.0}, part=1))
    assert page.startswith("# amp_bench GPU check, part 1 of 2\n\n**PASSED** on NVIDIA H200 (compute capability 9.0).")
    assert "Every stage was reached." in page and "## Fidelity" not in page
    anchors = page[page.index("## Beside the published figures"):page.index("## Beside a plain")]
    assert "| bf16 8192^3 matmul, TFLOP/s | 781 | 790 | 0.989 |" in anchors
    # ResNet-50 NCHW: our tf32 (64 / 40 ms = 1600 img/s) and amp_fp16 (2560) beside Lambda's H200 2259 / 3079
    assert "| ResNet-50 NCHW tf32, img/s | 1600 | 2259 | 0.708 | Lambda" in anchors
    assert "| ResNet-50 NCHW AMP (amp_fp16), img/s | 2560 | 3079 | 0.831 |" in anchors
    assert "GPT-2 small counted FLOPs per step / 6*N*tokens" in anchors
    plain = page[page.index("## Beside a plain"):]
    assert "the suite's case resnet50-bs64-224px-cl-amp_bf16 | 3333 | 19.2 |" in plain  # 64 / (24 ms * 0.8)
    # wall-clock window throughput first, the median step time beside it
    assert "| plain hand-written loop | 3325 | 19.1 |" in plain
    assert "| amp_bench worker (overhead rounds) | 3282 |" in plain
    assert "Plain loop over harness, wall-clock window throughput (median of paired rounds): 1.013, within" in plain
    suite = page[page.index("## Suite"):page.index("## Beside the published")]
    # x fp32, x tf32
    assert "| resnet50 | NCHW | 64 | amp_bf16 | eager | ok | 24.0 |" in suite and "| 5.00 | 1.67 |" in suite
    assert "scaler host sync" in suite


def test_anchors_put_our_channels_last_beside_a_published_nchw_figure_and_say_so():
    page = gpu_check.render(_data(suite=_suite(layouts=(True,)), part=1))
    anchors = page[page.index("## Beside the published figures"):page.index("## Beside a plain")]
    # our channels_last tf32 (64 / 32 ms = 2000 img/s) beside Lambda's NCHW H200 figure
    assert "| ResNet-50 NCHW (ours: channels_last) tf32, img/s | 2000 | 2259 | 0.885 | Lambda" in anchors


def test_summary_files_are_flat_few_and_whole_and_temporary_files_stay_outside_out(tmp_path, monkeypatch):
    work, out = tmp_path / "work", tmp_path / "out"
    run = work / "suite" / "20261130T000000Z-h-nvidia-h200"
    run.mkdir(parents=True)
    _suite().to_csv(run / "results.csv", index=False)
    (work / "stages.tsv").write_text("env\tok\t5\t40\t\n")
    (work / "env.json").write_text(json.dumps({"device": {"type": "cuda", "name": H200, "capability": [9, 0]}}))
    moved = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (moved.append((Path(src), Path(dst))), real_replace(src, dst)))
    status, reasons = gpu_check.summarize(work, out, part=1)
    assert status == "INCOMPLETE" and reasons == ["stage suite: not finished", "stage pytest: not finished",
                                                  "stage overhead: not finished"]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["part1_stages.csv", "part1_suite.csv", "part1_summary.md"]  # flat, no temp file left
    assert {dst.name for _, dst in moved} == set(files)
    assert all(src.parent == work for src, _ in moved)  # written in the work folder, then renamed into OUT
    assert len(pd.read_csv(out / "part1_suite.csv")) == 12
    page = (out / "part1_summary.md").read_text()
    assert "| suite | pending |" in page and "Stages not reached: suite, pytest, overhead." in page


def test_an_unreadable_table_fails_the_check_naming_its_file(tmp_path):
    """The summary reads through the store's one reader: a garbled results.csv is a failure with
    its path, not a stage silently missing its rows."""
    work, out = tmp_path / "work", tmp_path / "out"
    good, bad = work / "suite" / "a", work / "suite" / "b"
    good.mkdir(parents=True), bad.mkdir(parents=True)
    _suite().to_csv(good / "results.csv", index=False)
    (bad / "results.csv").write_text('case_id,status\n"unclosed,ok\n')
    (work / "stages.tsv").write_text("env\tok\t5\t40\t\nsuite\tok\t9\t300\t\noverhead\tok\t9\t60\t\n")
    data = gpu_check.load(work, part=1)
    assert data["suite"].empty and len(data["unreadable"]) == 1 and str(bad / "results.csv") in data["unreadable"][0]
    status, reasons = gpu_check.summarize(work, out, part=1)
    assert status != "PASS" and any(r.startswith("unreadable: ") and "results.csv" in r for r in reasons)
    (bad / "results.csv").unlink()
    data = gpu_check.load(work, part=1)
    assert len(data["suite"]) == 12 and set(data["suite"]["run_dir"]) == {str(good)} and not data["unreadable"]


def test_the_summary_path_imports_neither_torch_nor_plotly_nor_sklearn():
    code = ("import sys, json, amp_bench.gpu_check, amp_bench.gpu_check.tables, "
            "amp_bench.studies.fidelity.orchestration, amp_bench.studies.headroom_search; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'plotly', 'sklearn'})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    assert json.loads(out.stdout) == []


def _run_script(tmp_path, env_extra, *args):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "TMPDIR": str(tmp_path), **env_extra}
    started = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    return proc, time.monotonic() - started


def _flat_outputs(out, part):
    entries = list(out.iterdir())
    assert all(p.is_file() for p in entries), entries  # nothing in a folder: remote copies keep 2 levels
    assert len(entries) <= 8, entries
    assert all(p.name.startswith(f"part{part}_") for p in entries), entries  # no temporary file either
    assert (out / f"part{part}_gpu_check.log").is_file() and (out / f"part{part}_summary.md").is_file()
    return {p.name for p in entries}


def _cpu_only():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script is run for real by whoever holds one")


@pytest.mark.slow
@pytest.mark.parametrize("part", [1, 2])
def test_each_part_on_a_cpu_machine_finishes_inside_its_budget_and_says_what_it_skipped(tmp_path, part):
    """The default CPU budget (130 s a part) bounds the run whatever the machine's speed. On a busy machine a
    stage may be cut by its timeout: an estimated stage cut fails the part (FAILED or INCOMPLETE); an extra one
    cut is as planned, and the PASSED names it. Whichever happened, the verdict must agree with the stages."""
    _cpu_only()
    # as in NVIDIA's NGC containers: the check unsets it before any stage and says so
    proc, took = _run_script(tmp_path, {"GPU_CHECK_BUDGET_S": "", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"},
                             "--part", str(part))
    log = proc.stdout
    out = tmp_path / "out"
    assert took < 150  # the default CPU budget is 130 s, and every stage is sized inside it
    assert "unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 for the check" in log
    env = json.loads((out / f"part{part}_env.json").read_text())["host"]["env"]
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in env
    assert "NO CUDA GPU" in log and "Nothing here validates CUDA" in log and "budget: 130 s" in log
    files = _flat_outputs(out, part)
    assert (out / f"part{part}_gpu_check.log").read_text() == log  # tee finished before the exit
    stages = pd.read_csv(out / f"part{part}_stages.csv").set_index("stage")["status"]
    assert list(stages.index) == list(gpu_check.PARTS[part])
    assert set(stages) <= {"ok", "skipped", "timeout", "budget"}, stages.to_dict()  # nothing failed outright
    page = (out / f"part{part}_summary.md").read_text()
    assert "Environment changed for the check: unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in page
    if part == 1 and stages["pytest"] == "ok":
        assert "10 skipped" in log  # pytest's own count of the GPU tests
    if part == 2:
        assert "SKIPPED fidelity: needs a CUDA GPU" in log and "SKIPPED headroom: needs a CUDA GPU" in log
        assert stages["fidelity"] == "skipped" and "| fidelity | skipped |" in page
    import tarfile
    with tarfile.open(out / f"part{part}_runs.tar.gz") as archive:  # what later scoring reads, in one file
        names = archive.getnames()
    assert "INDEX.txt" in names and any(n.startswith("suite/") and n.endswith("/manifest.json") for n in names)
    assert any(n.endswith(".json.gz") and "/traces/" in n for n in names)  # the explain traces, gzipped
    verdict = log.rstrip().splitlines()[-2]
    cut = {name for name, status in stages.items() if status in ("timeout", "budget")}
    if cut - {s.name for s in gpu_check.plan.PARTS[part].stages if s.extra}:  # too busy for the budget: no pass
        assert proc.returncode == 1 and verdict in ("gpu check: FAILED", "gpu check: INCOMPLETE"), verdict
        return
    assert proc.returncode == 0, log[-4000:] + proc.stderr[-2000:]
    assert verdict.startswith("gpu check: PASSED (CPU smoke only"), verdict
    assert ("cut short" in verdict) == bool(cut) and all(f"{name} (" in verdict for name in cut), verdict
    if part == 1:
        assert {"part1_suite.csv", "part1_stages.csv", "part1_env.json", "part1_runs.tar.gz"} <= files
        assert "## Where each worker's time went" in page and "workers forked from the run's fork server" in page
        suite = pd.read_csv(out / "part1_suite.csv")
        assert set(suite["status"]) == {"ok"} and set(suite["precision"]) == {"fp32", "amp_bf16"}
        if stages["overhead"] == "ok":
            assert "part1_overhead.csv" in files and "Plain loop over harness, wall-clock window throughput" in page
    else:  # the explain case's CPU smoke: its breakdown in the page (judged only on a GPU)
        suite = pd.read_csv(out / "part2_suite.csv")
        assert list(suite["model_label"]) == ["gpt2-explain"] and suite["explain_status"].notna().all()
        assert "## Explain on this device" in page


@pytest.mark.parametrize("hangs, fails", [("pytest", False), ("run", True)], ids=["extra", "estimated"])
def test_part_1_with_a_small_budget_stops_inside_it_even_when_a_stage_hangs(tmp_path, hangs, fails):
    """A stage hangs (a stand-in interpreter sleeps instead): it is cut at its timeout, later stages get
    what is left or are skipped for the budget, and the whole call ends inside it. An extra stage (pytest,
    run on what the estimated stages left) cut at its limit got as far as it got: no failure; the main
    job's stage cut at its limit fails the part."""
    fake = tmp_path / "python"  # the other stages return at once (not what is tested), and so do the probe and
    # the env stage, which would each import torch: on a busy machine those imports took what the budget left the
    # hanging stage, so it was skipped for the budget instead of cut at its timeout
    fake.write_text(f'#!/usr/bin/env bash\nfor a in "$@"; do [ "$a" = {hangs} ] && exec sleep 1000; done\n'
                    'case "$*" in *get_device_capability*) echo "0 - 1"; exit 0 ;; esac\n'
                    '[ "$1 $2 $3" = "-m amp_bench env" ] && echo \'{"device": {"type": "cpu"}}\' && exit 0\n'
                    f'[ "$1 $2 $3" = "-m amp_bench run" ] && exit 0\n'
                    f'[ "$1" = benchmarks/overhead.py ] && exit 0\n'
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    budget = 30
    proc, took = _run_script(tmp_path, {"GPU_CHECK_BUDGET_S": str(budget), "PYTHON": str(fake)}, "--part", "1")
    log = proc.stdout
    assert took < budget + 3, (took, log[-3000:])  # +3: process exit after the last line
    stage = {"pytest": "pytest", "run": "suite"}[hangs]
    assert f"TIMED OUT: {stage}" in log
    stages = pd.read_csv(tmp_path / "out" / "part1_stages.csv").set_index("stage")["status"]
    assert stages[stage] == "timeout" and stages["env"] == "ok"
    assert set(stages) <= {"ok", "timeout", "budget", "skipped"}
    assert proc.returncode == (1 if fails else 0), log[-3000:]
    verdict = next(line for line in log.splitlines() if line.startswith("gpu check: "))
    assert (verdict == "gpu check: FAILED" and f"stage {stage}: timeout" in log) if fails else \
        verdict.startswith("gpu check: PASSED (CPU smoke only") and "cut short: pytest (timeout)" in verdict, verdict
    _flat_outputs(tmp_path / "out", 1)
    assert "## Stages" in (tmp_path / "out" / "part1_summary.md").read_text()


def test_part_2_refuses_in_one_line_on_an_fp8_gpu_without_torchao(tmp_path):
    """A stand-in interpreter answers the script's probe as an H200 without torchao would: part 2 (its
    suite runs fp8) stops at once (exit 2) with one line saying how to fetch and carry the wheel;
    part 1, which has no fp8, is not refused."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\ncase "$*" in *get_device_capability*) echo "1 9.0 0"; exit 0 ;;\n'
                    f'  *amp_bench.gpu_check\\ plan*) exec {sys.executable} "$@" ;; esac\n'
                    'echo "a stage ran" >&2; exit 3\n')
    fake.chmod(0o755)
    proc, took = _run_script(tmp_path, {"PYTHON": str(fake)}, "--part", "2")
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED")]
    assert proc.returncode == 2 and len(refusals) == 1 and "a stage ran" not in proc.stdout, proc.stdout
    assert "compute capability 9.0" in refusals[0] and "torchao" in refusals[0] and "DEVELOPERS.md" in refusals[0]
    assert "carry .whl" in refusals[0]
    proc, _ = _run_script(tmp_path, {"PYTHON": str(fake), "GPU_CHECK_BUDGET_S": "20"}, "--part", "1")
    assert "REFUSED" not in proc.stdout and "GPU: compute capability 9.0" in proc.stdout
    ada = tmp_path / "python_ada"  # 8.9 runs fp8 natively too; 8.6 does not, so it is not refused
    for capability, refused in (("8.9", True), ("8.6", False)):
        ada.write_text(f'#!/usr/bin/env bash\ncase "$*" in *get_device_capability*) echo "1 {capability} 0"; '
                       'exit 0 ;; esac\nexit 3\n')
        ada.chmod(0o755)
        proc, _ = _run_script(tmp_path, {"PYTHON": str(ada), "GPU_CHECK_BUDGET_S": "20"}, "--part", "2")
        assert ("REFUSED" in proc.stdout) == refused, (capability, proc.stdout[-2000:])


def test_a_gpu_that_the_machine_lists_but_torch_cannot_see_fails_the_part(tmp_path):
    """nvidia-smi -L lists an H200 (or /dev has nvidia0) but this torch sees no CUDA device (a CPU
    wheel, a driver mismatch): the part FAILS with the reason, never "PASSED (CPU smoke only)"."""
    _cpu_only()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/bin/sh\n[ "$1" = -L ] && echo "GPU 0: NVIDIA H200 (UUID: GPU-1)"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    # a stand-in interpreter: the check's two questions to torch answered as a CPU-only wheel answers them,
    # without importing torch for each; every other command runs in the real one
    cpu_wheel = tmp_path / "python"
    cpu_wheel.write_text('#!/usr/bin/env bash\ncase "$*" in *get_device_capability*) echo "0 - 1"; exit 0 ;;\n'
                         '  *is_available*) echo "torch 2.14.1 built for CUDA none (a CPU-only wheel)"; exit 0 ;; '
                         'esac\n'
                         f'exec {sys.executable} "$@"\n')
    cpu_wheel.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_CHECK_DEV_DIR": str(tmp_path / "nodev"),
           "PYTHON": str(cpu_wheel)}
    proc, took = _run_script(tmp_path, env, "--part", "1")
    log = proc.stdout
    assert proc.returncode == 1 and took < 60, log[-3000:]
    assert "FAILED: a GPU is present (GPU 0: NVIDIA H200" in log and "torch.cuda.is_available() is False" in log
    assert "gpu check: FAILED" in log and "PASSED" not in log and "### suite" not in log
    page = (tmp_path / "out" / "part1_summary.md").read_text()
    assert "stage pre: failed (a GPU is present" in page
    dev = tmp_path / "dev"  # no nvidia-smi at all, but the device node is there
    dev.mkdir()
    (dev / "nvidia0").touch()
    (bin_dir / "nvidia-smi").unlink()
    proc, _ = _run_script(tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_CHECK_DEV_DIR": str(dev),
                                     "PYTHON": str(cpu_wheel)}, "--part", "2")
    assert proc.returncode == 1 and f"a GPU is present (device node {dev}/nvidia0)" in proc.stdout


def test_the_script_takes_part_1_or_2(tmp_path):
    proc, _ = _run_script(tmp_path, {}, "--part", "3")
    assert proc.returncode == 2 and "--part takes 1 or 2" in proc.stderr
