"""The commands about this machine and its inputs rather than about results: `validate` (suite files),
`list-models` (model references that resolve here) and `env` (the device and which precision modes
it supports), with their options."""
from __future__ import annotations

from pathlib import Path

from amp_bench.cli import console as render_console
from amp_bench.errors import UserError


def add_parsers(sub) -> None:
    validate = sub.add_parser("validate", help="check suite files without running them")
    validate.add_argument("suites", nargs="+", type=Path)
    validate.set_defaults(func=cmd_validate)

    models = sub.add_parser("list-models", help="model references that resolve here")
    models.add_argument("--kind", choices=("torchvision", "transformers", "python"))
    models.set_defaults(func=cmd_list_models)

    env = sub.add_parser("env", help="this machine's device and which precision modes it supports, and why")
    env.add_argument("--device", default="auto")
    env.add_argument("--json", action="store_true", help="the whole record as JSON, for machines")
    env.set_defaults(func=cmd_env)


def cmd_validate(args, console) -> int:
    from amp_bench.suite import load_suite
    failed = []
    for path in args.suites:
        try:
            suite = load_suite(path)
        except UserError as exc:
            failed.extend(exc.lines)
            continue
        parts = [f"{len(suite.cases(d))} cases x {suite.settings_for(d)['repeats']} repeats on {d}"
                 for d in ("cuda", "cpu") if suite.has_matrix]
        for d in ("cuda", "cpu"):  # load_suite has checked every section already; this only describes
            if suite.section("fidelity", d) is not None:
                spec = suite.fidelity_spec(d)
                parts.append(f"fidelity on {d}: {spec.model} on {spec.dataset}, {len(spec.precisions)} "
                             f"precisions x {len(spec.seeds)} seeds")
            if suite.section("headroom", d) is not None:
                parts.append(f"headroom section on {d}")
        console.print(f"{path}: ok ({', '.join(parts)})", highlight=False, soft_wrap=True)
    if failed:
        raise UserError(failed)
    return 0


def cmd_list_models(args, console) -> int:
    from amp_bench.suite.model_refs import torchvision_names, transformers_types
    if args.kind in (None, "torchvision"):
        names = torchvision_names()
        console.print(f"[bold]torchvision/<name>[/] ({len(names)}, weights=None):")
        console.print("  " + "  ".join(names), highlight=False)
    if args.kind in (None, "transformers"):
        types = transformers_types()
        console.print(f"[bold]transformers/<model_type>[/] ({len(types)}, built from config; default task):")
        console.print("  " + "  ".join(f"{k}[dim]({v})[/]" for k, v in sorted(types.items())), highlight=False)
    if args.kind in (None, "python"):
        console.print("[bold]python:<module>:<callable>[/]: callable(**options) -> (model, make_batch, loss_fn); "
                      "make_batch(batch_size, device) -> (inputs, target); loss_fn(output, target) -> loss")
    return 0


def cmd_env(args, console) -> int:
    import json

    from amp_bench.platform.provenance import host_facts
    from amp_bench.store.fingerprint import fingerprint_columns
    from amp_bench.studies.session import probe  # probes in a throwaway worker: this process never touches CUDA
    info = probe(args.device)
    info["host"] = host_facts()  # the probe brought the software record
    info["fingerprint"] = fingerprint_columns(info["device"], info["versions"], info.get("gpu", {}),
                                              info["host"]["hostname"])
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    render_console.print_env(info, console)
    return 0
