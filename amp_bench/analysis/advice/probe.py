"""The shape probe's readings (measure/telemetry/shape_probe.py saves them beside the trace, STEM.probe.json),
read torch-free for the rules: per change (named by the rule that prices it), each distinct shape's calls per
step and its forward and backward timed as it runs now and as the change would run it, and the shapes the
budget left untimed. A malformed file is one line naming it and the field."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.errors import UserError


@dataclass
class ProbedShape:
    label: str
    kind: str  # conv, norm, activation, pool, linear, optimizer, other
    calls: int  # per step
    now_ms: float  # one call, forward and backward, as the step runs it
    changed_ms: float  # the same, changed

    @property
    def now_step_ms(self) -> float:
        return self.calls * self.now_ms

    @property
    def changed_step_ms(self) -> float:
        return self.calls * self.changed_ms


@dataclass
class ProbedChange:
    shapes: list[ProbedShape]
    untimed: list[tuple[str, str, int]] = field(default_factory=list)  # (label, kind, calls) past the budget

    def now_ms(self, kinds=None) -> float:
        return sum(s.now_step_ms for s in self.shapes if kinds is None or s.kind in kinds)

    def changed_ms(self, kinds=None) -> float:
        return sum(s.changed_step_ms for s in self.shapes if kinds is None or s.kind in kinds)

    def coverage(self) -> str:
        """'all 23 shapes' or '58 of 60 shapes (2 smallest untimed: budget)'."""
        total = len(self.shapes) + len(self.untimed)
        if not self.untimed:
            return f"all {total} shapes"
        return f"{len(self.shapes)} of {total} shapes ({len(self.untimed)} smallest left untimed by its budget)"


@dataclass
class ProbeReading:
    seconds: float
    budget_s: float
    device_type: str
    changes: dict[str, ProbedChange]
    failed: dict[str, str]


def _field(record, key, kind, path: Path, where: str):
    if not isinstance(record, dict) or key not in record:
        raise UserError(f"{path}: {where} has no field {key!r}")
    value = record[key]
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is not float and isinstance(value, kind):
        return value
    raise UserError(f"{path}: {where} field {key!r} is not a {kind.__name__}: {value!r}"[:200])


_SHAPE_FIELDS = (("label", str), ("kind", str), ("calls", int), ("now_ms", float), ("changed_ms", float))


def read_probe(path) -> ProbeReading:
    """STEM.probe.json -> its readings (a shape without both sides timed is left out)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable shape probe readings ({exc.__class__.__name__})") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}: expected a JSON object of shape probe readings")
    changes = {}
    for rule, change in (record.get("changes") or {}).items():
        shapes = []
        for i, shape in enumerate(_field(change, "shapes", list, path, f"change {rule!r}")):
            where = f"change {rule!r} shape {i}"
            if isinstance(shape, dict) and (shape.get("now_ms") is None or shape.get("changed_ms") is None):
                continue  # a side the budget or a failure left untimed
            shapes.append(ProbedShape(*(_field(shape, key, kind, path, where) for key, kind in _SHAPE_FIELDS)))
        untimed = [(str(u.get("label", "")), str(u.get("kind", "")), int(u.get("calls", 1)))
                   for u in change.get("untimed") or [] if isinstance(u, dict)]
        changes[rule] = ProbedChange(shapes, untimed)
    return ProbeReading(float(record.get("seconds") or 0.0), float(record.get("budget_s") or 0.0),
                        str(record.get("device_type") or ""), changes, dict(record.get("failed") or {}))
