"""Advice on GPUs this machine does not have, priced from fake-tensor steps. For each GPU case (a CPU run's
suite's cuda: cases, the cases its "On GPUs (predicted)" table prices; a GPU run's own cases), the changes a
GPU's kernels reward that the case does not make yet, each recorded as a variant (the change applied, on fake
tensors: measure/fake_step.py) and priced beside the case on every target (analysis/advice/targets.py):

- channels_last: cuDNN's Tensor Core convolutions run NHWC, so a 16-bit or TF32 convolution in NCHW pays a
  transform of its activations each way (pricing's nchw_16bit and nchw_tf32);
- pad_dims: a transformers vocabulary that is not a multiple of 64 (GPT-2's 50257) leaves the lm_head GEMM
  misaligned for the vectorised Tensor Core kernels (pricing's misaligned), padded as nanoGPT does (50304);
- optimizer_impl: the fused optimizer updates every parameter in one pass where foreach and for-loop make
  several (pricing's bytes_optimizer).

Predictions, said as such: RUN_DIR/predicted_advice.csv, never the results, compare, nightly or an export.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from amp_bench import identity
from amp_bench.store import inventories
from amp_bench.suite import OPTIMIZERS, Case

VOCAB_MULTIPLE = 64  # nanoGPT's 50304; a multiple of 8 fp16 elements is what the kernels need, 64 what GPUs like
TABLE = "predicted_advice"  # its columns: store/columns.py


@dataclass(frozen=True)
class GpuChange:
    rule: str  # its advice rule's name (what `run --try` takes)
    change: str  # what to change, in one line
    variant: dict  # the case fields it changes (studies/try_advice.variant_case)


@dataclass
class GpuItem:
    """One change of one GPU case, priced per target: {target key: TargetGain}, {target key: why none}."""
    case: str
    precision: str
    model: str  # the model's label: a CPU case's item finds its GPU gains by it
    change: GpuChange
    gains: dict = field(default_factory=dict)
    not_priced: dict = field(default_factory=dict)


def changes(case: Case, details: dict, has_convolutions: bool) -> list[GpuChange]:
    """The changes a GPU would reward that `case` does not make (its recorded step's details and whether it
    has convolutions decide)."""
    found = []
    if has_convolutions and not case.channels_last:
        found.append(GpuChange("channels_last", "train in channels_last (model and batch in torch.channels_last)",
                               {"channels_last": True}))
    vocab = details.get("vocab_size")
    if vocab and int(vocab) % VOCAB_MULTIPLE and not case.model.pad_vocab_to_multiple_of:
        padded = -(-int(vocab) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        found.append(GpuChange("pad_dims", f"pad the vocabulary to a multiple of {VOCAB_MULTIPLE} ({vocab} -> "
                                           f"{padded})", {"pad_vocab_to_multiple_of": VOCAB_MULTIPLE}))
    if case.optimizer.impl != "fused" and case.optimizer.name in OPTIMIZERS:
        found.append(GpuChange("optimizer_impl", f"use the fused {case.optimizer.name} (fused=True)",
                               {"optimizer_impl": "fused"}))
    return found


def _has_convolutions(entry: inventories.Entry) -> bool:
    from amp_bench.analysis.predict.inventory import priced_inventory
    return any(work.category == "conv" for work in priced_inventory(entry.trace)[0])


def _planned(cases: list[Case]) -> list[tuple[Case, GpuChange, Case]]:
    """(case, change, variant case) for every recorded case and each change it could take."""
    from amp_bench.studies.try_advice import variant_case
    planned = []
    for case in cases:
        entry = inventories.entry(case.to_json())
        if entry.complete():
            details = entry.read_memory().get("details") or {}
            for change in changes(case, details, _has_convolutions(entry)):
                planned.append((case, change, variant_case(case, change.variant)))
    return planned


def _source(case: Case):
    from amp_bench.studies.gpu_predictions import sources
    return sources([case], {})[0]


def price(cases: list[Case], targets: list[str], fp32_as: str | None = None, log_dir: Path | None = None,
          server=None) -> list[GpuItem]:
    """Every change each recorded GPU case could take, priced on `targets` (the cases are recorded first
    where they are not yet: studies/gpu_predictions.record_missing; so are the variants)."""
    from amp_bench.analysis.advice.targets import target_gain
    from amp_bench.analysis.predict.model import predict_mode, resolve_targets
    from amp_bench.studies.gpu_predictions import record_missing
    specs = resolve_targets(targets)
    record_missing(cases, log_dir, server)
    planned = _planned(cases)
    failed = record_missing([variant for _, _, variant in planned], log_dir, server)
    items, bases = [], {}  # a case's source, read once for all its changes
    for case, change, variant in planned:
        item = GpuItem(identity.case_label(case.axes), case.precision, case.model.label, change)
        why_not = failed.get(inventories.key(variant.to_json()))
        if why_not is not None:
            item.not_priced = {spec.key: f"the changed step could not be recorded: {why_not}" for spec in specs}
            items.append(item)
            continue
        if case.case_id not in bases:
            bases[case.case_id] = _source(case)
        base, changed = bases[case.case_id], _source(variant)
        for spec in specs:
            before, status, why = predict_mode(base, case.precision, spec, fp32_as)
            after, _, why_after = predict_mode(changed, case.precision, spec, fp32_as)
            if before is None or after is None:
                item.not_priced[spec.key] = why or why_after
            else:
                item.gains[spec.key] = target_gain(change.rule, before, after, f"{change.rule} priced on the "
                                                   f"fake-tensor steps of {item.case} {case.precision} as is "
                                                   "and changed")
        items.append(item)
    return items


def rows(items: list[GpuItem], targets: list[str]) -> list[dict]:
    """predicted_advice.csv's rows: one per item and target."""
    from amp_bench.analysis.advice.targets import verdict
    from amp_bench.analysis.predict.model import resolve_targets
    out = []
    for item in items:
        for spec in resolve_targets(targets):
            gain = item.gains.get(spec.key)
            row = {"case": item.case, "precision": item.precision, "model": item.model, "rule": item.change.rule,
                   "change": item.change.change, "target": spec.key, "target_label": spec.label}
            if gain is None:
                row.update(status="no prediction", reason=item.not_priced.get(spec.key, ""))
            else:
                row.update(status=verdict(gain), step_ms=gain.step_ms, predicted_ms=gain.predicted_ms,
                           low_ms=gain.low_ms, high_ms=gain.high_ms, gain=gain.step_ms / gain.predicted_ms,
                           gain_low=gain.step_ms / gain.high_ms, gain_high=gain.step_ms / gain.low_ms, how=gain.how)
            out.append(row)
    return out


