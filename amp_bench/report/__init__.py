"""`amp_bench report`: results directories -> an HTML report, a markdown summary and CSV tables.

plotly is imported only here, so running and measuring never need it.
"""
from __future__ import annotations

from pathlib import Path

from amp_bench.errors import UserError


def build_report(inputs, output: str | Path | None = None, formats=("html", "md", "csv"), images: str | None = None,
                 prices: str | Path | None = None, reference: str | None = None) -> dict[str, object]:
    """`prices`: a YAML file of price per GPU-hour (samples per $ in "GPUs compared"); `reference`: a GPU
    to divide every GPU's samples/s by there."""
    from amp_bench.analysis.gpus import find_gpu, load_prices
    from amp_bench.report.data import collect
    data = collect(list(inputs), load_prices(prices) if prices else None, reference)
    if reference and data.has_benchmarks:  # a --reference that names no GPU: one line, before any writing
        find_gpu(data.gpus, reference)
    if output is None:
        name = data.run_dirs[0].name if len(data.run_dirs) == 1 else f"merged-{len(data.run_dirs)}-runs"
        output = Path("reports") / f"{name}.html"
    if "html" in formats or images:
        try:
            import plotly  # noqa: F401
        except ImportError:
            raise UserError("the HTML report needs plotly (pip install plotly); use --format md,csv without "
                            "it") from None
    from amp_bench.report.render import write_report
    try:
        return write_report(data, Path(output), tuple(formats), images)
    except OSError as exc:
        raise UserError(f"{output}: cannot write the report ({exc.strerror or exc})") from None
