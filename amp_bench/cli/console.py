"""Everything the command line draws with rich: number formatting, the progress reporters of run,
fidelity and headroom, and the tables that end each command (the run summary, fidelity verdicts,
headroom, compare, history, env). The cmd_* functions in the sibling modules compute; this prints.

The progress reporters subclass the progress bases of the studies (amp_bench.studies), which load pandas
and the study machinery: they live in cli/progress.py, which the reporter functions here import when
called, so importing this module (and so `amp_bench --help`) stays light."""
from __future__ import annotations

from rich import box
from rich.markup import escape
from rich.table import Table

from amp_bench import modes
from amp_bench.cli.formats import _fmt, _fmt_bytes
from amp_bench.identity import EAGER, case_label
from amp_bench.store.flags import is_true, true_rows

# -- run ---------------------------------------------------------------------------------------------

def rich_reporter(console):
    """The run's reporter (cli/progress.py)."""
    from amp_bench.cli.progress import RichReporter  # here: see the module docstring
    return RichReporter(console)


def cluster_reporter(console):
    """A cluster run's progress (cli/progress.py)."""
    from amp_bench.cli.progress import RichClusterReporter  # here: see the module docstring
    return RichClusterReporter(console)


def print_summary(results, console) -> None:
    """One table per model (summary_table), then the notes every table shares and the headline."""
    from amp_bench.analysis.headline import headlines
    from amp_bench.analysis.speedups import summarize
    summary = summarize(results)
    for (model, device_name), table in summary.groupby(["model_label", "device_name"], sort=False):
        console.print(summary_table(table, f"{model} on {device_name}"))
    _print_summary_notes(summary, console)
    sentences = headlines(summary)
    if sentences:
        console.print()
        for sentence in sentences:
            console.print(f"[bold]{escape(sentence)}[/]", highlight=False, soft_wrap=True)


def lockstep_note(methods) -> str:
    """' (in lockstep)' when every paired speedup's method says its pairs ran in lockstep, ' (some in
    lockstep)' when only some do, else '' (a baseline's own row reads "the baseline itself")."""
    if methods is None:
        return ""
    paired = methods.dropna().astype(str)
    said = paired[paired.str.startswith("paired")].str.contains("in lockstep")
    return " (in lockstep)" if len(said) and said.all() else " (some in lockstep)" if said.any() else ""


