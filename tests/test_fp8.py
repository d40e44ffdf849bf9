"""The fp8 mode (torchao float8 on the linear layers, bf16 autocast for the rest): the gate on fake
GPUs and on the CPU, the optional package, the conversion and what it records, the suite keys
(compiled by default, recipe, per-model precisions), a real emulated CPU run of a GPT-2-tiny and a
user MLP through the workers into summary and report, and the fidelity study's fp8 columns.
On a CPU fp8 only runs emulated (torch's _scaled_mm in software), so every run here allows it."""
import glob
import importlib.metadata
import importlib.util

import pandas as pd
import pytest
import torch

from amp_bench import modes
from amp_bench.errors import SuiteError
from amp_bench.gpu_check import summary as gpu_check
from amp_bench.measure import fp8
from amp_bench.platform.device import DeviceInfo, may_run, precision_support
from amp_bench.platform.peaks import peak_tflops
from amp_bench.suite import load_suite
from conftest import amp_bench_cli

GPUS = {"Tesla V100-SXM2-16GB": (7, 0), "NVIDIA A100-SXM4-80GB": (8, 0), "NVIDIA L4": (8, 9),
        "NVIDIA H100 80GB HBM3": (9, 0), "NVIDIA H200": (9, 0)}
GPT2_TINY = ("  - ref: transformers/gpt2\n    label: gpt2-tiny\n"
             "    config: {n_layer: 2, n_embd: 64, n_head: 4, vocab_size: 1024, n_positions: 64}\n")
MLP = '  - {ref: "python:toy_models:mlp", label: mlp}\n'


@pytest.mark.parametrize("name, cc", GPUS.items())
def test_gate_on_fake_gpus(name, cc):
    support = precision_support("fp8", DeviceInfo("cuda", name, 0, cc))
    if cc >= (8, 9):
        assert support.supported and not support.emulated
    else:  # no FP8 tensor cores: not emulated, simply absent (even allow_emulated does not run it)
        assert not support.supported and not support.emulated
        assert "8.9" in support.reason and f"{cc[0]}.{cc[1]}" in support.reason
        assert not may_run(support, allow_emulated=True)


def test_gate_on_a_cpu_is_the_emulation_rule():
    support = precision_support("fp8", DeviceInfo("cpu", "cpu"))
    assert support.emulated and not support.supported and "_scaled_mm" in support.reason
    assert not may_run(support, allow_emulated=False) and may_run(support, allow_emulated=True)


def test_without_torchao_or_with_another_release_the_mode_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else
                        real_find_spec(name, *a))
    support = precision_support("fp8", DeviceInfo("cuda", "NVIDIA H200", 0, (9, 0)))
    assert not support.supported and not support.emulated
    assert support.reason == "torchao is not installed (fp8 needs torchao 0.18: pip install -e '.[fp8]')"
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.17.0")
    reason = precision_support("fp8", DeviceInfo("cuda", "NVIDIA H200", 0, (9, 0))).reason
    assert reason.startswith("torchao 0.17.0 is installed; this mode is tested with >=0.18,<0.19")
    assert precision_support("amp_bf16", DeviceInfo("cuda", "NVIDIA H200", 0, (9, 0))).supported  # others unaffected


def test_fp8_peaks_are_dense_and_absent_where_unknown():
    assert peak_tflops("NVIDIA H200", "fp8")[0] == 1979.0 == peak_tflops("NVIDIA H100 80GB HBM3", "fp8")[0]
    assert peak_tflops("NVIDIA L4", "fp8")[0] == 242.5 and peak_tflops("NVIDIA L40S", "fp8")[0] == 733.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp8")[0] is None
    assert "sparsity" in peak_tflops("NVIDIA H200", "fp8")[1]


def test_plan_names_every_layer_left_out_and_why():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.Linear(128, 10))
    assert fp8.plan(model) == (["0", "2"], {"3": "shape 128x10 not divisible by 16"})
    convert, skipped = fp8.plan(model, skip_first_last=True)
    assert convert == ["2"] and skipped["0"] == "first/last layer filter (fp8_skip_first_last)"
    attention = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    _, skipped = fp8.plan(attention)
    assert "Linear subclass" in skipped["self_attn.out_proj"]


def test_gpt2_conv1d_becomes_an_equivalent_linear():
    import transformers
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    tokens = torch.randint(0, 64, (2, 8))
    before = model(tokens).logits
    assert fp8.conv1d_as_linear(model) == 4  # c_attn, c_proj (attention), c_fc, c_proj (MLP)
    assert not any(type(m).__name__ == "Conv1D" for m in model.modules())
    torch.testing.assert_close(model(tokens).logits, before, rtol=1e-5, atol=1e-5)


