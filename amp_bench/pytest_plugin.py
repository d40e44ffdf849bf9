"""The pytest plugin's entry point (`amp_bench = amp_bench.pytest_plugin` in pyproject.toml): a stable
name that installs and `pytest -p amp_bench.pytest_plugin` register. The plugin lives in
amp_bench.studies.benchmark_fixture, beside the other studies."""
from amp_bench.studies.benchmark_fixture import (
    amp_benchmark,
    pytest_benchmark_update_machine_info,
    run_case_in_benchmark,
)

__all__ = ["amp_benchmark", "pytest_benchmark_update_machine_info", "run_case_in_benchmark"]
