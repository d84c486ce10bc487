"""`evalkit probe`: the command line of the probe (registered in `evalkit.cli`)."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from evalkit.analysis.stats import DEFAULT_RESAMPLES
from evalkit.errors import EndpointError, UsageError
from evalkit.exits import exit_on_error
from evalkit.formats import write_json_atomic
from evalkit.probe.asking import Answer, AskSettings, Target
from evalkit.probe.figures import ProbeFigures
from evalkit.probe.render import render_terminal, write_pages
from evalkit.probe.run import OUTPUT_FILE, ProbeOptions, ProbeRun
from evalkit.progress import ProgressLines


def targets_from(
    specs: list[str] | None, base_urls: list[str] | None, models: list[str] | None
) -> tuple[Target, ...]:
    """The targets of `--target NAME=URL,MODEL` and of paired `--base-url`/`--model`.

    Raises:
        UsageError: on a malformed `--target`, or `--base-url`s and `--model`s that do not pair.
    """
    out = [Target.parse(s) for s in specs or []]
    urls, names = base_urls or [], models or []
    if len(urls) != len(names):
        raise UsageError(
            f"{len(urls)} --base-url and {len(names)} --model given: give one --model per "
            "--base-url, in the same order (or use --target NAME=URL,MODEL)"
        )
    out += [Target(m, u.rstrip("/"), m) for u, m in zip(urls, names, strict=True)]
    return tuple(out)


def preamble(run: ProbeRun) -> list[str]:
    """What was asked: contexts, how they were drawn, targets, sampling."""
    options, contexts = run.options, run.contexts
    drawn = (
        f"{options.contexts_per_file} drawn at random per file (seed {options.context_seed})"
        if options.contexts_per_file
        else "every assistant turn"
    )
    available = ", ".join(f"{Path(k).name}: {v}" for k, v in contexts.available.items())
    lines = [
        f"{len(contexts.contexts)} contexts from {len({c.trajectory for c in contexts.contexts})} "
        f"trajectories ({drawn}; available {available}); {options.samples} sample(s) each at "
        f"temperature {options.ask.temperature:g}, max_tokens {options.ask.max_tokens}.",
        "Targets: "
        + "; ".join(f"{t.name} = {t.model} at {t.base_url}" for t in options.targets)
        + (f"; through the proxy at {options.proxy_url}" if options.proxy_url else "")
        + ".",
    ]
    if contexts.undeclared:
        lines.append(
            f"{contexts.undeclared} recorded calls name tools the domain does not declare "
            "(their turns count as disagreeing on the name)."
        )
    if run.broken_lines:
        lines.append(f"{run.broken_lines} unreadable journal line(s) were asked again.")
    return lines


# The options of `evalkit probe` that take more than a line.
ResultsArgument = Annotated[
    list[Path] | None,
    typer.Argument(help="Recorded runs: τ²-bench results files, or evalkit's."),
]
TargetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        help="An endpoint to probe, NAME=URL,MODEL (repeatable; the first is the reference).",
    ),
]
ProbeBaseUrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--base-url", help="An endpoint's OpenAI base URL (repeatable; pairs with --model)."
    ),
]
ProbeModelsOption = Annotated[
    list[str] | None,
    typer.Option("--model", help="The model of the --base-url at the same position."),
]
ProbeDomainOption = Annotated[
    str | None,
    typer.Option(help="The domain the files must hold (retail, telecom); default: what they name."),
]
ProbeDataDirOption = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Domain directory for policy and tools; default: shipped."),
]
ContextsOption = Annotated[
    int | None,
    typer.Option(
        "--contexts", help="Contexts drawn at random from each file (default: every one)."
    ),
]
RetriesOption = Annotated[
    int, typer.Option(help="Retries of a connection error, timeout or HTTP 5xx.")
]
ViaProxyOption = Annotated[
    str | None,
    typer.Option(
        "--via-proxy",
        help="A toolsentry proxy's base URL that routes to the targets' models: every context "
        "is asked through it as well, for repair success per channel.",
    ),
]
ProxyFailingOnlyOption = Annotated[
    bool,
    typer.Option(
        "--proxy-failing-only",
        help="With --via-proxy: ask through the proxy only the contexts whose direct answer "
        "had a violation (repair success is measured on failures; at temperature 0 the "
        "proxy's first attempt is the same question). Saves most of the proxy's calls.",
    ),
]
ProbeOutOption = Annotated[
    Path | None, typer.Option(help="Output directory (default: runs/probe-DATE-TIME).")
]
ProbeResumeOption = Annotated[
    Path | None,
    typer.Option(help="Finish the probe in this directory (its options are reused)."),
]
ProbeResamplesOption = Annotated[
    int, typer.Option("--resamples", min=100, help="Bootstrap resamples of the intervals.")
]


def probe_command(
    results: ResultsArgument = None,
    target: TargetOption = None,
    base_url: ProbeBaseUrlsOption = None,
    model: ProbeModelsOption = None,
    domain: ProbeDomainOption = None,
    data_dir: ProbeDataDirOption = None,
    contexts: ContextsOption = None,
    context_seed: Annotated[int, typer.Option(help="Seed of the context draw.")] = 0,
    samples: Annotated[int, typer.Option(help="Answers asked per context and target.")] = 1,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens per answer.")] = 256,
    seed: Annotated[int, typer.Option(help="Request seed of sample 0 (sample i: seed + i).")] = 0,
    concurrency: Annotated[int, typer.Option(help="Questions in flight at once.")] = 4,
    retries: RetriesOption = 3,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for one answer.")] = 600.0,
    via_proxy: ViaProxyOption = None,
    proxy_failing_only: ProxyFailingOnlyOption = False,
    out: ProbeOutOption = None,
    resume: ProbeResumeOption = None,
    resamples: ProbeResamplesOption = DEFAULT_RESAMPLES,
    quiet: Annotated[bool, typer.Option(help="No progress bar and no tables.")] = False,
) -> None:
    """Ask live models the recorded turns of agent trajectories, and measure their tool calling.

    Every assistant turn of the given results files becomes a context — the domain's policy as
    system prompt, the conversation up to that turn, the domain's tools — asked of every target.
    Each answer is classified by the proxy's validator (proxy.guard): per-channel violation
    rates with 95% intervals clustered by trajectory, agreement with the recorded turn (trigger,
    tool name, canonical arguments), and, against the first target, rate ratios, the rank
    correlation of failure signatures and the share of novel failures. With --via-proxy, also
    how often the proxy repairs each channel. One call per context: the cheap way to measure a
    real model's damage.

    Writes DIR/probe.json (every answer and figure), probe.md, probe.html and a plot. Answers are
    journaled as they land: Ctrl-C or a dead endpoint keeps them, --resume DIR asks the rest.

    One question per task of the files goes first: an endpoint that does not know a task (evalkit
    sim serve started on other data than the files were run on) stops the probe in seconds with
    exit status 6 and the fix (--data-dir). Other exit statuses: 2 bad options, 3 domain data
    that cannot be loaded, 4 a file that is not a results file, 5 an endpoint that fails for
    good, 130 interrupted.
    """

    console = Console(quiet=quiet)
    with exit_on_error():
        if resume is not None:
            run = ProbeRun.resume(resume)
        else:
            options = ProbeOptions(
                results=tuple(str(p) for p in results or []),
                targets=targets_from(target, base_url, model),
                domain=domain,
                data_dir=None if data_dir is None else str(data_dir),
                contexts_per_file=contexts,
                context_seed=context_seed,
                samples=samples,
                proxy_url=via_proxy,
                proxy_failing_only=proxy_failing_only,
                ask=AskSettings(
                    temperature=temperature,
                    max_tokens=max_tokens,
                    seed=seed,
                    retries=retries,
                    timeout=timeout,
                    concurrency=concurrency,
                ),
            )
            options.check()
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            run = ProbeRun.start(options, out or Path("runs") / f"probe-{stamp}")
        figures, path, pages = _run_to_end(run, console, resamples=resamples, quiet=quiet)
    _print_probe(run, figures, path, pages, console)


def _run_to_end(
    run: ProbeRun, console: Console, *, resamples: int, quiet: bool
) -> tuple[ProbeFigures, Path, list[Path]]:
    """`finish_probe(run)`. Ctrl-C keeps the answers and says how to finish (exit 130)."""
    try:
        return finish_probe(run, console, resamples=resamples, quiet=quiet)
    except KeyboardInterrupt:
        Console(stderr=True).print(
            f"interrupted: {len(run.answers)} of {run.total()} answers kept in {run.out}; "
            f"finish with: evalkit probe --resume {run.out}",
            highlight=False,
            soft_wrap=True,  # one line: the command is copied as it stands
        )
        raise typer.Exit(130) from None


def _print_probe(
    run: ProbeRun, figures: ProbeFigures, path: Path, pages: list[Path], console: Console
) -> None:
    """Print a finished probe's tables and where its output files are."""
    for renderable in render_terminal(figures):
        console.print(renderable)
    console.print(
        f"{len(run.answers)} answers; {path}, "
        + ", ".join(p.name for p in pages[:2])
        + " and the plot",
        highlight=False,
    )


