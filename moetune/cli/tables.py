"""Commands over the lookup tables: export, show, pick, verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from moetune.cli import app
from moetune.cli._common import console, err_console, fail, split_list, user_errors
from moetune.tables.picker import PACKAGED

_SHORT = {"BLOCK_SIZE_M": "BM", "BLOCK_SIZE_N": "BN", "BLOCK_SIZE_K": "BK", "GROUP_SIZE_M": "GM",
          "num_warps": "w", "num_stages": "s"}


def _fmt_config(config: dict) -> str:
    """Tile sizes first (BM BN BK GM), other keys as key=value, then warps and stages."""
    order = list(_SHORT)
    keys = sorted(config, key=lambda k: (order.index(k) if k in order[:4] else 4 if k not in order
                                         else order.index(k) + 1, k))
    return " ".join(f"{_SHORT[k]}{config[k]}" if k in _SHORT else f"{k}={config[k]}" for k in keys)


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


@app.command()
def export(
    db: Annotated[list[Path] | None, typer.Option(
        help="results store(s) to read; repeat to pool several [default: results/moetune.sqlite]")] = None,
    out: Annotated[Path, typer.Option(help="tables root to write into (default: the packaged tables)")] = (
        PACKAGED),
    kernel: Annotated[list[str] | None, typer.Option(
        help="kernel op(s) or families to export (repeat or comma-separate); default all")] = None,
    device: Annotated[str | None, typer.Option(help="only measurements from this device name")] = None,
    arch_device: Annotated[str | None, typer.Option(
        help="device whose results fill the arch tables (default: the most measured one)")] = None,
) -> None:
    """Write the best accurate config per (device, shape, density) from the store into tables."""
    from moetune.tuner.export import export as run_export

    kernels = [k for item in kernel or [] for k in split_list(item)]
    with user_errors():
        result = run_export(db or [Path("results/moetune.sqlite")], out, kernels=kernels, device=device,
                            arch_device=arch_device)
    for f in result.files:
        counts: dict[str, int] = {}
        for c in f.changes:
            counts[c.status] = counts.get(c.status, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        console.print(f"[bold]{f.path}[/]: {summary}", highlight=False)
        for c in f.changes:
            if c.status == "changed":
                console.print(f"  density {c.density:g}: {_fmt_config(dict(c.old_config))} -> "
                              f"{_fmt_config(dict(c.new_config))}", highlight=False)
            elif c.status == "added":
                console.print(f"  density {c.density:g}: added {_fmt_config(dict(c.new_config))}",
                              highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    for p in result.problems:
        err_console.print(f"[red]problem:[/] {p}", highlight=False, soft_wrap=True)
    if not result.files and not result.problems:
        console.print("nothing to export (no matching measurements)")
    if result.problems:
        raise typer.Exit(1)


@app.command()
def show(
    paths: Annotated[list[Path] | None, typer.Argument(help="table files or directories")] = None,
    kernel: Annotated[str | None, typer.Option(help="this kernel op's tables in the config dirs")] = None,
    arch: Annotated[str | None, typer.Option(help="only tables of this arch (with --kernel)")] = None,
) -> None:
    """A table's entries: density, config, time, default's time, speedup, error, roofline fraction."""
    from moetune.tables import format as tables
    from moetune.tables.picker import config_dirs
    from moetune.tuner.verify import table_files

    with user_errors():
        if paths:
            files = table_files(paths)
        elif kernel:
            tables.check_kernel_name(kernel)
            pattern = f"{arch or '*'}/{kernel}/**/*.json"
            files = [f for root in config_dirs() for f in sorted(root.glob(pattern))]
        else:
            fail("give table PATHs or --kernel")
        if not files:
            fail("no tables found")
        for f in files:
            doc = tables.read(f)
            where = doc["device"] or f"arch {doc['arch']}"
            t = Table(title=f"{doc['kernel']} {tables.shape_stem(doc['shape'])} on {where}\n[dim]{f}[/]")
            for col in ("density", "routes", "config", "ms", "default ms", "speedup", "error", "roofline"):
                t.add_column(col, justify="left" if col == "config" else "right", no_wrap=col == "config")
            for e in doc["entries"]:
                t.add_row(f"{e['density']:g}", str(e.get("routes", "-")), _fmt_config(e["config"]),
                          _num(e["time_ms"], ".4g"), _num(e["default_ms"], ".4g"),
                          _num(e["speedup"], ".2f") + ("x" if e["speedup"] is not None else ""),
                          _num(e["error"], ".2g"), _num(e.get("roofline_frac"), ".0%"))
            console.print(t)
            v = doc["versions"]
            console.print(f"[dim]devices {', '.join(doc['device_names'])}; triton {v['triton']}, torch "
                          f"{v['torch']}, cuda {v['cuda']}, moetune {v['moetune']}; {doc['date']}; "
                          f"{doc['candidates']['measured']} measured, {doc['candidates']['ok']} ok[/]",
                          highlight=False)


@app.command()
def pick(
    kernel: Annotated[str, typer.Option(help="kernel op, e.g. fp8_decode.gate_up")],
    routes: Annotated[int, typer.Option(help="routed rows (tokens * top_k * active fraction)")],
    model: Annotated[str | None, typer.Option(help="model preset giving the shape")] = None,
    tp: Annotated[int, typer.Option(help="tensor-parallel degree (with --model)")] = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel degree (with --model)")] = 1,
    shape: Annotated[str | None, typer.Option(help="shape as E=..,N=..,K=..,top_k=..[,field=value]")] = None,
    device: Annotated[str | None, typer.Option(help="device name (default: this machine's)")] = None,
    arch: Annotated[str | None, typer.Option(help="arch, e.g. sm_90 (default: the device's)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """The config the kernels would use at this point, and where it comes from."""
    from moetune.models import get_model
    from moetune.specs.registry import get_spec
    from moetune.tables.picker import pick_config_with_source
    from moetune.tuner.problems import parse_shape

    with user_errors():
        spec = get_spec(kernel)
        if (model is None) == (shape is None):
            fail("give exactly one of --model or --shape")
        the_shape = spec.shape_from_model(get_model(model), tp, ep) if model else parse_shape(shape)
        the_shape = spec.normalize_shape(the_shape)
        if routes < 0:
            raise ValueError(f"--routes must be >= 0, got {routes}")
        p = pick_config_with_source(kernel, the_shape, routes, device=device, arch=arch)
    answer = {"kernel": kernel, "shape": the_shape, "routes": routes, "density": routes / the_shape["E"],
              "config": dict(p.config), "source": p.source, "path": p.path, "table_density": p.density_key}
    if as_json:
        console.print_json(json.dumps(answer))
        return
    console.print(f"{kernel} {the_shape} routes={routes} (density {answer['density']:.4g})", highlight=False)
    console.print(f"config: [bold]{json.dumps(answer['config'], sort_keys=True)}[/]", highlight=False)
    where = f" {p.path} at density {p.density_key:g}" if p.path else ""
    console.print(f"source: {p.source}{where}", highlight=False)


@app.command()
def verify(
    paths: Annotated[list[Path] | None, typer.Argument(
        help="table files or directories (default: configs/)")] = None,
    schema_only: Annotated[bool, typer.Option(
        help="static checks only: schema, file place, kernel constraints")] = False,
) -> None:
    """Check tables against the schema and kernel constraints; on a GPU also re-run every entry."""
    from moetune.tuner.verify import verify as run_verify

    with user_errors():
        files, findings = run_verify(paths or [PACKAGED], schema_only=schema_only)
    for f in findings:
        style = "red" if f.level == "error" else "yellow"
        err_console.print(f"[{style}]{f.level}:[/] {f}", highlight=False, soft_wrap=True)
    errors = sum(f.level == "error" for f in findings)
    bad_files = len({f.path for f in findings if f.level == "error"})
    console.print(f"{len(files)} table file(s) checked, {len(files) - bad_files} ok, {errors} error(s)",
                  highlight=False)
    if errors:
        raise typer.Exit(1)
