"""The training step: AMP done as users write it; GradScaler skips counted exactly."""
import torch

from amp_bench.precision import get_mode
from amp_bench.step import TrainStep, build_optimizer
from amp_bench.suite import OptimizerSpec
from toy_models import inf_grad, mlp


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
