"""``moetune bench``: default, heuristic and tuned config side by side at each point, one run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from moetune.cli import app
from moetune.cli._common import console, fail, kernel_list, split_list, user_errors
from moetune.cli.display import progress


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _speedup(ms: float | None, x: float | None) -> str:
    if x is None:
        return _ms(ms)
    style = "green" if x > 1.02 else "red" if x < 0.98 else "dim"
    return f"{_ms(ms)} [{style}]({x:.2f}x)[/]"


def _roofline(row: dict[str, Any]) -> str:
    fracs = [row[f"{role}_roofline"] for role in ("default", "heuristic", "tuned")]
    if all(f is None for f in fracs):
        return "-"
    return " / ".join("-" if f is None else f"{f:.2f}" for f in fracs)


def _point(row: dict[str, Any]) -> str:
    text = f"t{row['tokens']} r{row['routes']}"
    if row["active_fraction"] != 1:
        text += f" a{row['active_fraction']:g}"
    return text if row["routing"] == "uniform" else f"{text} {row['routing']}"


def bench_tables(result: Any) -> list[Table]:
    """One table per (kernel, shape), rows in density order as measured."""
    from moetune.tuner.bench import accuracy_text, shape_text

    where = f"{result.device.name} ({result.device.arch})" if result.meaningful else \
        "the Triton interpreter (times are meaningless)"
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in result.rows:
        groups.setdefault((row["kernel"], row["shape"]), []).append(row)
    out = []
    for (kernel, shape), rows in groups.items():
        t = Table(title=f"{kernel} {shape_text(shape)} on {where}", title_justify="left")
        for col in ("point", "density", "default ms", "heuristic ms", "tuned ms", "roofline d/h/t",
                    "accuracy", "tuned from"):
            t.add_column(col, justify="left" if col in ("point", "accuracy", "tuned from") else "right")
        for row in rows:
            acc = accuracy_text(row)
            t.add_row(_point(row), f"{row['density']:.4g}", _ms(row["default_ms"]),
                      _speedup(row["heuristic_ms"], row["heuristic_speedup"]),
                      _speedup(row["tuned_ms"], row["tuned_speedup"]), _roofline(row),
                      "[green]ok[/]" if acc == "ok" else f"[yellow]{acc}[/]", row["tuned_source"])
        out.append(t)
    return out


@app.command()
def bench(
    model: Annotated[str | None, typer.Option("--model", "-m", help="model preset, e.g. deepseek-v3")] = None,
    kernel: Annotated[list[str] | None, typer.Option("--kernel", "-k", help="ops or families (repeat or "
                      "comma-separate); default: the model's weight format")] = None,
    tp: Annotated[int, typer.Option(help="tensor-parallel degree")] = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel degree")] = 1,
    shape: Annotated[str | None, typer.Option(help="per-rank shape instead of --model, e.g. "
                                                   "E=8,N=256,K=512,top_k=2")] = None,
    tokens: Annotated[str | None, typer.Option(help="token counts (decode default 1..256)")] = None,
    routes: Annotated[str | None, typer.Option(help="route counts (prefill default 768..98304)")] = None,
    active: Annotated[str | None, typer.Option(help="active fractions of the top-k slots "
                                                   "(default 1)")] = None,
    routing: Annotated[str, typer.Option(help="uniform, zipf:<s> or trace:<file>; "
                                              "comma separated")] = "uniform",
    repeat: Annotated[int, typer.Option(help="measure each config this many times (median kept)")] = 1,
    seed: Annotated[int, typer.Option(help="seed of the inputs")] = 0,
    timeout: Annotated[float, typer.Option(help="seconds one measurement may take")] = 60.0,
    markdown: Annotated[Path | None, typer.Option(help="also write the table as Markdown here")] = None,
    csv: Annotated[Path | None, typer.Option(help="also write every column as CSV here")] = None,
    kernel_only: Annotated[bool, typer.Option(help="time each op's kernel alone: its route alignment and "
                                                    "activation split made beforehand, as a layer "
                                                    "shares or fuses them (per-kernel figures)")] = False,
    layer: Annotated[bool, typer.Option(help="fp8 decode: each GEMM alone and the whole layer with the "
                                             "picked tiles, by the peers' method (CUDA graph of --copies "
                                             "launches on their own weights, median of --replays)")] = False,
    copies: Annotated[int, typer.Option(help="--layer: launches per graph, each on its own weights")] = 16,
    replays: Annotated[int, typer.Option(help="--layer: graph replays timed (median kept)")] = 60,
    hint: Annotated[bool, typer.Option(help="--layer: tell the layer each point's active share "
                                            "(active_share), else tiles are picked for every route")] = True,
    override: Annotated[list[str] | None, typer.Option("--set", help="--layer: KEY=VALUE set in both GEMMs' "
                                                       "picked configs (repeat), e.g. PERSISTENT=4")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Time the shipped default, the heuristic and the table's pick at each point, each checked first."""
    if layer:
        from moetune.tuner.layer_bench import LayerBenchOptions

        with user_errors():
            opts = LayerBenchOptions(copies=copies, replays=replays, seed=seed, hint=hint,
                                     override=_overrides(override or []))
        _bench_layer(model, tp, tokens, active, opts, markdown, csv, quiet)
        return
    from moetune.tuner.backends.process import Runner
    from moetune.tuner.bench import KERNEL_ONLY_NOTE, _writable, bench_jobs, bench_problems, plan_bench

    kernels = kernel_list(kernel)
    with user_errors():  # every check before a worker starts
        plan, device = plan_bench(kernels, model=model, tp=tp, ep=ep, shape=shape,
                                  tokens=split_list(tokens, int), routes=split_list(routes, int),
                                  active=split_list(active, float), routing=split_list(routing),
                                  repeat=repeat)
        for path, option in ((markdown, "--markdown"), (csv, "--csv")):
            if path is not None:
                _writable(path, option)
        runner = Runner(timeout=timeout, jobs=bench_jobs(device), timing={"kernel_only": True} if kernel_only
                        else None)
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {note}")
    if kernel_only:
        console.print(f"[yellow]note:[/] {KERNEL_ONLY_NOTE}")
    if not device.is_gpu:
        console.print("[yellow]note:[/] no GPU: kernels run through the Triton interpreter on tiny problems; "
                      "accuracy checks are real, times are meaningless")
    try:
        with progress("bench", "starting the workers", quiet) as on_progress:
            try:
                result = bench_problems(plan.problems, runner, repeat=repeat, seed=seed,
                                        on_progress=on_progress)
            except RuntimeError as e:  # a worker that cannot start (broken install, no GPU memory)
                fail(str(e))
    finally:
        runner.close()
    for table in bench_tables(result):
        console.print(table)
    with user_errors():
        for path, write in ((markdown, result.write_markdown), (csv, result.write_csv)):
            if path is not None:
                console.print(f"wrote {write(path)}", highlight=False, soft_wrap=True)


