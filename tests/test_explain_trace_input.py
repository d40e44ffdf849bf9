"""`explain --trace` on what users hand it: traces with nothing to explain, older Kineto traces, two
traces that differ in more than the precision, reports of same-named traces, one definition of idle,
and messages that name only options explain has. Every CLI call here is in-process: explain --trace
imports no torch and starts no worker."""
import argparse
import ast
import gzip
import json
import re
from pathlib import Path

import pytest

from amp_bench.analysis.explain.any_trace import explain_traces
from amp_bench.analysis.explain.trace import read_profile
from amp_bench.analysis.explain.trace_pair import differences, pair_ideal
from amp_bench.cli import build_parser, main
from amp_bench.platform.gpu_specs import find
from amp_bench.platform.peaks import peak_tflops
from conftest import ROOT

HTA = ROOT / "tests" / "data" / "hta"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _explain(capsys, *args):
    code = main(["explain", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _explain_options() -> set[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices["explain"]._actions for o in a.option_strings}


def _renamed(tmp_path, source: Path, name: str, device: str | None) -> Path:
    """A copy of a committed trace under another name, naming another GPU (or none)."""
    with gzip.open(source, "rt") as fh:
        trace = json.load(fh)
    trace["deviceProperties"] = [{"name": device}] if device else []
    path = tmp_path / name
    with gzip.open(path, "wt") as fh:
        json.dump(trace, fh)
    return path


@pytest.mark.parametrize("content", [
    {"traceEvents": []}, [1, 2, 3], {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]},
    {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 5}]},
    {"traceEvents": [{"ph": "X", "cat": "python_function", "name": "f", "ts": 0, "dur": 5}]}])
def test_a_trace_with_nothing_to_classify_is_refused_in_one_line(tmp_path, capsys, content):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(content))
    code, out, err = _explain(capsys, "--trace", path, "--reports-dir", tmp_path / "reports")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"{path}: nothing to explain" in err
    assert not (tmp_path / "reports").exists()  # no report of nothing


def test_an_older_trace_with_capitalised_categories_is_a_gpu_trace(capsys):
    """HTA's trace_file_list/inference_rank_1: `Kernel` and `Runtime` events, no CPU op."""
    profile = read_profile(HTA / "inference_rank_1.json.gz")
    assert profile.device_type == "cuda" and len(profile.steps) == 1 and profile.gpu_events == 4
    assert profile.kinds_ms["computation"] == pytest.approx(0.030) and profile.math_ms.keys() == {"fp16"}
    code, out, _ = _explain(capsys, "--trace", HTA / "inference_rank_1.json.gz", "--no-report")
    assert code == 0 and "cuda" in out and "GEMM" in out and " cpu " not in out


def test_no_pandas_print_reaches_the_terminal(capsys):
    code, out, _ = _explain(capsys, "--trace", HTA / "a100_alexnet.json.gz", "--trace", HTA / "mi250_minitoy.json.gz",
                            "--no-report")
    assert code == 0
    for pandas_words in ("Empty DataFrame", "Columns:", "Index:", "dtype:", "NaN"):
        assert pandas_words not in out


def test_two_traces_that_differ_say_how_before_the_decomposition(capsys):
    """AlexNet on an A100 (mostly FP32 SIMT kernels) against a toy model on an MI250: another device,
    model and number format, each said before the sentence, and the sentence itself says so."""
    code, out, _ = _explain(capsys, "--trace", HTA / "a100_alexnet.json.gz", "--trace", HTA / "mi250_minitoy.json.gz",
                            "--modes", "fp32,amp_bf16", "--no-report")
    flat = " ".join(out.split())
    assert code == 0
    before, why = flat.index("Before comparing"), flat.index("Why")
    for said in ("device: a100_alexnet ran on NVIDIA A100-PG509-200, mi250_minitoy on AMD Radeon Graphics",
                 "model: a100_alexnet and mi250_minitoy look like different models",
                 "--modes says mi250_minitoy ran amp_bf16, but its GEMM/conv kernels ran FP32"):
        assert before < flat.index(said) < why
    assert "(they differ in more than the precision: device, model, modes; see above)" in flat


def test_one_model_in_two_precisions_is_not_called_two_models():
    """This project's ResNet-18 CPU traces, fp32 and amp_bf16: only the precision differs."""
    traces = ROOT / "tests" / "data" / "predict" / "cpu_run" / "traces"
    profiles = [read_profile(traces / f"resnet18-bs4-32px-{m}-r0.json.gz") for m in ("fp32", "amp_bf16")]
    said = differences(["fp32", "amp_bf16"], profiles, ("fp32", "amp_bf16"))
    assert [kind for kind, _ in said] == ["precision"]
    assert "ran FP32 (100% of their time)" in said[0][1] and "BF16 (100%)" in said[0][1]


