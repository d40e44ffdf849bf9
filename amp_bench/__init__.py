"""amp_bench: what PyTorch automatic mixed precision really buys in training.

Imports are lazy: worker processes import this package too, and must not pay for pandas.
"""


def run_suite(path, **overrides):
    """Run a suite file and return a pandas DataFrame (one row per case and repeat).

    Keyword arguments mirror the CLI: device="cpu"|"cuda"|"auto", results_dir="results",
    and suite settings such as steps=, warmup_steps=, repeats=, batch_sizes=, precisions=.
    """
    from amp_bench.studies.benchmark import run_suite as _run_suite
    return _run_suite(path, **overrides)


def load_results(path="results"):
    """One row per case and repeat, from one run directory or a tree of them."""
    from amp_bench.store.results import load_results as _load_results
    return _load_results(path)


def load_samples(path="results"):
    """Per-step samples (long format), from one run directory or a tree of them."""
    from amp_bench.store.results import load_samples as _load_samples
    return _load_samples(path)


__all__ = ["load_results", "load_samples", "run_suite"]
