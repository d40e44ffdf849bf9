"""The shape probe (measure/telemetry/shape_probe.py): it times each distinct layer shape of a step as it runs
and as a change would run it, within its budget, and saves what advice reads (analysis/advice/probe.py). Speed
differences are injected (a convolution that sleeps in one layout, a fake clock), so nothing here depends on
how busy the machine is."""
import json
import time
from types import SimpleNamespace

import pytest
import torch

from amp_bench.analysis.advice.probe import read_probe
from amp_bench.measure.devices import for_device
from amp_bench.measure.telemetry import shape_probe
from amp_bench.suite.schema import OptimizerSpec

SLEEP_S = 0.05


@pytest.fixture
def one_thread():
    """One torch thread: a busy machine then delays an op by a preemption at most, not by waking a second thread
    at each parallel region (tens of ms on two shared cores); the sleep stays far above either."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class SleepsInNHWC(torch.nn.Conv2d):
    """A convolution that costs SLEEP_S more whenever its input is channels_last (what a slow NHWC kernel
    does to a step); its calls in NCHW cost what the convolution does."""

    def forward(self, x):
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            time.sleep(SLEEP_S)
        return super().forward(x)


def small_cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                               torch.nn.ReLU(inplace=True), SleepsInNHWC(8, 8, 3, padding=1),
                               torch.nn.ReLU(inplace=True), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(8, 10))


def case(**changes):
    return SimpleNamespace(**{"precision": "fp32", "channels_last": False,
                              "optimizer": OptimizerSpec(name="adamw", impl="foreach"), **changes})


def test_the_probe_times_both_layouts_and_the_fused_optimizer_and_saves_what_advice_reads(tmp_path, monkeypatch,
                                                                                          one_thread):
    monkeypatch.setattr(shape_probe, "budget_s", lambda median_ms: 1e9)  # every shape, however busy the machine
    model = small_cnn()
    step = SimpleNamespace(model=model)
    path = tmp_path / "case.probe.json"
    readings = shape_probe.probe_step(step, torch.randn(4, 3, 16, 16), case(), for_device("cpu"), path,
                                      median_ms=10.0)
    assert json.loads(path.read_text()) == readings and not readings["failed"]
    layout = read_probe(path).changes["channels_last"]
    by_name = {shape.label.split(" ")[0]: shape for shape in layout.shapes}
    # every leaf taking a 4-D image, once per distinct (configuration, input): the two ReLUs are one shape; the
    # Flatten of (N, C, 1, 1) is no image layer
    assert set(by_name) == {"0", "1", "2", "3", "5"} and by_name["2"].calls == 2
    sleepy = by_name["3"]
    assert sleepy.kind == "conv" and sleepy.changed_ms - sleepy.now_ms >= 0.9 * SLEEP_S * 1e3
    assert by_name["1"].kind == "norm" and by_name["5"].kind == "pool"
    (update,) = read_probe(path).changes["optimizer_impl"].shapes
    assert update.kind == "optimizer" and update.now_ms > 0 and update.changed_ms > 0
    assert f"foreach adamw over {len(list(model.parameters()))} tensors" in update.label
    assert all(p.grad is None for p in model.parameters())  # the model's own weights were not touched


class PermutedBlock(torch.nn.Module):
    """ConvNeXt's block in small: a depthwise convolution, then a LayerNorm and a Linear on (N, H, W, C)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.norm, self.linear = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(self.norm(self.conv(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)


