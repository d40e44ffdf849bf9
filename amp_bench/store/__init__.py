"""Run directories on disk: results.py is the one reader and writer (tables, manifest with its
format_version, find_run_dirs/read_table/read_manifest/load_results), cache.py its columnar cache
for fleet-size trees, flags.py the one reader of yes/no columns, fingerprint.py the machine key of a
series, ingest.py pytest-benchmark files as run directories. Torch-free."""
