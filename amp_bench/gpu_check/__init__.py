"""The GPU check's page builder (scripts/gpu_check.sh --part 1 | --part 2): the verdict, summary.md
and the flat CSVs each part leaves in $OUT (summary.py), the page's sections (tables.py).
`python -m amp_bench.gpu_check summary|matmul ...` (__main__.py). Torch-free at import."""