def test_each_sides_ceiling_is_priced_on_its_own_gpu(tmp_path):
    """The same step named as a V100 (fp32) and as an A100 SXM4 80GB (amp_bf16): GEMM's ideal is the
    A100's bf16 peak over the V100's FP32 one, and the memory-bound work moves by the bandwidth ratio too;
    pricing both on the last trace's GPU would give the A100's bf16 over its own FP32 peak."""
    source = HTA / "a100_nccl_sampled_rank0.json.gz"
    paths = [_renamed(tmp_path, source, "v100.json.gz", "Tesla V100-SXM2-16GB"),
             _renamed(tmp_path, source, "a100.json.gz", "NVIDIA A100-SXM4-80GB")]
    profiles = [read_profile(p) for p in paths]
    ideal, why = pair_ideal(["v100", "a100"], profiles, ("fp32", "amp_bf16"))
    assert why == ""
    v100_fp32 = peak_tflops("Tesla V100-SXM2-16GB", "fp32")[0]
    a100_bf16 = peak_tflops("NVIDIA A100-SXM4-80GB", "amp_bf16")[0]
    assert ideal.factors["gemm"] == pytest.approx(a100_bf16 / v100_fp32)
    bandwidth = find("NVIDIA A100-SXM4-80GB").bandwidth_gbs / find("Tesla V100-SXM2-16GB").bandwidth_gbs
    assert ideal.factors["elementwise"] == pytest.approx(2 * bandwidth)
    assert ideal.factors["optimizer"] == pytest.approx(bandwidth) and ideal.factors["host"] == 1.0
    explained = explain_traces(paths, ("fp32", "amp_bf16"), profiles=profiles)
    kinds = {kind for kind, _ in explained.differences}  # one model in one format (TF32, against --modes' word)
    assert "device" in kinds and not kinds & {"model", "precision"}
    assert explained.decomposition.ceiling is not None


def test_reports_of_same_named_traces_do_not_overwrite_each_other(tmp_path, capsys):
    copies = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        copies.append(tmp_path / folder / "trace.json.gz")
        copies[-1].write_bytes((HTA / "mi250_minitoy.json.gz").read_bytes())
    reports = tmp_path / "reports"
    for path in copies:
        assert _explain(capsys, "--trace", path, "--reports-dir", reports)[0] == 0
    assert _explain(capsys, "--trace", copies[0], "--trace", copies[1], "--reports-dir", reports)[0] == 0
    written = sorted(p.name for p in reports.glob("*.md"))
    assert len(written) == 3 and len({name.rsplit("-", 1)[-1] for name in written}) == 3


def test_idle_is_one_share_of_one_step_in_the_table_and_the_sentence():
    explained = explain_traces([HTA / "a100_alexnet.json.gz", HTA / "a100_nccl_sampled_rank0.json.gz"])
    mode = explained.profiles[1]
    row = explained.summary_rows()[1]
    assert row["idle ms per step"] == mode.host_ms
    assert row["idle share of the step"] == pytest.approx(mode.host_ms / (mode.categories_sum_ms + mode.host_ms))
    said = re.search(r"the device sat idle (\d+)% of the", explained.sentences()[0])
    assert int(said.group(1)) == round(100 * row["idle share of the step"])
    assert not any("span" in key for key in row)  # HTA's span-based idle is the cross-check's, not shown here


EXPLAIN_SOURCES = [*sorted((ROOT / "amp_bench" / "analysis" / "explain").glob("*.py")),
                   ROOT / "amp_bench" / "cli" / "explain.py", ROOT / "amp_bench" / "report" / "explain_trace_report.py"]


def test_every_flag_explain_names_is_an_option_it_has(tmp_path, capsys):
    """What explain prints in many situations, and every string in the modules it prints from: each
    `--flag` named must be one of explain's (a flag after `run ` is run's, named as such)."""
    options = _explain_options()
    runs = [("--trace", HTA / "a100_alexnet.json.gz", "--trace", HTA / "a100_nccl_sampled_rank0.json.gz"),
            ("--trace", HTA / "a100_alexnet.json.gz", "--trace", HTA / "mi250_minitoy.json.gz", "--modes", "fp32,tf32"),
            ("--trace", HTA / "inference_rank_1.json.gz", "--modes", "fp32,amp_bf16", "--cpu-isa", "amx_bf16"),
            ("--trace", HTA / "a100_alexnet.json.gz", "--steps", "3"), ("--modes", "fp32,amp_bf16"), ()]
    said = ""
    for args in runs:
        _, out, err = _explain(capsys, *args, "--reports-dir", tmp_path)
        said += out + err
    said += "".join(p.read_text() for p in tmp_path.glob("*.md"))
    named = set(FLAG.findall(said))
    assert named >= {"--modes", "--trace"} and named <= options, named - options
    for path in EXPLAIN_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = re.sub(r"\brun (--[a-z-]+)", "", node.value)
                assert set(FLAG.findall(text)) <= options, (path.name, node.value)
