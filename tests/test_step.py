"""The training step: AMP done as users write it; GradScaler skips counted exactly."""
import torch
from toy_models import inf_grad, mlp

from amp_bench.measure.step import TrainStep, build_optimizer
from amp_bench.modes import get as get_mode
from amp_bench.suite import OptimizerSpec


def test_fp16_skip_counting_with_injected_inf_gradients():
    torch.manual_seed(0)
    model, make_batch, loss_fn = inf_grad(at_steps=(2, 4))
    optimizer = build_optimizer(model.parameters(), OptimizerSpec("sgd", "foreach", 0.1, 0.0))
    step = TrainStep(model, loss_fn, optimizer, get_mode("amp_fp16"), "cpu")
    x, y = make_batch(8, torch.device("cpu"))
    weights = []
    for _ in range(6):
        step(x, y)
        weights.append(model[2].weight.detach().clone())
    assert step.skipped_steps() == [2, 4]
    assert step.skipped_steps(first=3) == [4]
    assert step.final_scale() == 2.0**16 * 0.5 * 0.5  # default init scale, backoff 0.5 twice
    assert step.output_dtype == torch.float16
    # a skipped step leaves the weights untouched; a normal one moves them
    assert torch.equal(weights[2], weights[1]) and torch.equal(weights[4], weights[3])
    assert not torch.equal(weights[3], weights[2])


def test_no_skips_and_no_scaler_outside_fp16():
    model, make_batch, loss_fn = mlp()
    optimizer = build_optimizer(model.parameters(), OptimizerSpec())
    step = TrainStep(model, loss_fn, optimizer, get_mode("amp_bf16"), "cpu")
    x, y = make_batch(8, torch.device("cpu"))
    losses = [float(step(x, y)) for _ in range(20)]
    assert step.skipped_steps() == [] and step.final_scale() is None
    assert step.output_dtype == torch.bfloat16
    assert losses[-1] < losses[0]  # it really trains


def test_fp32_step_trains_in_fp32():
    torch.manual_seed(0)
    model, make_batch, loss_fn = mlp()
    step = TrainStep(model, loss_fn, build_optimizer(model.parameters(), OptimizerSpec("adamw", "for-loop", 0.01, 0.0)),
                     get_mode("fp32"), "cpu")
    x, y = make_batch(8, torch.device("cpu"))
    losses = [float(step(x, y)) for _ in range(20)]
    assert step.output_dtype == torch.float32 and losses[-1] < losses[0]


def test_optimizer_implementations_are_explicit():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert build_optimizer(params, OptimizerSpec("sgd", "for-loop")).defaults["foreach"] is False
    assert build_optimizer(params, OptimizerSpec("sgd", "foreach")).defaults["foreach"] is True
    assert build_optimizer(params, OptimizerSpec("adamw", "fused", momentum=0.9)).defaults["fused"] is True
    assert isinstance(build_optimizer(params, OptimizerSpec("adam", "foreach")), torch.optim.Adam)


def test_an_untimed_step_keeps_the_numbering_and_counts_its_skip_as_warmup():
    torch.manual_seed(0)
    # steps 0,1 warmup; the untimed settle step is the 3rd call (raw index 2) and overflows; measured 3rd
    # and 5th calls after it (raw 3 and 5) are numbered 2 and 4
    model, make_batch, loss_fn = inf_grad(at_steps=(2, 3, 5))
    step = TrainStep(model, loss_fn, build_optimizer(model.parameters(), OptimizerSpec("sgd", "foreach", 0.1, 0.0)),
                     get_mode("amp_fp16"), "cpu")
    x, y = make_batch(8, torch.device("cpu"))
    step(x, y)
    step(x, y)
    step.untimed_step(x, y)
    for _ in range(4):
        step(x, y)
    skipped = step.skipped_steps()
    assert skipped == [1, 2, 4]  # the settle step's skip counts with warmup step 1
    warmup_steps = 2
    assert sum(i < warmup_steps for i in skipped) == 1 and sum(i >= warmup_steps for i in skipped) == 2


def test_scaler_host_sync_is_what_torch_does():
    """GradScaler.step with a non-fused optimizer reads found_inf with .item() every step; a fused one
    takes the scale on the device. The flag must say which, by what really happens. (SGD: Adam's own
    step counter calls .item() on the CPU whatever the scaler does.)"""
    import pytest

    calls = []
    real_item = torch.Tensor.item

    def counting_item(self):
        calls.append(1)
        return real_item(self)

    for precision, impl, expected in (("amp_fp16", "foreach", True), ("amp_fp16", "fused", False),
                                      ("amp_bf16", "foreach", False), ("fp32", "foreach", False)):
        model, make_batch, loss_fn = mlp()
        step = TrainStep(model, loss_fn, build_optimizer(model.parameters(), OptimizerSpec("sgd", impl, 1e-3, 0.9)),
                         get_mode(precision), "cpu")
        x, y = make_batch(4, torch.device("cpu"))
        step(x, y)  # the first step sets things up
        calls.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.Tensor, "item", counting_item)
            step(x, y)
        assert step.scaler_host_sync is expected, (precision, impl)
        assert bool(calls) is expected, (precision, impl, len(calls))


class _StaticOutput(torch.autograd.Function):
    """The loss written into one persistent buffer and returned as a view of it, the way a CUDA
    graph (torch.compile mode reduce-overhead) returns its static output: the next call overwrites it."""
    buffer = torch.zeros(())

    @staticmethod
    def forward(ctx, value):
        _StaticOutput.buffer.copy_(value)
        return _StaticOutput.buffer.view_as(_StaticOutput.buffer)

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_returned_loss_outlives_the_next_step_even_when_the_loss_is_a_reused_buffer():
    torch.manual_seed(0)
    model, make_batch, loss_fn = mlp()
    step = TrainStep(model, lambda out, y: _StaticOutput.apply(loss_fn(out, y)),
                     build_optimizer(model.parameters(), OptimizerSpec("sgd", "foreach", 0.5, 0.0)),
                     get_mode("fp32"), "cpu")
    x, y = make_batch(8, torch.device("cpu"))
    first = step(x, y)
    value = first.item()
    second = step(x, y)
    assert second.item() != value  # the step trained: the buffer now holds another loss
    assert first.item() == value  # ... and the first step's returned loss kept its own
    assert torch.stack([first, second]).tolist() == [value, second.item()]