def test_convert_records_what_it_did_and_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    columns = fp8.convert(model, "rowwise", "cpu")
    assert columns["fp8_recipe"] == "rowwise" and columns["fp8_layers_converted"] == 2
    assert columns["fp8_layers_skipped"] == 1 and columns["fp8_skip_reasons"] == "4: shape 32x4 not divisible by 16"
    assert columns["fp8_torchao_version"].startswith("0.18")
    probe = fp8.ScaleProbe(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        probe.next_step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    table = pd.DataFrame(probe.table())
    assert set(table["layer"]) == {"0", "2"} and set(table["tensor"]) == {"input", "weight"}
    assert len(table) == 5 * 2 * 2 and (table["scale"] * table["amax"]).round(1).eq(448.0).all()
    with pytest.raises(ValueError, match="fp8_recipe must be one of tensorwise, rowwise"):
        fp8.convert(torch.nn.Linear(16, 16), "blockwise", "cpu")


def test_fp8_trains_compiled_by_default_and_says_so(write_suite):
    head = "models:\n" + MLP + "batch_sizes: [4]\n"
    cases = load_suite(write_suite(head + "precisions: [fp32, fp8]\n")).cases("cpu")
    assert [(c.case_id, c.compile_mode) for c in cases] == [("mlp-bs4-fp32", "eager"),
                                                            ("mlp-bs4-fp8-compiled", "default")]
    assert "fp8 trains under torch.compile by default" in cases[1].compile_note and not cases[0].compile_note
    eager = load_suite(write_suite(head + "precisions: [fp8]\nfp8_compile: false\n", "e.yaml")).cases("cpu")
    assert [(c.case_id, c.compile_note) for c in eager] == [("mlp-bs4-fp8", "")]
    both = load_suite(write_suite(head + "precisions: [amp_bf16, fp8]\ncompile: [false, true]\n"
                                  "fp8_recipe: rowwise\n", "b.yaml")).cases("cpu")
    assert [c.case_id for c in both] == ["mlp-bs4-amp_bf16", "mlp-bs4-fp8-compiled", "mlp-bs4-amp_bf16-compiled"]
    assert {c.fp8_recipe for c in both} == {"rowwise"}
    own = load_suite(write_suite('models:\n  - {ref: "python:toy_models:mlp", label: mlp, compile: false}\n'
                                 "batch_sizes: [4]\nprecisions: [fp8]\n", "own.yaml")).cases("cpu")
    assert [c.case_id for c in own] == ["mlp-bs4-fp8"]  # the model entry's own axis is taken as written


def test_per_model_precisions(write_suite):
    text = ("models:\n" + MLP + '  - {ref: "python:toy_models:mlp", label: other, precisions: [fp32, fp8]}\n'
            "batch_sizes: [4]\nprecisions: [fp32, amp_bf16]\nfp8_compile: false\n")
    ids = [c.case_id for c in load_suite(write_suite(text)).cases("cpu")]
    assert ids == ["mlp-bs4-fp32", "mlp-bs4-amp_bf16", "other-bs4-fp32", "other-bs4-fp8"]


@pytest.mark.parametrize("text, expected", [
    ("fp8_recipe: blockwise", "fp8_recipe: expected one of tensorwise, rowwise"),
    ("fp8_compile: sometimes", "fp8_compile: expected true or false"),
    ("fp8_skip_first_last: 2", "fp8_skip_first_last: expected true or false"),
])
def test_bad_fp8_keys_name_file_and_field(write_suite, text, expected):
    path = write_suite("models:\n" + MLP + "batch_sizes: [4]\nprecisions: [fp8]\n" + text + "\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert any(str(path) in line and expected in line for line in err.value.lines), err.value.lines
    bad_model = write_suite("models:\n  - {ref: \"python:toy_models:mlp\", precisions: [fp9]}\nbatch_sizes: [4]\n",
                            "m.yaml")
    with pytest.raises(SuiteError) as err:
        load_suite(bad_model)
    assert any("models[0].precisions[0]: expected one of" in line for line in err.value.lines), err.value.lines


@pytest.mark.slow
def test_emulated_cpu_run_of_gpt2_tiny_and_a_user_mlp(write_suite, tmp_path):
    """Through the workers: converted layers recorded, rows in the summary and the report's data."""
    from amp_bench.analysis.speedups import summarize
    from amp_bench.report.charts import speedup_chart
    from amp_bench.report.data import claims_table, collect
    path = write_suite("models:\n" + GPT2_TINY + MLP + "seq_len: 16\nbatch_sizes: [4]\n"
                       "precisions: [fp32, fp8]\nallow_emulated: true\nfp8_compile: false\n"
                       "warmup_steps: 1\nsteps: 2\ntimeout_s: 300\nexplain: false\n")
    proc = amp_bench_cli("run", path, "--device", "cpu", "--results-dir", tmp_path / "results", "--no-report",
                         "--target", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = pd.read_csv(glob.glob(str(tmp_path / "results" / "*" / "results.csv"))[0])
    assert set(rows["status"]) == {"ok"}
    got = rows[rows["precision"] == "fp8"].set_index("model_label")
    assert got.loc["gpt2-tiny", "fp8_conv1d_as_linear"] == 8 and got.loc["gpt2-tiny", "fp8_layers_converted"] == 9
    assert got.loc["mlp", "fp8_layers_converted"] == 1 and "2: shape 32x4" in got.loc["mlp", "fp8_skip_reasons"]
    assert set(got["fp8_recipe"]) == {"tensorwise"} and got["emulated"].all()
    assert rows.loc[rows["precision"] != "fp8", "fp8_recipe"].isna().all()
    summary = summarize(rows)
    fp8_rows = summary[summary["precision"] == "fp8"]
    assert len(fp8_rows) == 2 and fp8_rows["speedup_vs_fp32"].notna().all()
    assert "fp8 (float8 linears)" in proc.stdout and "emulated" in proc.stdout
    assert "On GPUs: not predicted (--target none)" in proc.stdout  # the GPU predictions have tests of their own
    assert not glob.glob(str(tmp_path / "results" / "*" / "predicted*.csv"))
    data = collect([tmp_path / "results"])
    assert "fp8" in set(data.summary["precision"])
    assert "fp8" in {trace.name for trace in speedup_chart(data.summary).data}
    claims = claims_table(data.summary)
    assert claims.astype(str).apply(lambda col: col.str.contains("fp8")).any().any()


def test_fidelity_trains_fp8_and_records_scales(tmp_path):
    """In this process (the worker's function): converted layers, the amax/scale table, a verdict."""
    from amp_bench.analysis.fidelity import verdicts
    from amp_bench.studies.fidelity.datasets import load
    from amp_bench.studies.fidelity.train import train_one
    from amp_bench.suite.schema import FidelitySpec, OptimizerSpec
    spec = FidelitySpec(suite="t", dataset="digits", model="mlp", epochs=1, batch_size=128, seeds=(0,),
                        precisions=("fp32", "amp_bf16", "fp8"), optimizer=OptimizerSpec(name="sgd", lr=0.05),
                        test_fraction=0.25, image_size=None, tolerance_pp=50.0, probe_every=0, timeout_s=60,
                        allow_emulated=True)
    split = load("digits", 0.25)
    runs = [train_one(spec, p, 0, "cpu", torch.device("cpu"), split, lambda **e: None) for p in spec.precisions]
    fp8_run = runs[2]
    assert fp8_run["status"] == "ok" and fp8_run["fp8_layers_converted"] == 2  # 64x256, 256x256; the head is 256x10
    scales = pd.DataFrame(fp8_run["fp8_scale_table"])
    assert scales["step"].nunique() == fp8_run["steps"] and set(scales["tensor"]) == {"input", "weight"}
    assert runs[0]["fp8_scale_table"] == [] and "fp8_recipe" not in runs[0]
    frame = pd.DataFrame([{**{k: v for k, v in r.items() if not k.endswith("_table")}, "run_id": "r",
                           "dataset": "digits", "model": "mlp"} for r in runs])
    table = verdicts(frame, 50.0).set_index("precision")
    assert table.loc["fp8", "also_against"] == "amp_bf16" and table.loc["fp8", "verdict_also"] == "parity"
    assert table.loc["fp8", "verdict"] == "parity" and pd.isna(table.loc["amp_bf16", "verdict_also"])


def test_gpu_check_requires_fp8_only_where_it_is_native():
    row = {"run_id": "r", "case_id": "gpt2-small-bs64-seq256-fp8-compiled", "precision": "fp8",
           "status": "unsupported", "reason": "torchao is not installed", "warnings": ""}
    suite = pd.DataFrame([row])
    for cap, expected in (((8, 0), "PASSED"), ((8, 6), "PASSED"), ((8, 9), "FAILED"), ((9, 0), "FAILED")):
        data = {"stages": {}, "env": {"device": {"type": "cuda", "name": "X", "capability": list(cap)}},
                "matmul": {}, "suite": suite, "fidelity": pd.DataFrame(), "headroom": pd.DataFrame(),
                "overhead": pd.DataFrame()}
        assert gpu_check.failures(data) == ([] if expected == "PASSED" else
                                            ["suite gpt2-small-bs64-seq256-fp8-compiled: unsupported "
                                             "(torchao is not installed)"]), cap


def test_the_registry_entry():
    mode = modes.get("fp8")
    assert mode.is_amp and mode.autocast_dtype == "bfloat16" and not mode.grad_scaler and mode.float8_linear
    assert mode.peak_math == "fp8" and mode.compiled_by_default and mode.also_against == "amp_bf16"
