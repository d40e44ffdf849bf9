"""A mode the CPU only emulates is not run; its row says by how much it would be slower, measured on the
model's largest layer here (measure/emulation_probe.py, studies/emulation.py), instead of a guess."""
import pandas as pd
import pytest

from amp_bench.analysis.headline import MEASURED_EMULATION
from amp_bench.studies.emulation import sentence


def test_the_reason_and_the_headline_say_the_measured_factor():
    reading = {"factor": 36.6, "kind": "convolution", "layer": "layer1.0.conv2, 64->64 3x3 on [1, 64, 56, 56]"}
    text = sentence("amp_bf16", reading)
    assert text == ("bf16 autocast here: its largest convolution (layer1.0.conv2, 64->64 3x3 on [1, 64, 56, 56]) ran "
                    "37x slower than fp32, forward and backward (measured)")
    found = MEASURED_EMULATION.search(f"CPU has no AVX512-BF16/AMX-BF16: bf16 autocast runs emulated; {text}")
    assert found.groups() == ("convolution", "37x")
    assert MEASURED_EMULATION.search(sentence("amp_fp16", {**reading, "kind": "linear layer"})).group(1) == \
        "linear layer"


def test_the_largest_layer_counts_backward_and_skips_the_inputs_gradient_on_the_data(write_suite):
    """ResNet-18's stem convolution (3 -> 64, 7x7) has as many forward FLOPs as a 64 -> 64 3x3 one, but no
    input gradient in the step: the larger layer in the step is a 3x3 one."""
    from amp_bench.measure.emulation_probe import largest_layer
    from amp_bench.suite import load_suite
    case = load_suite(write_suite("models: [torchvision/resnet18]\nimage_size: 224\nbatch_sizes: [8]\n"
                                  "precisions: [fp32]\n")).cases("cpu")[0]
    name, module, shape, input_grad = largest_layer(case)
    assert name != "conv1" and input_grad and tuple(module.kernel_size) == (3, 3) and shape[0] == 8


@pytest.mark.slow
def test_a_run_that_gates_an_emulated_mode_says_how_much_slower_it_measured(write_suite, tmp_path, monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 hides bf16 instructions where a CPU has them: the gate stops amp_bf16 on
    any machine, and its row carries the probe's measured slowdown (its figure is this CPU's own)."""
    from amp_bench import run_suite
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    suite = write_suite("models: ['python:toy_models:mlp']\nbatch_sizes: [64]\nprecisions: [fp32, amp_bf16]\n"
                        "steps: 2\nwarmup_steps: 1\nexplain: false\n")
    results = run_suite(suite, device="cpu", results_dir=tmp_path / "results")
    gated = results.set_index("precision").loc["amp_bf16"]
    gated = gated.iloc[0] if isinstance(gated, pd.DataFrame) else gated
    assert gated["status"] == "unsupported"
    found = MEASURED_EMULATION.search(gated["reason"])
    assert found and found.group(1) == "linear layer" and found.group(2).endswith("x")
    assert "(measured)" in gated["reason"] and "allow_emulated" in gated["reason"]
