"""The shape probe's readings (measure/telemetry/shape_probe.py saves them beside the trace, STEM.probe.json),
read torch-free for the rules: per change (named by the rule that prices it), each distinct shape's calls per
step and its forward and backward timed as it runs now and as the change would run it, and the shapes the
budget left untimed. A malformed file is one line naming it and the field."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from amp_bench.errors import UserError, read_json


@dataclass
class ProbedShape:
    label: str
    kind: str  # conv, norm, activation, pool, linear, optimizer, other
    calls: int  # per step
    now_ms: float  # one call, forward and backward, as the step runs it
    changed_ms: float  # the same, changed
    work: float = 0.0  # the probe's estimate of one call's work (multiply-adds, or a few per element)

    @property
    def now_step_ms(self) -> float:
        return self.calls * self.now_ms

    @property
    def changed_step_ms(self) -> float:
        return self.calls * self.changed_ms


@dataclass
class ProbedChange:
    shapes: list[ProbedShape]
    untimed: list[tuple[str, str, int, float]] = field(default_factory=list)  # (label, kind, calls, work)

    def now_ms(self, kinds=None) -> float:
        """The timed shapes' step time as they run now (`kinds`: only these)."""
        return sum(s.now_step_ms for s in self.shapes if kinds is None or s.kind in kinds)

    def changed_ms(self, kinds=None) -> float:
        return sum(s.changed_step_ms for s in self.shapes if kinds is None or s.kind in kinds)

    def priced(self, kinds=None) -> tuple[float, float]:
        """(now, changed) step ms of every shape, the untimed ones priced at their kind's timed rate (ms per unit of
        work) and ratio (changed over now); an untimed shape of a kind with none timed is left out."""
        now, changed = self.now_ms(kinds), self.changed_ms(kinds)
        for _, kind, calls, work in self.untimed:
            timed = [s for s in self.shapes if s.kind == kind and s.work > 0]
            if (kinds is not None and kind not in kinds) or not timed or not work:
                continue
            rate = sum(s.now_ms for s in timed) / sum(s.work for s in timed)
            ratio = sum(s.changed_step_ms for s in timed) / sum(s.now_step_ms for s in timed)
            now, changed = now + calls * work * rate, changed + calls * work * rate * ratio
        return now, changed

    def coverage(self) -> str:
        """'all 23 shapes' or '58 of 60 shapes (2 left untimed by its budget, priced at their kind's rate)'."""
        total = len(self.shapes) + len(self.untimed)
        if not self.untimed:
            return f"all {total} shapes"
        return (f"{len(self.shapes)} of {total} shapes ({len(self.untimed)} left untimed by its budget, priced at "
                "their kind's timed rate)")


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


def _work(record) -> float:
    """A shape's work; 0 where the readings predate it (then it is never extrapolated from)."""
    value = record.get("work") if isinstance(record, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def read_probe(path) -> ProbeReading:
    """STEM.probe.json -> its readings (a shape without both sides timed is left out)."""
    path = Path(path)
    record = read_json(path, "shape probe readings", dict)
    changes = {}
    for rule, change in (record.get("changes") or {}).items():
        shapes = []
        for i, shape in enumerate(_field(change, "shapes", list, path, f"change {rule!r}")):
            where = f"change {rule!r} shape {i}"
            if isinstance(shape, dict) and (shape.get("now_ms") is None or shape.get("changed_ms") is None):
                continue  # a side the budget or a failure left untimed
            shapes.append(ProbedShape(*(_field(shape, key, kind, path, where) for key, kind in _SHAPE_FIELDS),
                                      work=_work(shape)))
        untimed = [(str(u.get("label", "")), str(u.get("kind", "")), int(u.get("calls", 1)), _work(u))
                   for u in change.get("untimed") or [] if isinstance(u, dict)]
        changes[rule] = ProbedChange(shapes, untimed)
    return ProbeReading(float(record.get("seconds") or 0.0), float(record.get("budget_s") or 0.0),
                        str(record.get("device_type") or ""), changes, dict(record.get("failed") or {}))
