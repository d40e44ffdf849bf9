"""Run directories on disk: results.py is the one reader and writer (tables, manifest with its
format_version, find_run_dirs/read_table/read_manifest/load_results), columns.py every column
declared once (kind, meaning, read default), typed.py the typed read the readers return,
column_docs.py docs/results.md's generated column reference, cache.py the columnar cache for
fleet-size trees, flags.py reading one yes/no or text cell, fingerprint.py the machine key of a
series, ingest.py pytest-benchmark files as run directories. Torch-free."""
