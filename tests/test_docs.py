"""The docs say what the code does: the column reference is generated from the
declarations, the README's layer table is the one tests/test_structure.py enforces, the README fits
on a few screens and its links resolve, no comment or docstring names a module that is gone, and nothing
points outside the repository."""
import ast
import importlib.util
import io
import os
import re
import tokenize
from pathlib import Path

from amp_bench import LAYERS
from amp_bench.store import column_docs
from conftest import ROOT

README = ROOT / "README.md"


def test_the_column_reference_is_what_the_declarations_generate():
    page = column_docs.PAGE.read_text(encoding="utf-8")
    assert column_docs.rewrite(page) == page, "docs/results.md is stale: run python -m amp_bench.store.column_docs"


def test_the_readme_fits_on_a_few_screens_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for page in ["README.md", "DEVELOPERS.md", *(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / page).read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert ((ROOT / page).parent / target).exists(), f"{page}: link to {target}"


def _readme_layers() -> dict[str, set[str]]:
    section = README.read_text(encoding="utf-8").split("## Architecture", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]*) \|", section, re.M)
    return {layer: {name.strip(" `") for name in imports.split(",") if name.strip(" `-—")} for layer, imports in rows}


def test_the_readme_states_the_layer_table_that_is_enforced():
    assert _readme_layers() == LAYERS


# --------------------------------------------------------------------------- modules named in comments

MODULE_NAME = re.compile(r"(?<![\w./])((?:[\w]+/)*\w+\.py)\b")
EXTERNAL = {"models/auto/modeling_auto.py"}  # transformers' own file, which suite/model_refs.py reads


def _comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def _missing_modules(source: str, files: list[str]) -> list[str]:
    """`line: name` for each x.py (or a/b/x.py) a comment or docstring names that no file of the
    repository is (a bare name: any file of that name; a path: a file whose path ends with it)."""
    missing = []
    for line, text in _comments_and_docstrings(source):
        for name in MODULE_NAME.findall(text):
            if name not in EXTERNAL and not any(f == name or f.endswith("/" + name) for f in files):
                missing.append(f"{line}: {name}")
    return missing


def _repository_files() -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if ".venv" not in p.parts
            and ".git" not in p.parts]


def test_the_missing_module_check_can_fail():
    source = ('"""Runs what runner.py says."""\nx = "child.py"  # code, not a comment\n'
              '# see measure/case.py and gone.py\n')
    assert _missing_modules(source, ["amp_bench/measure/case.py"]) == ["3: gone.py", "1: runner.py"]


def test_no_comment_or_docstring_names_a_module_that_does_not_exist():
    files = _repository_files()
    bad = {str(p.relative_to(ROOT)): m for p in (ROOT / "amp_bench").rglob("*.py")
           if (m := _missing_modules(p.read_text(encoding="utf-8"), files))}
    assert not bad, bad


# --------------------------------------------------------------------------- docs/timings.md's tables

def _timings_page():
    spec = importlib.util.spec_from_file_location("timings_page", ROOT / "benchmarks" / "timings_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_benchmark_rewrites_its_own_row_of_its_own_table():
    page = _timings_page()
    text = "intro\n" + page.empty_section("main_job", ["machine", "setting", "wall"]) + "\nafter\n"
    text = page.update(text, "main_job", {"machine": "EPYC", "setting": "as is", "wall": "110 s"},
                       ("machine", "setting"))
    text = page.update(text, "main_job", {"machine": "Xeon", "setting": "as is", "wall": "124 s"},
                       ("machine", "setting"))
    text = page.update(text, "main_job", {"machine": "EPYC", "setting": "as is", "wall": "111 s"},
                       ("machine", "setting"))
    assert text.startswith("intro\n") and text.endswith("\nafter\n")
    assert page.rows(text, "main_job") == [{"machine": "EPYC", "setting": "as is", "wall": "111 s"},
                                           {"machine": "Xeon", "setting": "as is", "wall": "124 s"}]
    committed = (ROOT / "docs" / "timings.md").read_text(encoding="utf-8")
    assert page.rows(committed, "main_job") and page.rows(committed, "tests")


# --------------------------------------------------------------------------- nothing points outside the repository

# a folder beside the checkout, or the notes file that lived there; spelt so that this line does not match itself
OUTSIDE = re.compile(r"\.\./shared/|FIELD[_]NOTES|gpu-first[-]light")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".csv", ".txt", ".json", ".cfg"}
# the GPU readings are kept as the check printed them (docs/gpu-validation/<date>-<gpu>-<commit>/): records
READINGS = ROOT / "docs" / "gpu-validation"


def _points_outside(text: str) -> list[int]:
    return [number for number, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def _text_files() -> list:
    """The repository's text files: not a hidden folder (.venv, .git), a run's output, or a GPU reading kept
    as the check printed it."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("results", "reports")]
        here = Path(folder)
        if READINGS in here.parents:
            continue
        found += [here / name for name in sorted(files) if Path(name).suffix in TEXT_SUFFIXES]
    return found


def test_the_outside_pointer_check_can_fail():
    assert _points_outside("ok\n# from ../" "shared/gpu-diagnose.py\n(shared/FIELD" "_NOTES.md)\n") == [2, 3]
    assert _points_outside("source /shared/venvs/amp/bin/activate  # a user's cluster path") == []
    assert ROOT / "docs" / "sources.md" in _text_files() and not any(".venv" in p.parts for p in _text_files())


def test_nothing_in_the_repository_points_outside_it():
    """Code, docs, suites, tests and benchmarks cite a public source or a page in docs/ (docs/sources.md),
    never a file beside the checkout that a clone does not have."""
    found = [f"{path.relative_to(ROOT)}:{line}" for path in _text_files()
             for line in _points_outside(path.read_text(encoding="utf-8", errors="replace"))]
    assert not found, found
