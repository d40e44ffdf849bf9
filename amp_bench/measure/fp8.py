"""The fp8 mode's model policy: torchao's float8 training on the linear layers (imports torch; torchao
lazily, it is the optional extra `amp_bench[fp8]`).

`convert` swaps each eligible `nn.Linear` for torchao's `Float8Linear` (dynamic scaling, the
tensorwise or rowwise recipe) and says which layers it left out and why; the rest of the model runs
under bf16 autocast like amp_bf16. GPT-2's projections are transformers' `Conv1D` (a linear layer
with its weight transposed): they become `nn.Linear` first, the same function, so they convert too.
`ScaleProbe` records the amax and the scale float8 would use for the first converted layers' inputs
and weights at each step, for the fidelity study's chart.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from amp_bench.platform.provenance import package_version

RECIPES = ("tensorwise", "rowwise")
DIVISOR = 16  # float8 GEMMs (cuBLAS/CUTLASS) need both dimensions divisible by 16
REASONS_KEPT = 4  # skipped layers named in the row


def conv1d_as_linear(model: nn.Module) -> int:
    """Replace transformers' Conv1D (y = x @ W + b, W: in x out) with nn.Linear holding W^T: the
    same function, in the module type float8 conversion knows. Returns how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ != "Conv1D" or not hasattr(child, "nf"):
                continue
            in_features, out_features = child.weight.shape
            linear = nn.Linear(in_features, out_features, bias=child.bias is not None,
                               device=child.weight.device, dtype=child.weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(child.weight.t())
                if child.bias is not None:
                    linear.bias.copy_(child.bias)
            setattr(parent, name, linear)
            replaced += 1
    return replaced


def plan(model: nn.Module, skip_first_last: bool = False) -> tuple[list[str], dict[str, str]]:
    """(names of the linear layers to convert, {name: why not} for the others), in model order."""
    linears = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    convert, skipped = [], {}
    for i, (name, mod) in enumerate(linears):
        if type(mod) is not nn.Linear:  # e.g. MultiheadAttention's out_proj: its weight is used directly
            skipped[name] = f"{type(mod).__name__} is a Linear subclass its parent uses by weight"
        elif mod.in_features % DIVISOR or mod.out_features % DIVISOR:
            skipped[name] = f"shape {mod.in_features}x{mod.out_features} not divisible by {DIVISOR}"
        elif skip_first_last and i in (0, len(linears) - 1):
            skipped[name] = "first/last layer filter (fp8_skip_first_last)"
        else:
            convert.append(name)
    return convert, skipped


def _scaled_mm_runs(device_type: str) -> bool:
    """Does torch's float8 matmul run on this device? (On CPU from torch 2.14; else emulate.)"""
    try:
        a = torch.ones(16, 16, device=device_type).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device_type)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return True
    except Exception:  # any failure means: emulate
        return False


def convert(model: nn.Module, recipe: str = "tensorwise", device_type: str = "cuda",
            skip_first_last: bool = False) -> dict:
    """Convert `model` in place for float8 training; returns the row's fp8 columns."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    if recipe not in RECIPES:
        raise ValueError(f"fp8_recipe must be one of {', '.join(RECIPES)}, not {recipe!r}")
    swapped = conv1d_as_linear(model)
    names, skipped = plan(model, skip_first_last)
    config = Float8LinearConfig.from_recipe_name(recipe)
    from amp_bench.measure.devices import for_device
    # a GPU runs float8 matmuls natively or fails (the gate let it through: it should); a CPU emulates them
    # where torch's _scaled_mm does not run there
    emulated_matmul = for_device(device_type).fp8_may_emulate and not _scaled_mm_runs(device_type)
    if emulated_matmul:  # torchao's own emulation: float8 casts, matmul in high precision
        config = dataclasses.replace(config, emulate=True)
    chosen = set(names)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda mod, fqn: fqn in chosen)
    converted = [name for name, mod in model.named_modules() if type(mod).__name__ == "Float8Linear"]
    return {
        "fp8_recipe": recipe,
        "fp8_layers_converted": len(converted),
        "fp8_layers_skipped": len(skipped),
        "fp8_skip_reasons": " | ".join(f"{n}: {why}" for n, why in list(skipped.items())[:REASONS_KEPT])
        + (f" | ... {len(skipped) - REASONS_KEPT} more" if len(skipped) > REASONS_KEPT else ""),
        "fp8_conv1d_as_linear": swapped,
        "fp8_matmul": "torchao emulation" if emulated_matmul else "torch._scaled_mm",
        "fp8_torchao_version": package_version("torchao"),
    }


class ScaleProbe:
    """Per step, for the first `layers` float8 layers: the amax of the input and the weight, and the
    tensorwise scale float8 derives from it (E4M3 max / amax). Forward pre-hooks; the readings stay
    on the device until `table()`."""

    def __init__(self, model: nn.Module, layers: int = 2):
        # (step, layer, tensor) -> amax: keyed, so another forward in the same step (the gradient
        # probe) overwrites rather than adds a reading
        self.readings: dict[tuple[int, str, str], torch.Tensor] = {}
        self.step = 0
        float8 = [(n, m) for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"][:layers]
        self._hooks = [module.register_forward_pre_hook(self._hook(name)) for name, module in float8]

    def _hook(self, name):
        def read(module, args):
            if torch.is_grad_enabled():  # training steps only, not evaluation
                self.readings[self.step, name, "input"] = args[0].detach().abs().amax().float()
                self.readings[self.step, name, "weight"] = module.weight.detach().abs().amax().float()
        return read

    def next_step(self) -> None:
        self.step += 1

    def table(self) -> list[dict]:
        e4m3_max = torch.finfo(torch.float8_e4m3fn).max
        rows = []
        for (step, layer, tensor), amax in self.readings.items():
            value = float(amax)
            rows.append({"step": step, "layer": layer, "tensor": tensor, "amax": value,
                         "scale": e4m3_max / value if value > 0 else None})
        return rows

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