def _overrides(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a config mapping (integer values as ints)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes KEY=VALUE, got {item!r}")
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _bench_layer(model: str | None, tp: int, tokens: str | None, active: str | None, opts: Any,
                 markdown: Path | None, csv: Path | None, quiet: bool) -> None:
    from moetune.models import get_model
    from moetune.tuner.bench import _writable, markdown_table
    from moetune.tuner.layer_bench import bench_layer

    with user_errors():
        if model is None:
            raise ValueError("--layer needs --model")
        preset = get_model(model)
        for path, option in ((markdown, "--markdown"), (csv, "--csv")):
            if path is not None:
                _writable(path, option)
        token_list = split_list(tokens, int) or [1, 2, 4, 8, 16, 32, 64, 128]
        shares = split_list(active, float) or [1.0]
        with progress("bench --layer", "making weight copies", quiet) as on_progress:
            result = bench_layer(preset, tp, token_list, shares, opts, on_progress=on_progress)
    t = Table(title=f"fp8 decode {preset.name} TP{tp} on {result.device}: us per launch, graph of "
                    f"{opts.copies}, median of {opts.replays}", title_justify="left")
    for col in ("tokens", "active", "gate/up us", "down us", "layer us", "layer error"):
        t.add_column(col, justify="right")
    for r in result.rows:
        t.add_row(str(r.tokens), f"{r.active_fraction:g}", f"{r.gate_up_us:.2f}", f"{r.down_us:.2f}",
                  f"{r.layer_us:.2f}", f"{r.error:.2e}")
    console.print(t)
    df = result.frame()
    with user_errors():
        if csv is not None:
            df.to_csv(csv, index=False)
            console.print(f"wrote {csv}", highlight=False, soft_wrap=True)
        if markdown is not None:
            markdown.write_text(f"Device: {result.device}\n\n{markdown_table(df)}\n")
            console.print(f"wrote {markdown}", highlight=False, soft_wrap=True)
