"""``moetune sweep``: tune kernel tiles at every density, live progress, summary at the end."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from moetune.cli import app
from moetune.cli._common import DEFAULT_DB, console, err_console, fail, kernel_list, split_list, user_errors
from moetune.cli.display import Display, summary_table


def _diagnostics(sw: Any, startup: dict[str, float], interpreter: bool) -> None:
    """Where a sweep's time went, per candidate and per worker (``--verbose``)."""
    if sw.overhead_ms:
        console.print(f"tuner overhead per candidate {statistics.median(sw.overhead_ms):.1f} ms (median)")
    if sw.phases_ms:
        import pandas as pd

        phases = pd.DataFrame(sw.phases_ms).median()
        console.print("per candidate, median ms: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    busy = sw.measuring_busy
    if busy is not None and not interpreter:
        console.print(f"measuring workers busy {busy:.0%} of the time between their first task and the last "
                      "result" + (" (the rest waiting for compiles: compile-bound)" if busy < 0.85 else ""))
    comp = sw.compiling()
    if comp is not None and not interpreter:
        busy = f"busy {comp['busy']:.0%} of the time, " if comp["busy"] is not None else ""
        console.print(f"compile workers: {comp['tasks']} tasks, {busy}median task {comp['wall_s']:.2f} s, "
                      f"CPU {comp['cpu_share']:.0%} of their wall time")
    steps = ", ".join(f"{k} {v:.1f}" for k, v in startup.items())
    console.print(f"start-up, s after planning began: {steps}")


def grid_line(sw: Any, points: list[Any]) -> str:
    """What a grid budget gave: its total, and the second pass's points and why they got more."""
    from moetune.tuner.grid_budget import BOUNDARY, DESIGN, NEIGHBOURS, PRIOR

    more = [pt for pt in points if pt.extra]
    why = {NEIGHBOURS: "neighbours disagree", BOUNDARY: "the design changes across it",
           PRIOR: "best outside the prior's picks", DESIGN: "another design close"}
    counts = ", ".join(f"{text} {sum(k in pt.why for pt in more)}" for k, text in why.items()
                       if any(k in pt.why for pt in more))
    second = (f"{sum(pt.extra for pt in more)} more at {len(more)} of {len(points)} point(s) ({counts})"
              if more else "no point needed more")
    return f"grid budget {sw.grid_total} ({sw.grid_budget.describe()}): first pass at every point, {second}"


@app.command()
def sweep(
    kernel: Annotated[list[str] | None, typer.Option("--kernel", "-k", help="ops or families, repeated or "
                      "comma separated (e.g. fp8_decode or fp4_prefill.gate_up); default: the model's weight "
                      "format")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="model preset, e.g. deepseek-v3")] = None,
    tp: Annotated[int, typer.Option(help="tensor-parallel degree (divides the intermediate size)")] = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel degree (divides the experts)")] = 1,
    shape: Annotated[str | None, typer.Option(help="per-rank shape, e.g. E=8,N=256,K=512,top_k=2")] = None,
    tokens: Annotated[str | None, typer.Option(help="token counts (decode default 1..256)")] = None,
    routes: Annotated[str | None, typer.Option(help="route counts, e.g. 768,6144 (prefill default)")] = None,
    active: Annotated[str | None, typer.Option(help="active fractions of the top-k slots "
                                                    "(decode default 1,0.5,0.25)")] = None,
    routing: Annotated[str, typer.Option(help="uniform, zipf:<s> or trace:<file.npy|.pt>; comma separated "
                                              "for several")] = "uniform",
    strategy: Annotated[str | None, typer.Option(help="search strategy: prior, model, coordinate, random "
                                                     "or exhaustive \\[default: prior]")] = None,
    budget: Annotated[int | None, typer.Option(help="most measurements at each point, instead of "
                                                   "--grid-budget \\[default: random and exhaustive "
                                                   "every candidate]")] = None,
    grid_budget: Annotated[str | None, typer.Option(help="measurements for the whole sweep, N or P% of all "
                                                         "its points' candidates: a first pass gives each "
                                                         "point 2%, the rest goes to the points whose "
                                                         "neighbouring densities disagree \\[default: prior "
                                                         "1.2%; for model and coordinate: what their "
                                                         "per-point defaults add up to (10% of each "
                                                         "point's candidates, at least 30)]")] = None,
    seed: Annotated[int, typer.Option(help="seed of the search and of the inputs")] = 0,
    db: Annotated[Path, typer.Option(help="results database")] = Path(DEFAULT_DB),
    timeout: Annotated[float, typer.Option(help="seconds one candidate may take")] = 60.0,
    jobs: Annotated[int | None, typer.Option(help="compile processes (default: every core on a GPU, none on "
                                                  "the interpreter); with --ray, per actor")] = None,
    time_limit: Annotated[float | None, typer.Option(help="stop after this many seconds, keeping all "
                                                          "results (rerun to continue)")] = None,
    prefetch: Annotated[bool, typer.Option(help="on a GPU: idle compile workers compile the candidates "
                                               "the search will likely try next (slower on the H200 "
                                               "host measured)")] = False,
    gpus: Annotated[str | None, typer.Option(help="GPUs of this host to measure on at once: all, or indices "
                                                  "such as 0,1 (one worker each)")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="measure on Ray actors across a Ray cluster "
                                                    "(pip install 'moetune\\[ray]')")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster to join (default: start a local "
                                                         "one)")] = None,
    ray_actors: Annotated[int | None, typer.Option(help="Ray actors (default: the cluster's GPUs / "
                                                        "--ray-gpus-per-actor)")] = None,
    ray_gpus_per_actor: Annotated[float, typer.Option(help="GPU share per Ray actor (0.5: two actors per "
                                                           "GPU)")] = 1.0,
    retry: Annotated[str | None, typer.Option(help="measure again the candidates stored only as crash, "
                                                   "timeout or compile_error (comma separated), once "
                                                   "the cause is fixed; their old rows stay")] = None,
    full_timing: Annotated[bool, typer.Option(help="time every accurate candidate in full (by default one "
                                                   "that reads over 1.5x the point's best so far keeps "
                                                   "that first, shorter reading)")] = False,
    start: Annotated[Path | None, typer.Option(help="JSON file of configs (an object or a list) measured "
                                                     "first at every point whose space holds them, e.g. "
                                                     "a benchmark's find; an adaptive strategy searches "
                                                     "from them first")] = None,
    full_space: Annotated[bool, typer.Option(help="also search the designs a kernel marks dominated on this "
                                                  "device (measured never to win there; see its spec)")
                          ] = False,
    cross: Annotated[bool, typer.Option(help="afterwards, measure each point's best at every other point of "
                                             "the same op and shape that lacks it (beyond --budget), so no "
                                             "table entry is slower at its density than another's pick")
                     ] = False,
    quiet: Annotated[bool, typer.Option(help="no live display, only the summary")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="after the summary, the per-candidate "
                                                                  "diagnostics: tuner overhead, time per "
                                                                  "phase, worker busy shares, start-up "
                                                                  "steps")] = False,
) -> None:
    """Measure candidate tile configs (default first) at every density; every result goes to --db."""
    from moetune.tuner.api import prepare
    from moetune.tuner.store import StoreWriteError

    with user_errors():  # every check before the store is opened, so bad input leaves it untouched
        tuning = prepare(model=model, kernels=kernel_list(kernel), shape=shape,
                         tokens=split_list(tokens, int), routes=split_list(routes, int),
                         active=split_list(active, float), routing=split_list(routing), tp=tp, ep=ep,
                         db=db, budget=budget, grid_budget=grid_budget, strategy=strategy,
                         seed=seed, timeout=timeout, jobs=jobs, time_limit=time_limit, prefetch=prefetch,
                         gpus=gpus, ray=ray, ray_address=ray_address, ray_actors=ray_actors,
                         ray_gpus_per_actor=ray_gpus_per_actor, retry=split_list(retry),
                         full_timing=full_timing, starts=start, full_space=full_space, cross=cross)
    sw, points, starts = tuning.sweep, tuning.points, tuning.starts
    interpreter = not tuning.device.is_gpu
    for note in tuning.plan.notes:
        console.print(f"[yellow]note:[/] {note}")
    for i in sw.unused_starts():
        console.print(f"[yellow]note:[/] --start config {i + 1} ({json.dumps(starts[i])}) is in no point's "
                      "space (a value the space lacks, pruned by a constraint, or a dominated design: "
                      "--full-space searches those): not measured")
    if interpreter:
        console.print("[yellow]note:[/] no GPU: kernels run through the Triton interpreter; accuracy checks "
                      "are real, times are meaningless")
    pruned = sum(pt.pruned for pt in points)
    skipped = "" if full_space else " and dominated designs"
    console.print(f"{len(points)} point(s), {sum(len(pt.candidates) for pt in points)} candidates after "
                  f"constraints{skipped} ({pruned} pruned), strategy {tuning.strategy}, store {db}")
    display = None if quiet else Display(interpreter, tuning.runner)
    tuning.on_event = display.on_event if display else None
    interrupted = False
    store_error = None
    try:
        if display:
            display.__enter__()
        try:
            tuning.run()
        except KeyboardInterrupt:
            interrupted = True
        except StoreWriteError as e:  # a full disk: what was committed before it is kept
            store_error = str(e)
        except RuntimeError as e:  # a worker that cannot start at all (broken install, no GPU memory)
            fail(str(e))
        finally:
            if display:
                display.__exit__(None, None, None)
                console.print()
    finally:
        tuning.close()
    console.print(summary_table(points, interpreter))
    if sw.grid_total is not None:
        console.print(grid_line(sw, points), soft_wrap=True)
    written = sum(sum(pt.counts.values()) for pt in points)
    console.print(f"{written} measurement(s) written to {db} (sweep {sw.sweep_id})")
    if verbose:
        _diagnostics(sw, tuning.startup, interpreter)
    if sw.timed_out:
        console.print(f"[yellow]time limit:[/] stopped after {time_limit:g} s; rerun to continue")
    if interrupted:
        console.print("[yellow]interrupted:[/] everything measured so far is kept; rerun to resume")
        raise typer.Exit(130)
    failed = [pt.failure for pt in points if pt.failure]
    for failure in failed:
        err_console.print(f"[bold red]point stopped:[/] {escape(failure)}; nothing stored against its "
                          "configs, rerun once the spec is fixed", highlight=False, soft_wrap=True)
    if store_error:
        fail(f"{store_error}; the measurements written before it are kept", 1)
    if failed:
        raise typer.Exit(1)
