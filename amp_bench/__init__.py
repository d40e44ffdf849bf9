"""amp_bench: what PyTorch automatic mixed precision really buys in training."""
from amp_bench.results import load_results, load_samples


def run_suite(path, **overrides):
    """Run a suite file and return a pandas DataFrame (one row per case and repeat).

    Keyword arguments mirror the CLI: device="cpu"|"cuda"|"auto", results_dir="results",
    and suite settings such as steps=, warmup_steps=, repeats=, batch_sizes=, precisions=.
    """
    from amp_bench.runner import run_suite as _run_suite
    return _run_suite(path, **overrides)


__all__ = ["load_results", "load_samples", "run_suite"]