def test_only_layers_whose_4d_input_is_an_image_are_timed_in_both_layouts(tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(shape_probe, "budget_s", lambda median_ms: 1e9)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.GroupNorm(2, 8), PermutedBlock(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    readings = shape_probe.probe_step(SimpleNamespace(model=model), torch.randn(2, 3, 8, 8), case(),
                                      for_device("cpu"), tmp_path / "p.json", median_ms=10.0)
    timed = {s["label"].split(" ")[0] for s in readings["changes"]["channels_last"]["shapes"]}
    assert timed == {"0", "1", "2.conv", "3"}  # not the LayerNorm or the Linear on (N, H, W, C), nor Flatten


def test_a_case_in_channels_last_with_a_fused_optimizer_has_nothing_to_probe(tmp_path):
    step = SimpleNamespace(model=small_cnn())
    fused = case(channels_last=True, optimizer=OptimizerSpec(name="adamw", impl="fused"))
    out = shape_probe.probe_step(step, torch.randn(2, 3, 8, 8), fused, for_device("cpu"), tmp_path / "p.json",
                                 median_ms=10.0)
    assert out == {} and not (tmp_path / "p.json").exists()


class Tick:
    """A fake clock: each read moves it on a second."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_the_budget_times_every_shape_once_before_any_twice_one_kind_after_another(tmp_path):
    """The fake clock moves a second at each read. Round one: the optimizer's one update (the change with fewest
    shapes), then one shape of each kind in turn, largest first; round two starts over until the budget is
    spent."""
    ran = []

    def shape(label, kind, work):
        return shape_probe.Shape(label, kind, 1, work, lambda: (lambda: ran.append(label), lambda: ran.append(label)))
    probe = shape_probe.Probe(budget_s=32.0, clock=Tick())
    probe.changes = {"channels_last": [shape("small conv", "conv", 1.0), shape("norm", "norm", 10.0),
                                       shape("large conv", "conv", 100.0), shape("pool", "pool", 5.0)],
                     "optimizer_impl": [shape("update", "optimizer", 0.1)]}
    readings = probe.readings(probe.timed(), "cpu")
    first = list(dict.fromkeys(ran))
    assert first == ["update", "large conv", "norm", "pool", "small conv"]
    pairs = {s["label"]: s["pairs"] for change in readings["changes"].values() for s in change["shapes"]}
    # 5 clock reads a shape a round (the budget check, two timed runs; the warm-ups read none): round one takes
    # 25, the budget 32
    assert pairs == {"update": 2, "large conv": 2, "norm": 1, "pool": 1, "small conv": 1}
    probe = shape_probe.Probe(budget_s=8.0, clock=Tick())
    probe.changes = {"channels_last": [shape("small conv", "conv", 1.0), shape("norm", "norm", 10.0),
                                       shape("large conv", "conv", 100.0)]}
    readings = probe.readings(probe.timed(), "cpu")
    assert [s["label"] for s in readings["changes"]["channels_last"]["shapes"]] == ["norm", "large conv"]
    assert readings["changes"]["channels_last"]["untimed"] == [{"label": "small conv", "kind": "conv", "calls": 1,
                                                                "work": 1.0}]
    (tmp_path / "p.json").write_text(json.dumps(readings))
    change = read_probe(tmp_path / "p.json").changes["channels_last"]
    assert change.coverage() == "2 of 3 shapes (1 left untimed by its budget, priced at their kind's timed rate)"
    # the untimed conv at the timed conv's rate per unit of work and its ratio (both sides ran the same here)
    large = next(s for s in change.shapes if s.label == "large conv")
    assert change.priced(("conv",)) == pytest.approx((large.now_ms * 1.01, large.changed_ms * 1.01))


def test_each_side_runs_once_untimed_before_its_pairs():
    """The changed side's first run builds its kernels (the step built the current side's): never timed."""
    runs = []
    probe = shape_probe.Probe(budget_s=1e9, clock=Tick())
    shape = shape_probe.Shape("one", "conv", 1, 1.0, lambda: (lambda: runs.append("now"),
                                                              lambda: runs.append("changed")))
    probe.changes = {"channels_last": [shape]}
    probe.timed()
    assert runs[:2] == ["now", "changed"] and len(runs) == 2 + 2 * shape_probe.REPEATS
    assert runs[2:6] == ["now", "changed", "changed", "now"] and shape.pairs == shape_probe.REPEATS


def test_a_shape_that_fails_is_left_untimed_with_why_and_the_others_are_timed():
    def broken():
        raise RuntimeError("no NHWC kernel for this")
    probe = shape_probe.Probe(budget_s=1e9, clock=Tick())
    probe.changes = {"channels_last": [shape_probe.Shape("odd", "other", 1, 5.0, broken),
                                       shape_probe.Shape("fine", "conv", 1, 1.0, lambda: (lambda: None, lambda: None))]}
    readings = probe.readings(probe.timed(), "cpu")
    assert [s["label"] for s in readings["changes"]["channels_last"]["shapes"]] == ["fine"]
    (odd,) = readings["changes"]["channels_last"]["untimed"]
    assert odd["label"] == "odd" and "RuntimeError: no NHWC kernel for this" in odd["failed"]


@pytest.mark.parametrize("median_ms, expected", [(None, shape_probe.MIN_S), (1e5, shape_probe.MAX_S),
                                                 (500.0, shape_probe.BUDGET_STEPS * 0.5)])
def test_the_budget_is_a_few_steps_bounded_both_ways(median_ms, expected):
    assert shape_probe.budget_s(median_ms) == pytest.approx(expected)
