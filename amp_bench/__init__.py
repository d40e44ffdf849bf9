"""amp_bench: what PyTorch automatic mixed precision really buys in training.

Imports are lazy: worker processes import this package too, and must not pay for pandas.
"""

# The layers, top to bottom (README, "Architecture"; tests/test_structure.py enforces them): a module imports
# only from its own layer, the layers its layer names, and the shared base. The top-level modules are layers
# of their own ("__init__" is this package's API); the base modules import each other only.
BASE = ("errors", "identity", "modes", "stats")
LAYERS: dict[str, set[str]] = {  # layer -> the layers it may import
    "__init__": {"studies", "store"},  # run_suite, load_results, load_samples (lazily)
    "__main__": {"cli"},
    "pytest_plugin": {"studies"},  # the plugin's stable entry-point name
    "cli": {"studies", "executors", "platform", "suite", "report", "analysis", "store"},
    "worker": {"studies", "measure", "platform", "suite"},
    "studies": {"executors", "launchers", "measure", "platform", "suite", "analysis", "store"},
    "executors": {"suite"},  # where jobs run (SLURM through submitit); knows nothing of measuring
    "launchers": {"measure", "platform", "suite", "store"},
    "measure": {"platform", "suite"},
    "platform": set(),
    "suite": set(),
    "report": {"analysis", "store"},
    "analysis": {"store", "platform.gpu_specs"},  # the GPU spec table (torch-free data) that predict scales to
    "store": {"platform.nvml"},  # the NVML column names only (a torch-free constant)
    "gpu_check": {"analysis", "store", "platform.peaks"},
}


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
