"""GradScaler health on the CPU: an injected overflow, a scale below 1, and small gradients that
underflow in fp16 unless the loss is scaled."""
import pytest
import torch

from amp_bench.measure.scaler_health import gradient_underflow, scale_history
from amp_bench.measure.step import TrainStep
from amp_bench.modes import get as get_mode


def _step(precision="amp_fp16", loss_fn=torch.nn.functional.cross_entropy, model=None):
    torch.manual_seed(0)
    model = model or torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainStep(model, loss_fn, optimizer, get_mode(precision), "cpu"), model


def _batch(n=16):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_injected_overflow_is_skipped_halves_the_scale_and_leaves_weights_alone():
    calls = {"n": 0}

    def loss_fn(out, y):
        loss = torch.nn.functional.cross_entropy(out, y)
        calls["n"] += 1
        return loss * float("inf") if calls["n"] == 4 else loss  # step index 3 overflows

    step, model = _step(loss_fn=loss_fn)
    x, y = _batch()
    before_overflow = None
    for i in range(6):
        if i == 3:
            before_overflow = [p.detach().clone() for p in model.parameters()]
        step(x, y)
        if i == 3:
            assert all(torch.equal(a, b) for a, b in zip(before_overflow, model.parameters(), strict=True))
    scales = torch.stack(step.scales).tolist()
    health = scale_history(step.initial_scale, scales)
    assert health["scaler_skipped_step_indices"] == [3]
    assert health["scaler_skipped_steps"] == 1
    assert health["scaler_min_scale"] == step.initial_scale / 2
    assert health["scaler_final_scale"] == step.initial_scale / 2
    assert health["scaler_scale_below_one"] is False
    assert step.skipped_steps() == [3]  # the benchmark path reads the same history


def test_a_scale_that_falls_below_one_is_reported():
    step, _ = _step(loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out, y) * float("inf"))
    step.scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    step.initial_scale = 2.0
    x, y = _batch()
    for _ in range(3):
        step(x, y)
    health = scale_history(step.initial_scale, torch.stack(step.scales).tolist())
    assert health["scaler_skipped_step_indices"] == [0, 1, 2]
    assert health["scaler_min_scale"] == pytest.approx(0.25)
    assert health["scaler_scale_below_one"] is True


def test_scale_history_of_a_clean_run_and_growth():
    health = scale_history(4.0, [4.0, 8.0, 8.0, 4.0, 8.0])
    assert health["scaler_skipped_step_indices"] == [3]
    assert health["scaler_growth_steps"] == 2
    assert health["scaler_max_scale"] == 8.0
    assert scale_history(None, []) == {}


def _tiny_loss(out, y):
    # cross-entropy runs in fp32 under autocast; its gradient (<1e-8 per logit) then enters the fp16
    # backward of the linear layer, below fp16's smallest subnormal (6e-8)
    return 1e-7 * torch.nn.functional.cross_entropy(out, y)


def test_small_gradients_underflow_in_fp16_unless_scaled():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x, y = _batch()
    probe = gradient_underflow(model, _tiny_loss, x, y, get_mode("amp_fp16"), "cpu", scale=65536.0)
    assert probe["grad_zero_fraction_fp32"] == 0.0
    assert probe["grad_underflow_fraction_unscaled"] > 0.9  # lost without GradScaler
    assert probe["grad_underflow_fraction_scaled"] < 0.05  # GradScaler's 65536 brings them back
    assert probe["grad_nonfinite_fraction_scaled"] == 0.0
    # bf16 keeps fp32's exponent range: the same gradients survive without any scaling
    bf16 = gradient_underflow(model, _tiny_loss, x, y, get_mode("amp_bf16"), "cpu", scale=None)
    assert bf16["grad_underflow_fraction_unscaled"] < 0.05
    assert bf16["grad_underflow_fraction_scaled"] == bf16["grad_underflow_fraction_unscaled"]


def test_ordinary_gradients_do_not_underflow():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x, y = _batch()
    probe = gradient_underflow(model, torch.nn.functional.cross_entropy, x, y, get_mode("amp_fp16"), "cpu", 65536.0)
    assert probe["grad_underflow_fraction_unscaled"] == 0.0


def test_the_probe_does_not_change_training():
    """Probing between steps (dropout, batch norm) must leave the run exactly as it was."""
    def build():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.3), torch.nn.Linear(32, 4))
    x, y = _batch()
    final = []
    for probing in (False, True):
        torch.manual_seed(0)
        model = build()
        step = TrainStep(model, torch.nn.functional.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1),
                         get_mode("amp_bf16"), "cpu")
        for _ in range(4):
            if probing:
                gradient_underflow(model, torch.nn.functional.cross_entropy, x, y, get_mode("amp_bf16"), "cpu", None)
            step(x, y)
        final.append([t.detach().clone() for t in list(model.parameters()) + list(model.buffers())])
    assert all(torch.equal(a, b) for a, b in zip(*final, strict=True))
