"""The docs say what the code does: the column reference is generated from the
declarations, the README's layer table is the one tests/test_structure.py enforces, the README fits
on a few screens and its links resolve, and no comment or docstring names a module that is gone."""
import ast
import importlib.util
import io
import re
import tokenize

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