def summary_table(table, title: str) -> Table:
    """Each precision's step time, its paired speedup (with its interval) over every baseline the registry
    names (fp32, and tf32 where it ran) and its memory saving against the reference (fp32)."""
    from amp_bench.analysis.speedups import speedup_text
    ref = modes.reference()
    cpu = (table["device"] == "cpu").all()
    show_layout = table["channels_last"].any()  # the summary's keys are typed (identity.keyed)
    later = [b for b in modes.baseline_names()[1:] if f"speedup_vs_{b}" in table
             and table[f"speedup_vs_{b}"].notna().any()]
    show_procs, show_compile = (table["world_size"] > 1).any(), (table["compile_mode"] != EAGER).any()
    lockstep = lockstep_note(table.get(f"speedup_vs_{ref}_method"))
    out = Table(title=f"{title}: medians across repeats; speedups paired per repeat{lockstep}, with their 95% interval",
                title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["bs"] + (["layout"] if show_layout else []) + (["procs"] if show_procs else []) + \
        ["precision", "ms/step", "samples/s", f"vs {ref}"] + [f"vs {b}" for b in later] + \
        (["scaling eff"] if show_procs else []) + \
        (["compile", "vs eager", "compile s", "breaks", "recomp"] if show_compile else []) + \
        ["peak RSS" if cpu else "peak alloc", "saved"] + (["saved*"] if cpu else [])
    for name in columns:
        out.add_column(name, justify="left" if name in ("layout", "precision") else "right", no_wrap=True)
    for _, r in table.iterrows():
        cells = [str(int(r["batch_size"]))] + (["cl" if r["channels_last"] else "nchw"] if show_layout else [])
        cells += [str(int(r["world_size"]))] if show_procs else []
        speedup = speedup_text(r[f"speedup_vs_{ref}"], r.get(f"speedup_vs_{ref}_ci_low"),
                               r.get(f"speedup_vs_{ref}_ci_high")) if r["precision"] != ref else "1.00x"
        if is_true(r.get(f"contended_vs_{ref}")) and speedup != "-":
            speedup = f"[red]{speedup} contended[/]"
        cells += [modes.with_emulated(r["precision"], is_true(r.get("emulated"))),
                  _fmt(r["step_time_ms"], ".1f") if r["status"] == "ok" else escape(r["status"]),
                  _fmt(r["throughput"], ".1f"), speedup]
        cells += [speedup_text(r[f"speedup_vs_{b}"], r.get(f"speedup_vs_{b}_ci_low"), r.get(f"speedup_vs_{b}_ci_high"))
                  for b in later]
        cells += [_fmt(r["scaling_efficiency"], ".0%")] if show_procs else []
        if show_compile:  # vs eager: the same precision eager, same run (summary._versus_eager)
            cells += [r["compile_mode"], _fmt(r["speedup_vs_eager"], ".2f", "x"), _fmt(r["compile_time_s"], ".1f"),
                      _fmt(r["graph_breaks"], ".0f"), _fmt(r["recompiles"], ".0f")]
        cells += [_fmt_bytes(r["peak_mem_bytes"]), _fmt(r[f"mem_saving_vs_{ref}"], ".1%")]
        cells += [_fmt(r[f"mem_saving_above_baseline_vs_{ref}"], ".1%")] if cpu else []
        out.add_row(*cells)
    return out


def _print_summary_notes(summary, console) -> None:
    if (summary["world_size"] > 1).any():
        console.print("[dim]procs: DDP world size; weak scaling (per-process batch fixed, samples/s global); "
                      "scaling eff = step time with 1 process / step time with procs (docs/distributed.md)[/]")
    if (summary["device"] == "cpu").any():
        console.print("[dim]CPU memory is the worker's peak RSS; saved* leaves out the RSS before the model was "
                      "built (the torch runtime's own footprint)[/]")
    for reason in dict.fromkeys(r for r in summary.get("emulated_reason", []) if isinstance(r, str) and r):
        console.print(f"[yellow]emulated[/]: {escape(reason)}", highlight=False)
    ref = modes.reference()
    contended = summary[true_rows(summary["contended"])]
    for _, r in contended.iterrows():
        dropped = r.get(f"speedup_vs_{ref}_dropped")
        if is_true(r.get(f"contended_vs_{ref}")) or not dropped or dropped != dropped:
            console.print(f"[red]contended[/]: {escape(case_label(r))} {r['precision']}: "
                          f"{escape(str(r['contention']))}; its figures are not trustworthy (rerun on a quiet "
                          "machine)", highlight=False, soft_wrap=True)
        else:  # enough clean pairs remained: the disturbed ones are left out of the figures
            console.print(f"[yellow]dropped[/]: {escape(case_label(r))} {r['precision']}: {int(dropped)} pair(s) left "
                          f"out of its figures, contended: {escape(str(r['contention']))}", highlight=False,
                          soft_wrap=True)
    not_run = summary[(summary["status"] == "unsupported")]
    for reason in dict.fromkeys(not_run["reason"].astype(str)):
        names = ", ".join(dict.fromkeys(not_run.loc[not_run["reason"].astype(str) == reason, "precision"]))
        console.print(f"[dim]not run ({escape(names)}): {escape(reason)}[/]", highlight=False, soft_wrap=True)


# -- fidelity and headroom ---------------------------------------------------------------------------

def fidelity_progress(console):
    """The fidelity study's reporter (cli/progress.py)."""
    from amp_bench.cli.progress import FidelityProgress  # here: see the module docstring
    return FidelityProgress(console)


def print_fidelity(runs, console) -> None:
    """Each precision's held-out accuracy against fp32, with GradScaler health and gradient underflow."""
    verdicts = runs.attrs["verdicts"]
    health = runs.groupby("precision", sort=False).agg(
        skips=("scaler_skipped_steps", "sum"), min_scale=("scaler_min_scale", "min"),
        lost=("grad_underflow_fraction_unscaled", "max"), lost_scaled=("grad_underflow_fraction_scaled", "max"))
    has_scaler, has_probe = health["min_scale"].notna().any(), health["lost"].notna().any()
    table = Table(title=f"held-out accuracy against fp32 (tolerance +/-{verdicts['tolerance_pp'].iloc[0]:g} pp)"
                  + ("; grads lost: share of gradient elements zero under autocast, unscaled->scaled"
                     if has_probe else ""), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["precision", "seeds", "acc", "diff pp", "fp32 range pp", "train loss"]
    columns += (["skips", "min scale"] if has_scaler else []) + (["grads lost"] if has_probe else []) + ["verdict"]
    has_also = "verdict_also" in verdicts and verdicts["verdict_also"].notna().any()
    columns += ["2nd reference"] if has_also else []
    for name in columns:  # narrow terminals wrap rather than cut a figure short
        table.add_column(name, no_wrap=name in ("precision", "verdict"), overflow="fold",
                         justify="left" if name in ("precision", "verdict", "2nd reference") else "right")
    colours = {"parity": "green", "worse": "red", "better": "yellow"}
    for _, v in verdicts.iterrows():
        h = health.loc[v["precision"]]
        verdict = f"[{colours[v['verdict']]}]{v['verdict']}[/]" if v["verdict"] in colours else escape(v["verdict"])
        cells = [v["precision"], str(v["seeds"]), _fmt(v["test_accuracy"], ".2%"), _fmt(v["accuracy_diff_pp"], "+.2f"),
                 _fmt(v["fp32_seed_range_pp"], ".2f"), _fmt(v["final_train_loss"], ".4f")]
        if has_scaler:
            cells += [_fmt(h["skips"], ".0f") if h["min_scale"] == h["min_scale"] else "-", _fmt(h["min_scale"], ".4g")]
        if has_probe:
            cells.append(f"{_fmt(h['lost'], '.3%')}->{_fmt(h['lost_scaled'], '.3%')}" if h["lost"] == h["lost"]
                         else "-")
        extra = [f"{v['verdict_also']} vs {v['also_against']} ({_fmt(v['accuracy_diff_also_pp'], '+.2f')} pp)"
                 if isinstance(v["verdict_also"], str) else "-"] if has_also else []
        table.add_row(*cells, verdict, *extra)
    console.print(table)
    if (runs["scaler_scale_below_one"] == True).any():  # == True: NaN for runs without a scaler
        console.print("[red]warning[/]: the loss scale fell below 1: gradients overflow fp16 even unscaled",
                      highlight=False)


def headroom_progress(console):
    """The headroom search's reporter (cli/progress.py)."""
    from amp_bench.cli.progress import HeadroomProgress  # here: see the module docstring
    return HeadroomProgress(console)


def print_headroom(table, console) -> None:
    """The largest batch each precision trains at, and its throughput there, against fp32."""
    procs = table["nproc_per_node"].notna().any()
    out = Table(title="largest batch that trains (and samples/s at it), against fp32", title_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("model", *(["procs"] if procs else []), "precision", "largest", "first OOM", "x fp32",
                 "samples/s", "x fp32 ", "probes", "status"):
        out.add_column(name, no_wrap=name == "precision", overflow="fold",
                       justify="left" if name in ("model", "precision", "status") else "right")
    for _, r in table.iterrows():
        largest = _fmt(r["max_batch_size"], ".0f") + (" (limit)" if r["limit_reached"] else "")
        ratio = ("≥" if r["batch_ratio_is_lower_bound"] else "") + _fmt(r["batch_ratio_vs_fp32"], ".2f", "x")
        out.add_row(escape(r["model_label"]), *([_fmt(r["world_size"], ".0f")] if procs else []), r["precision"],
                    largest, _fmt(r["first_oom_batch_size"], ".0f"), ratio, _fmt(r["throughput_at_max"], ".1f"),
                    _fmt(r["throughput_ratio_vs_fp32"], ".2f", "x"), str(r["probes"]),
                    r["status"] if r["status"] == "ok" else f"{r['status']}: {escape(str(r['reason']))}")
    console.print(out)


# -- analysis ----------------------------------------------------------------------------------------

def print_comparison(comparison, console) -> None:
    """A row per case and metric with its ratio, interval, p-value and verdict; then the notes."""
    table = Table("case", "metric", "baseline", "candidate", "ratio", "95% CI", "p (MWU)", "verdict",
                  title=f"candidate vs baseline: {comparison.summary}", title_justify="left")
    colours = {"regression": "red", "improvement": "green", "unstable": "yellow", "not enough data": "dim",
               "not comparable (contended)": "yellow", "unsupported in candidate": "red",
               "not run on either side": "dim", "new in candidate": "cyan"}
    for r in comparison.results:
        colour = colours.get(r.verdict, "")
        verdict = f"[{colour}]{r.verdict}[/]" if colour else r.verdict
        table.add_row(escape(r.case_id), r.metric, _fmt(r.baseline, ".4g"), _fmt(r.candidate, ".4g"),
                      _fmt(r.ratio, ".3f"), f"{_fmt(r.ci_low, '.3f')}-{_fmt(r.ci_high, '.3f')}",
                      _fmt(r.p_value, ".2g"), verdict)
    console.print(table)
    for note in comparison.notes + comparison.unmatched:
        if note != comparison.decision:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"[bold]{escape(comparison.decision)}[/] (exit {comparison.exit_code})", highlight=False,
                  soft_wrap=True)


# -- machine -----------------------------------------------------------------------------------------

def print_env(info, console) -> None:
    """The probed device, GPU, CPU, versions and fingerprint, then which precision modes run here and why."""
    device, gpu, fp = info["device"], info.get("gpu", {}), info["fingerprint"]
    line = f"[bold]device[/]: {escape(device['name'])} ({info['architecture']}"
    if device.get("capability"):
        line += f", compute capability {fp['compute_capability']}, {device['total_memory_bytes'] / 2**30:.0f} GiB"
    console.print(line + ")", highlight=False)
    if device["type"] == "cuda":
        nvml = gpu.get("nvml") or "ok"
        console.print(f"[bold]gpu[/]: driver {gpu.get('driver_version') or '-'}, uuid {gpu.get('gpu_uuid') or '-'}, "
                      f"power limit {gpu.get('power_limit_w') or '-'} W, persistence {gpu.get('persistence_mode')}, "
                      f"MIG {gpu.get('mig_mode')}; NVML: {escape(str(nvml))}", highlight=False)
    console.print(f"[bold]cpu[/]: {escape(device['cpu_model'])}, {fp['cpu_count']} cores; bf16/fp16 ISA: "
                  f"{fp['cpu_bf16_isa']}", highlight=False)
    console.print("  ".join(f"{k.replace('_version', '')} {v}" for k, v in info["versions"].items() if v),
                  highlight=False)
    software = info.get("software", {})
    console.print(f"[bold]fingerprint[/]: {fp['fingerprint']}   git: {software.get('git_commit', '-')}   "
                  f"pip packages: {len(software.get('pip_freeze', []))}"
                  + ("   conda env: "
                     f"{'recorded' if not software['conda_env'].startswith('not') else software['conda_env']}"
                     if software.get("conda_env") else ""), highlight=False)
    if info["host"]["env"]:
        console.print("[bold]env[/]: " + " ".join(f"{k}={v}" for k, v in info["host"]["env"].items()), highlight=False)
    table = Table("precision", "runs here", "why")
    for mode, support in info["support"].items():
        runs = "yes" if support["supported"] else ("only with allow_emulated" if support["emulated"] else "no")
        table.add_row(mode, runs, escape(support["reason"]) or "-")
    console.print(table)
