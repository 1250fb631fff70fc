"""Commands over the lookup tables: export, show, pick, verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from moetune.cli import app
from moetune.cli._common import (
    DEFAULT_DB,
    check_kernels,
    console,
    err_console,
    fail,
    fmt_config,
    kernel_list,
    of_kernels,
    user_errors,
)
from moetune.cli.display import progress
from moetune.tables.picker import PACKAGED


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


@app.command()
def export(
    db: Annotated[list[Path] | None, typer.Option(
        help=f"results store(s) to read; repeat to pool several \\[default: {DEFAULT_DB}]")] = None,
    out: Annotated[Path | None, typer.Option(
        help="tables root to write into \\[default: the packaged tables, moetune/configs]")] = None,
    kernel: Annotated[list[str] | None, typer.Option("--kernel", "-k",
        help="kernel op(s) or families to export (repeat or comma-separate); default all")] = None,
    device: Annotated[str | None, typer.Option(help="only measurements from this device name")] = None,
    arch_device: Annotated[str | None, typer.Option(
        help="device whose results fill the arch tables (default: the most measured one)")] = None,
    allow_interpreter: Annotated[bool, typer.Option(
        help="let interpreter (CPU) results, whose times are meaningless, into the packaged tables")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Write the best accurate config per (device, shape, density) from the store into tables."""
    from moetune.tuner.api import export_tables

    kernels = kernel_list(kernel)
    dbs = db or [Path(DEFAULT_DB)]
    with user_errors(), progress("export", "reading the store(s)", quiet) as on_progress:
        if out is None and not allow_interpreter:
            check_kernels(kernels)  # the rules' one line for an unknown name, before any store is read
        result = export_tables(dbs, out or PACKAGED, kernels=kernels, device=device, arch_device=arch_device,
                               allow_interpreter=allow_interpreter or out is not None,
                               on_progress=on_progress)
    for f in result.files:
        counts: dict[str, int] = {}
        for c in f.changes:
            counts[c.status] = counts.get(c.status, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        console.print(f"[bold]{f.path}[/]: {summary}", highlight=False)
        for c in f.changes:
            if c.status == "changed":
                console.print(f"  density {c.density:g}: {fmt_config(dict(c.old_config))} -> "
                              f"{fmt_config(dict(c.new_config))}", highlight=False)
            elif c.status == "added":
                console.print(f"  density {c.density:g}: added {fmt_config(dict(c.new_config))}",
                              highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    for p in result.problems:
        err_console.print(f"[red]problem:[/] {p}", highlight=False, soft_wrap=True)
    if not result.files and not result.problems:
        console.print("nothing to export (no matching measurements)")
    if result.problems:
        raise typer.Exit(1)


def _kernel_tables(names: list[str], arch: str | None) -> list[Path]:
    """The table files of these ops or families in the config dirs; an unknown name with none is an error."""
    from moetune.tables import format as tables
    from moetune.tables.picker import config_dirs

    files: list[Path] = []
    for name in names:
        tables.check_kernel_name(name)
        found = [f for root in config_dirs()
                 for f in sorted(q for d in root.glob(f"{arch or '*'}/*")
                                 if of_kernels(d.name, [name])
                                 for q in d.glob("**/*.json"))]
        if not found:
            check_kernels([name])
        files += [f for f in found if f not in files]
    return files


def _entries_table(doc: dict, wide: bool) -> Table:
    """One row per entry; the narrow view (density, routes, config, ms, speedup) fits 100 columns, a
    config too long for what is left ending in an ellipsis rather than wrapping the row. The wide view
    wraps the config instead; numbers are never the cells cut."""
    cols = ("density", "routes", "config", "ms", "default ms", "speedup", "error", "roofline") if wide \
        else ("density", "routes", "config", "ms", "speedup")
    t = Table()
    for col in cols:
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=col != "config")
    for e in doc["entries"]:
        cells = {"density": f"{e['density']:g}", "routes": str(e.get("routes", "-")),
                 "config": fmt_config(e["config"]) if wide else
                 Text(fmt_config(e["config"]), no_wrap=True, overflow="ellipsis"),
                 "ms": _num(e["time_ms"], ".4g"), "default ms": _num(e["default_ms"], ".4g"),
                 "speedup": _num(e["speedup"], ".2f") + ("x" if e["speedup"] is not None else ""),
                 "error": _num(e["error"], ".2g"), "roofline": _num(e.get("roofline_frac"), ".0%")}
        t.add_row(*(cells[c] for c in cols))
    return t


@app.command()
def show(
    paths: Annotated[list[Path] | None, typer.Argument(help="table files or directories")] = None,
    kernel: Annotated[list[str] | None, typer.Option("--kernel", "-k", help="these ops' or families' "
                      "tables in the config dirs (repeat or comma-separate)")] = None,
    arch: Annotated[str | None, typer.Option(help="only tables of this arch (with --kernel)")] = None,
    wide: Annotated[bool, typer.Option(help="every column: also the default's time, error and roofline "
                                            "fraction")] = False,
) -> None:
    """A table's entries: density, routes, config, time and speedup over the default (--wide: more)."""
    from moetune.tables import format as tables
    from moetune.tuner.verify import table_files

    names = kernel_list(kernel)
    with user_errors():
        if paths:
            files = table_files(paths)
        elif names:
            files = _kernel_tables(names, arch)
        else:
            fail("give table PATHs or --kernel")
        if not files:
            fail("no tables found")
        for f in files:
            doc = tables.read(f)
            where = doc["device"] or f"arch {doc['arch']}"
            # above the table, not its title: a title wraps to the table's width
            title = f"{doc['kernel']} {tables.shape_stem(doc['shape'])} on {where}"
            console.print(f"[bold]{escape(title)}[/]\n[dim]{escape(str(f))}[/]", highlight=False,
                          soft_wrap=True)
            console.print(_entries_table(doc, wide))
            v = doc["versions"]
            console.print(f"[dim]devices {', '.join(doc['device_names'])}; triton {v['triton']}, torch "
                          f"{v['torch']}, cuda {v['cuda']}, moetune {v['moetune']}; {doc['date']}; "
                          f"{doc['candidates']['measured']} measured, {doc['candidates']['ok']} ok[/]",
                          highlight=False)


def _check_arch(arch: str) -> None:
    """ValueError unless ``arch`` is one moetune knows or one the config dirs hold tables for."""
    from moetune.tables.picker import config_dirs
    from moetune.tuner.verify import KNOWN_ARCHS

    known = set(KNOWN_ARCHS) | {d.name for root in config_dirs() if root.is_dir() for d in root.iterdir()
                                if d.is_dir()}
    if arch not in known:
        raise ValueError(f"unknown arch {arch!r}; known archs: {', '.join(sorted(known))}")


@app.command()
def pick(
    kernel: Annotated[str, typer.Option("--kernel", "-k", help="kernel op, e.g. fp8_decode.gate_up")],
    routes: Annotated[int, typer.Option(help="routed rows (tokens * top_k * active fraction)")],
    model: Annotated[str | None, typer.Option("--model", "-m", help="model preset giving the shape")] = None,
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
        if arch is not None:
            _check_arch(arch)
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
        help="table files or directories \\[default: the packaged tables, moetune/configs]")] = None,
    schema_only: Annotated[bool, typer.Option(
        help="static checks only: schema, file place, kernel constraints")] = False,
) -> None:
    """Check tables against the schema and kernel constraints; on a GPU also re-run every entry."""
    from moetune.tuner.verify import verify as run_verify

    with user_errors():
        files, findings = run_verify(paths or [PACKAGED], schema_only=schema_only, require=True)
    for f in findings:
        style = "red" if f.level == "error" else "yellow"
        err_console.print(f"[{style}]{f.level}:[/] {f}", highlight=False, soft_wrap=True)
    errors = sum(f.level == "error" for f in findings)
    bad_files = len({f.path for f in findings if f.level == "error"})
    console.print(f"{len(files)} table file(s) checked, {len(files) - bad_files} ok, {errors} error(s)",
                  highlight=False)
    if errors:
        raise typer.Exit(1)
