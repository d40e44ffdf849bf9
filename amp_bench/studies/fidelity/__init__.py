"""The fidelity study: orchestration in the parent (run), training in the worker (train), real
shipped data (datasets). Its verdicts and loaders are torch-free in amp_bench.analysis.fidelity."""
