"""An option that sets a suite field is declared once (amp_bench/suite/options.py): `--help`, the value's
check, the override a study gets and the note on SLURM options a local run does not use all come from
that declaration, so a fake one added there alone shows in each."""
import contextlib
import io
from unittest import mock

import pytest

from amp_bench.cli import main
from amp_bench.suite import options
from conftest import ROOT

SUITE = str(ROOT / "suites" / "smoke.yaml")


class Reached(Exception):
    """The study was called with `args` and `kwargs`."""

    def __init__(self, *args, **kwargs):
        super().__init__("reached")
        self.args_given, self.kwargs = args, kwargs


def _reach(*args, **kwargs):
    raise Reached(*args, **kwargs)


def _main(argv: list[str], study: str = "amp_bench.studies.benchmark.run_suite") -> tuple[object, str, str]:
    """(exit code, or the Reached the study raised; stdout; stderr) of `amp_bench ARGV`."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch(study, side_effect=_reach), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except Reached as reached:
            code = reached
    return code, " ".join(out.getvalue().split()), err.getvalue()


@pytest.fixture
def declared(monkeypatch):
    """Declare extra options, as an entry in suite/options.py would."""
    monkeypatch.setenv("COLUMNS", "200")  # --help on one line per option
    return lambda *extra: monkeypatch.setattr(options, "OPTIONS", options.OPTIONS + extra)


def test_a_declared_option_reaches_help_the_fields_check_and_the_override(declared):
    declared(options.Option("--nvml-interval-ms", "nvml_interval_ms", "settings", ("run",), float,
                            help="how often NVML is sampled"))
    code, out, _ = _main(["run", "--help"])
    assert code == 0 and "--nvml-interval-ms NVML_INTERVAL_MS how often NVML is sampled" in out
    code, out, err = _main(["run", SUITE, "--nvml-interval-ms", "0.1", "--no-report"])  # a float the field refuses
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--nvml-interval-ms: expected a number > 0.5 and <= 60000" in err
    code, _, _ = _main(["run", SUITE, "--nvml-interval-ms", "5", "--steps", "2", "--no-report"])
    assert {k: code.kwargs[k] for k in ("nvml_interval_ms", "steps")} == {"nvml_interval_ms": 5.0, "steps": 2}
    code, out, _ = _main(["explain", "--help"])
    assert code == 0 and "--steps" in out and "--nvml-interval-ms" not in out  # only the commands it names


def test_a_declared_slurm_option_reaches_the_executor_and_the_local_runs_note(declared):
    declared(options.Option("--slurm-poll-s", "poll_s", "executor", ("run", "headroom"), float, slurm_only=True))
    code, out, _ = _main(["run", SUITE, "--slurm-poll-s", "2", "--slurm-qos", "q", "--no-report"])
    assert isinstance(code, Reached)
    assert "note: --slurm-qos, --slurm-poll-s apply to --executor slurm only; this run is local: not used" in out
    code, _, _ = _main(["run", SUITE, "--slurm-partition", "a", "--slurm-poll-s", "2", "--no-report"],
                       "amp_bench.studies.cluster.run_on_cluster")
    spec = code.args_given[1]
    assert (spec.type, spec.partitions, spec.poll_s) == ("slurm", ("a",), 2.0)
    code, _, err = _main(["headroom", SUITE, "--slurm-poll-s", "-1"])
    assert code == 2 and "--slurm-poll-s: expected a number > 0 and <= 3600, got -1.0" in err


def test_every_declared_option_sets_a_field_its_block_has():
    assert len(options.OPTIONS) > 40
    checks = [option.check() for option in options.OPTIONS if option.setting is not None]
    assert all(callable(check) for check in checks)
    with pytest.raises(KeyError):
        options.Option("--no-such", "no_such", "settings", ("run",)).check()
