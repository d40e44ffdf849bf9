"""One typed read: results come back from the store with every declared column in
its kind, whatever shape and pandas version wrote them, and rows from before a column existed read
its default."""
import numpy as np
import pandas as pd
import pytest

from amp_bench.platform.nvml import NVML_COLUMNS
from amp_bench.store import columns
from amp_bench.store.cache import load_cached, load_tree
from amp_bench.store.results import RESULT_COLUMNS, load_results, read_table
from amp_bench.store.typed import typed

# An older run's table: no compile_mode, world_size, nnodes or channels_last columns yet; yes/no
# columns written as text, an empty cell, versions and ids that look like numbers.
OLD = ("run_id,suite,case_id,group_id,model,model_label,batch_size,precision,image_size,seq_len,device,repeat,status,"
       "step_time_ms_median,throughput,contended,emulated,cuda_version,fingerprint,slurm_job_id,peak_rss_bytes\n"
       "old,smoke,resnet18-bs4-32px-fp32,resnet18-bs4-32px,torchvision/resnet18,resnet18,4,fp32,32,,cpu,0,ok,40.5,98.7,False,0,12.10,012345678901,123_4,1000\n"
       "old,smoke,resnet18-bs4-32px-amp_bf16,resnet18-bs4-32px,torchvision/resnet18,resnet18,4,amp_bf16,32,,cpu,0,ok,30.1,130.2,True,1,12.10,012345678901,123_4,\n"
       "old,smoke,gpt2-tiny-bs4-seq32-fp32,gpt2-tiny-bs4-seq32,transformers/gpt2,gpt2-tiny,4,fp32,,32,cpu,0,ok,20.0,200.0,,,12.10,012345678901,,900\n")


def _new_run() -> pd.DataFrame:
    """A run written today (every column), compiled and distributed: its values must survive the read."""
    row = {name: None for name in RESULT_COLUMNS}
    row.update(run_id="new", suite="smoke", case_id="resnet18-bs4-32px-cl-np2-fp32-compiled", group_id="g",
               model="torchvision/resnet18", model_label="resnet18", batch_size=4, precision="fp32",
               channels_last=True, image_size=32, device="cpu", world_size=2, nnodes=1, nproc_per_node=2,
               repeat=0, status="ok", step_time_ms_median=41.0, throughput=97.0, contended=False,
               compile_mode="default", compile_fullgraph=True, cudnn_version="92400", fingerprint="abc")
    return pd.DataFrame([row])


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.csv").write_text(OLD)
    (tmp_path / "new").mkdir()
    _new_run().to_csv(tmp_path / "new" / "results.csv", index=False)
    return tmp_path


def test_an_older_table_reads_back_typed_with_the_defaults(tree):
    rows = load_results(tree / "old")
    assert list(rows.columns[:3]) == ["run_id", "suite", "case_id"] and set(RESULT_COLUMNS) <= set(rows.columns)
    assert rows["compile_mode"].tolist() == ["eager"] * 3  # rows from before compile: eager
    assert rows["world_size"].tolist() == [1, 1, 1] and str(rows["world_size"].dtype) == "Int64"
    assert rows["channels_last"].tolist() == [False] * 3 and str(rows["channels_last"].dtype) == "boolean"
    assert str(rows["contended"].dtype) == "boolean"
    assert rows["contended"].iloc[0] is np.False_ or rows["contended"].iloc[0] == False
    assert rows["contended"].iloc[1] == True and rows["contended"].isna().iloc[2]  # empty: unknown
    assert rows["emulated"].iloc[:2].tolist() == [False, True] and rows["emulated"].isna().iloc[2]
    assert rows["cuda_version"].tolist() == ["12.10"] * 3  # text stays text, not 12.1
    assert rows["fingerprint"].iloc[0] == "012345678901" and rows["slurm_job_id"].iloc[0] == "123_4"
    assert rows["compile_fullgraph"].isna().all()  # a column no row had: empty, not False


def test_a_merged_tree_where_runs_lack_columns_reads_back_typed(tree):
    rows = load_results(tree).set_index("run_id")
    assert rows.loc["new", "compile_mode"] == "default" and rows.loc["old", "compile_mode"].tolist() == ["eager"] * 3
    assert rows.loc["new", "world_size"] == 2 and rows.loc["new", "channels_last"] == True
    assert rows.loc["new", "compile_fullgraph"] == True and rows.loc["old", "compile_fullgraph"].isna().all()
    assert rows.loc["new", "cudnn_version"] == "92400"
    for name in ("batch_size", "repeat", "world_size", "nnodes"):
        assert str(rows[name].dtype) == "Int64", name
    for name in ("channels_last", "contended", "emulated", "compile_fullgraph", "tf32_matmul"):
        assert str(rows[name].dtype) == "boolean", name
    assert rows["step_time_ms_median"].dtype == np.float64
    assert rows["image_size"].dtype == np.float64  # int, read as float for now (columns.READ_AS_FLOAT)
    same = read_table([tree / "new", tree / "old"], "results")
    assert same.dtypes.to_dict() == load_results(tree).dtypes.to_dict()


def test_the_cache_reads_typed_rows_cold_and_warm(tree):
    for _ in range(2):  # the first read fills the cache, the second comes from it
        rows = load_cached([tree])
        assert str(rows["contended"].dtype) == "boolean" and str(rows["batch_size"].dtype) == "Int64"
        assert sorted(rows["fingerprint"].unique()) == ["012345678901", "abc"]
    assert (tree / ".amp_bench_cache" / "results.pkl").is_file()
    assert load_tree(tree)["contended"].dropna().tolist().count(True) == 1
    assert str(load_cached([tree / "old"])["contended"].dtype) == "boolean"


