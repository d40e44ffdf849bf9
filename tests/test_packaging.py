"""Packaging: pyproject and environment.yml agree; README's commands are what CI runs."""
import re

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

import yaml

from conftest import ROOT

CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name where they differ


def _split(requirement: str) -> tuple[str, str]:
    name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
    return name.lower(), requirement[len(name):].replace(" ", "")


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pypi = dict(_split(r) for r in project["dependencies"] + project["optional-dependencies"]["test"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    conda = dict(_split(d) for d in env["dependencies"] if isinstance(d, str) and not d.startswith(("python", "pip")))
    expected = {CONDA_NAMES.get(name, name): spec for name, spec in pypi.items()}
    assert conda == expected


def test_pyproject_declares_entry_points_and_python():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert project["scripts"]["amp-bench"] == "amp_bench.cli:main"
    names = {_split(r)[0] for r in project["dependencies"]}
    assert {"torch", "torchvision", "transformers", "pandas", "pyyaml", "rich", "plotly", "nvidia-ml-py"} <= names
    assert "pynvml" not in names  # deprecated package; nvidia-ml-py provides `import pynvml`


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    return [line.strip() for line in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S) for line in line.splitlines()]


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    run = [c for c in commands if "amp_bench run suites/resnet50.yaml" in c and "pip install" in c]
    test = [c for c in commands if "pytest" in c and "pip install" in c]
    assert run and test, commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert test[0] in ci.splitlines()
    # the linter runs first, over the whole tree's Python (its rules: pyproject.toml, DEVELOPERS.md)
    assert ".venv/bin/ruff check amp_bench tests benchmarks scripts &&" in test[0]
    assert "set -euo pipefail" in ci  # fails when the tests fail
    # one figure for the main job in the README; the machine timings live in docs/timings.md
    assert "about 2 minutes on 2 cores" in " ".join((ROOT / "README.md").read_text().split())


def test_the_solo_command_names_every_file_that_holds_a_solo_test():
    """The test command's last pytest call collects only the files it names (collecting all of them cost
    ~7 s of CPU): a solo test put in another file would silently never run."""
    test = next(c for c in _readme_commands() if "pytest" in c and "pip install" in c)
    named = set(test.split("pytest -m solo", 1)[1].split())
    holding = {f"tests/{path.name}" for path in (ROOT / "tests").glob("test_*.py")
               if re.search(r"^\s*@pytest\.mark\.solo\b", path.read_text(), re.M)}
    assert holding and holding <= named, (holding, named)


def test_top_level_layout():
    for name in ("pyproject.toml", "environment.yml", "amp_bench", "suites", "results", "reports", "tests",
                 "README.md", ".ci/run"):
        assert (ROOT / name).exists(), name


def test_long_files_name_real_test_files_longest_first():
    """conftest hands the files out in LONG_FILES' order: a renamed file would silently fall to the end."""
    from conftest import LONG_FILES
    missing = [name for name in LONG_FILES if not (ROOT / "tests" / name).is_file()]
    assert not missing, f"LONG_FILES names files that are gone: {missing}"
    assert list(LONG_FILES.values()) == sorted(LONG_FILES.values(), reverse=True)