def _run_cases(run_dir: Path, on_gpu: bool) -> list[Case]:
    """The GPU cases a run's advice is priced on: a GPU run's own (its plan), else its suite's cuda: cases (the
    ones its "On GPUs (predicted)" table prices)."""
    from amp_bench.analysis.predict.settings import SUITE_FILE
    from amp_bench.studies.gpu_predictions import gpu_cases
    from amp_bench.studies.try_advice import plan_cases
    if on_gpu:
        return plan_cases(run_dir)
    return gpu_cases(run_dir / SUITE_FILE) if (run_dir / SUITE_FILE).is_file() else []


def for_run(run_dir, targets: list[str] | None = None, server=None) -> list[GpuItem] | None:
    """The end of a run or an explain: each change its GPU cases could take, priced on `targets` (by default,
    on a machine without a GPU, the suite's predict: targets, else the "On GPUs" section's), written to
    RUN_DIR/predicted_advice.csv. None on a GPU run not given targets (its advice was measured there)."""
    from amp_bench.analysis.predict.settings import chosen
    from amp_bench.analysis.predict.source import is_gpu_run
    from amp_bench.store.results import write_table
    run_dir = Path(run_dir)
    on_gpu = is_gpu_run(run_dir)
    if on_gpu and not targets:
        return None
    targets, fp32_as = chosen(run_dir, targets)
    items = price(_run_cases(run_dir, on_gpu), targets, fp32_as, log_dir=run_dir / "logs", server=server)
    write_table(run_dir, TABLE, rows(items, targets))
    return items