def test_yes_no_cells_read_as_is_true_reads_them():
    cells = [True, "True", "true", 1, "1", 1.0, "yes", False, "False", "false", 0, "0", 0.0, "", " ", None, np.nan]
    got = typed(pd.DataFrame({"contended": pd.Series(cells, dtype=object)}), ["contended"])["contended"]
    assert got.iloc[:7].tolist() == [True] * 7 and got.iloc[7:13].tolist() == [False] * 6
    assert got.iloc[13:].isna().all()


def test_a_column_that_is_not_what_it_says_is_kept_as_read():
    frame = pd.DataFrame({"batch_size": [4, 2.5], "steps": ["8", "many"]})
    got = typed(frame, [])
    assert got["batch_size"].tolist() == [4.0, 2.5] and got["steps"].tolist() == ["8", "many"]


def test_every_column_is_declared_with_a_kind_and_a_meaning():
    named = RESULT_COLUMNS + columns.EXPLAIN_COLUMNS + columns.SLURM_COLUMNS + NVML_COLUMNS + columns.SAMPLE_COLUMNS
    declared = {c.name: c for c in columns.COLUMNS} | {f"samples.{c.name}": c for c in columns.SAMPLE_DECLARED}
    for name in named:
        column = declared.get(name) or declared[f"samples.{name}"]
        assert column.kind in columns.KINDS and column.meaning.strip() and column.group in columns.GROUPS, name
    assert len(RESULT_COLUMNS) == len(set(RESULT_COLUMNS))
    assert set(NVML_COLUMNS) <= set(RESULT_COLUMNS) and set(columns.EXPLAIN_COLUMNS) <= set(RESULT_COLUMNS)
    assert columns.READ_AS_FLOAT.issubset({c.name for c in columns.COLUMNS if c.kind == columns.INT})
    for name, default in columns.READ_DEFAULTS.items():
        kind = columns.BY_NAME[name].kind
        assert isinstance(default, {"bool": bool, "int": int, "text": str, "float": float}[kind]), name


def test_the_explain_categories_are_the_classifiers():
    from amp_bench.analysis.explain.categories import CATEGORIES
    assert list(columns.EXPLAIN_CATEGORIES) == list(CATEGORIES)


def test_a_table_without_rows_comes_back_as_before(tmp_path):
    """No rows (a fidelity or headroom run's empty results.csv): the declared columns, untyped, which
    the readers join with their own empty frames."""
    (tmp_path / "run").mkdir()
    pd.DataFrame(columns=RESULT_COLUMNS).to_csv(tmp_path / "run" / "results.csv", index=False)
    empty = read_table([tmp_path / "run"], "results", RESULT_COLUMNS)
    assert empty.empty and list(empty.columns) == RESULT_COLUMNS and set(map(str, empty.dtypes)) == {"object"}


def test_every_declared_table_reads_back_typed(tmp_path):
    """The samples and the study tables come back from the store typed as results do: the readers
    (report, GPU check, fidelity and headroom verdicts) take their columns as they come."""
    (tmp_path / "run").mkdir()
    pd.DataFrame({"run_id": ["r", "r"], "model_label": ["m", "m"], "precision": ["fp32", "amp_bf16"],
                  "limit_reached": ["True", ""], "max_batch_size": [64, None], "reason": ["", "12.10"],
                  "memory_cap_bytes": [2**30, None]}).to_csv(tmp_path / "run" / "headroom.csv", index=False)
    pd.DataFrame({"run_id": ["r"], "precision": ["fp16"], "seed": [0], "epoch": [0], "step": [3], "loss": [1.5],
                  "scale": [""], "skipped": [1]}).to_csv(tmp_path / "run" / "fidelity_steps.csv", index=False)
    headroom = read_table([tmp_path / "run"], "headroom")
    assert list(headroom.columns[:3]) == ["run_id", "model_label", "precision"]
    assert set(columns.STUDY_TABLES["headroom"]) <= set(headroom.columns)
    assert str(headroom["limit_reached"].dtype) == "boolean" and headroom["limit_reached"].isna().iloc[1]
    assert str(headroom["max_batch_size"].dtype) == "Int64" and headroom["memory_cap_bytes"].dtype == np.float64
    assert headroom["reason"].isna().iloc[0] and headroom["reason"].iloc[1] == "12.10"
    steps = read_table([tmp_path / "run"], "fidelity_steps")
    assert str(steps["skipped"].dtype) == "boolean" and bool(steps["skipped"].iloc[0])
    assert steps["scale"].dtype == np.float64 and str(steps["step"].dtype) == "Int64"
    for name, kinds in columns.STUDY_TABLES.items():
        assert set(kinds.values()) <= set(columns.KINDS) and kinds, name


@pytest.mark.parametrize("table", sorted(columns.TABLE_KINDS))
def test_a_column_absent_or_read_empty_is_typed_as_an_empty_one_is(table):
    """typed() makes a declared column the frame lacks, or that came back from CSV as float NaN, directly in
    its kind: the same dtype, values and read default as converting an empty text column cell by cell."""
    kinds, frame = columns.TABLE_KINDS[table], pd.DataFrame({"extra": ["x", "y"]})
    by_cell = typed(frame.join(pd.DataFrame(None, index=frame.index, columns=list(kinds), dtype=object)), table=table)
    for given in (frame, frame.join(pd.DataFrame(np.nan, index=frame.index, columns=list(kinds)))):
        got = typed(given, table=table)
        for name in kinds:
            assert str(got[name].dtype) == str(by_cell[name].dtype) and got[name].equals(by_cell[name]), (table, name)