def finish_probe(
    run: ProbeRun,
    console: Console,
    *,
    resamples: int,
    quiet: bool = False,
    title: str = "evalkit probe",
) -> tuple[ProbeFigures, Path, list[Path]]:
    """Ask what `run` still lacks (with a progress bar), then write its output file and pages.

    Returns the figures, the output file and the pages written. KeyboardInterrupt passes
    through (the journal keeps every finished answer).

    Raises:
        EndpointError: when an endpoint fails for good; the message says how to resume.
    """
    for line in preamble(run):
        console.print(line, highlight=False)
    try:
        ask_pending(run, console, quiet=quiet)
    except EndpointError as exc:
        raise EndpointError(
            f"{exc.message}; {len(run.answers)} of {run.total()} answers kept in {run.out}, "
            f"finish with: evalkit probe --resume {run.out}"
        ) from exc
    figures = run.figures(resamples=resamples)
    path = write_json_atomic(run.out / OUTPUT_FILE, run.document(figures))
    pages = write_pages(run.out, title, preamble(run), figures)
    return figures, path, pages


def ask_pending(
    run: ProbeRun, console: Console, *, quiet: bool = False, only: str | None = None
) -> None:
    """Ask what `run` lacks (of target `only`, when given) under a progress bar."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    )
    per_route = len(run.contexts.contexts) * run.options.samples
    routes = ["direct", "proxy"] if run.options.proxy_url else ["direct"]
    bars = {}
    totals: dict[tuple[str, str], int | None] = {}
    tallies: dict[tuple[str, str], list[int]] = {}
    width = max(len(t.name) for t in run.options.targets) + 7
    for t in run.options.targets:
        if only is not None and t.name != only:
            continue
        for route in routes:
            done = [
                a for a in run.answers.values() if a.key.target == t.name and a.key.route == route
            ]
            tallies[(t.name, route)] = [len(done), sum(1 for a in done if a.violations)]
            # Through the proxy with --proxy-failing-only, the count grows as direct answers fail.
            known = route == "direct" or not run.options.proxy_failing_only
            totals[(t.name, route)] = per_route if known else None
            bars[(t.name, route)] = progress.add_task(
                f"{t.name} {route}".ljust(width),
                total=totals[(t.name, route)],
                completed=len(done),
                stats="",
            )

    lines = ProgressLines(console, "answers")

    def on_answer(answer: Answer) -> None:
        where = (answer.key.target, answer.key.route)
        tally = tallies[where]
        tally[0] += 1
        tally[1] += bool(answer.violations)
        stats = f"violations {100 * tally[1] / tally[0]:5.1f}%"
        progress.update(bars[where], completed=tally[0], stats=stats)
        lines.update(" ".join(where), tally[0], totals[where], stats)

    with progress:
        asyncio.run(run.execute(on_answer, only=only))
