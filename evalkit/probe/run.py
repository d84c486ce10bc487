"""One probe run on disk: its options, its journal of answers, and the output document.

A run directory holds `probe-options.json` (what `--resume` reuses), `answers.jsonl` (the
journal, see `asking.Journal`) and, once finished, `probe.json` (every answer and every figure),
`probe.md`, `probe.html` and `probe_figures/`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from evalkit.errors import UsageError
from evalkit.formats import write_json_atomic
from evalkit.messages import now_iso
from evalkit.probe.asking import (
    Answer,
    AskSettings,
    Journal,
    Question,
    Target,
    ask_all,
    model_windows,
    plan,
)
from evalkit.probe.contexts import ContextSet, load_contexts
from evalkit.probe.figures import ProbeFigures, probe_figures

OPTIONS_FILE: Final = "probe-options.json"
JOURNAL_FILE: Final = "answers.jsonl"
OUTPUT_FILE: Final = "probe.json"
FORMAT: Final = "evalkit-probe/1"


@dataclass(frozen=True)
class ProbeOptions:
    """Everything a probe was asked to do (saved, so that `--resume` asks the same)."""

    results: tuple[str, ...]
    targets: tuple[Target, ...]
    domain: str | None = None
    data_dir: str | None = None
    contexts_per_file: int | None = None
    context_seed: int = 0
    samples: int = 1
    proxy_url: str | None = None
    proxy_failing_only: bool = False
    ask: AskSettings = field(default_factory=AskSettings)

    def check(self) -> None:
        """Raises UsageError on options that cannot run."""
        if not self.results:
            raise UsageError("no results file given: pass one or more recorded runs")
        if not self.targets:
            raise UsageError(
                "no endpoint given: pass --target NAME=URL,MODEL, or --base-url URL --model MODEL"
            )
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise UsageError(f"target names must differ, got {', '.join(names)}")
        if self.proxy_failing_only and self.proxy_url is None:
            raise UsageError("--proxy-failing-only needs --via-proxy URL")
        if self.samples < 1:
            raise UsageError(f"--samples must be at least 1, got {self.samples}")
        if self.contexts_per_file is not None and self.contexts_per_file < 1:
            raise UsageError(f"--contexts must be at least 1, got {self.contexts_per_file}")
        if self.ask.concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {self.ask.concurrency}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["results"] = list(self.results)
        out["targets"] = [t.to_dict() for t in self.targets]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeOptions:
        return cls(
            results=tuple(data["results"]),
            targets=tuple(Target(**t) for t in data["targets"]),
            domain=data.get("domain"),
            data_dir=data.get("data_dir"),
            contexts_per_file=data.get("contexts_per_file"),
            context_seed=int(data.get("context_seed", 0)),
            samples=int(data.get("samples", 1)),
            proxy_url=data.get("proxy_url"),
            proxy_failing_only=bool(data.get("proxy_failing_only", False)),
            ask=AskSettings(**data.get("ask", {})),
        )


class ProbeRun:
    """A probe's contexts, its answers so far, and its directory."""

    def __init__(self, options: ProbeOptions, out: Path) -> None:
        options.check()
        self.options = options
        self.out = out
        self.journal = Journal(out / JOURNAL_FILE)
        self.contexts: ContextSet = load_contexts(
            [Path(p) for p in options.results],
            domain=options.domain,
            data_dir=None if options.data_dir is None else Path(options.data_dir),
            per_file=options.contexts_per_file,
            seed=options.context_seed,
        )
        self.answers, self.broken_lines = self.journal.read()
        known = {c.id for c in self.contexts.contexts}
        targets = {t.name for t in options.targets}
        # A journal line of another run's context or target is kept on disk but not counted.
        self.answers = {
            k: a for k, a in self.answers.items() if k.context in known and k.target in targets
        }
        self.windows: dict[str, int | None] = {}
        self.started = now_iso()

    @classmethod
    def start(cls, options: ProbeOptions, out: Path) -> ProbeRun:
        """A new run in `out` (which must not hold another run)."""
        if (out / OPTIONS_FILE).exists():
            raise UsageError(
                f"{out} already holds a probe; finish it with --resume {out}, or pick another --out"
            )
        run = cls(options, out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / OPTIONS_FILE, options.to_dict())
        return run

    @classmethod
    def resume(cls, out: Path) -> ProbeRun:
        """The run in `out`, with its saved options."""
        path = out / OPTIONS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"{out}: no probe to resume ({path} is missing)") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path}: cannot read the saved options: {exc}") from exc
        return cls(ProbeOptions.from_dict(data), out)

    def retarget(self, targets: tuple[Target, ...], proxy_url: str | None) -> None:
        """Serve the same targets, or a changed list, at new URLs (servers restarted on other
        ports): the options are saved again and the journal read again for these targets.

        Raises:
            UsageError: on targets that cannot run (see `ProbeOptions.check`).
        """
        self.options = replace(self.options, targets=targets, proxy_url=proxy_url)
        self.options.check()
        write_json_atomic(self.out / OPTIONS_FILE, self.options.to_dict())
        answers, self.broken_lines = self.journal.read()
        names = {t.name for t in targets}
        known = {c.id for c in self.contexts.contexts}
        self.answers = {
            k: a for k, a in answers.items() if k.context in known and k.target in names
        }

    def pending(self) -> list[Question]:
        """The questions still to ask (with `proxy_failing_only`, as far as known so far)."""
        return plan(
            self.contexts.contexts,
            self.options.targets,
            self.options.samples,
            self.options.proxy_url,
            done=self.answers,
            proxy_failing_only=self.options.proxy_failing_only,
        )

    def total(self) -> int:
        """How many answers the run will have (as far as known so far)."""
        return len(self.answers) + len(self.pending())

    def record(self, answer: Answer) -> None:
        """Keep one answer: in memory and in the journal."""
        self.journal.append(answer)
        self.answers[answer.key] = answer

    async def execute(
        self, on_answer: Callable[[Answer], None] | None = None, *, only: str | None = None
    ) -> None:
        """Ask every pending question (see `asking.ask_all`); with `only`, those of that target
        alone (the others' servers need not be up: the ladder serves one rung at a time).

        Raises:
            EndpointError: when a target (or the proxy) is not reachable, or fails for good.
            WrongDataError: when a target does not know a task of the file (asked first, one
                question per task, so that it fails in seconds).
        """

        def mine() -> list[Question]:
            return [q for q in self.pending() if only is None or q.key.target == only]

        if not mine():
            return
        targets = [t for t in self.options.targets if only is None or t.name == only]
        self.windows.update(await model_windows(targets))
        if self.options.proxy_url is not None:
            proxy = Target("proxy", self.options.proxy_url.rstrip("/"), "")
            await model_windows([proxy])

        def land(answer: Answer) -> None:
            self.record(answer)
            if on_answer is not None:
                on_answer(answer)

        # One question per task and target first: an endpoint that cannot answer the file's
        # tasks (a simulator on other data) fails in seconds, not after hundreds of answers.
        first: dict[tuple[str, str, str], Question] = {}
        for question in mine():
            first.setdefault(
                (question.key.target, question.key.route, question.context.task_id), question
            )
        await ask_all(list(first.values()), self.options.ask, land)
        # With proxy_failing_only, the proxy's questions appear as direct answers fail.
        while questions := mine():
            await ask_all(questions, self.options.ask, land)

    def ordered_answers(self) -> list[Answer]:
        """The answers in question order."""
        everything = plan(
            self.contexts.contexts,
            self.options.targets,
            self.options.samples,
            self.options.proxy_url,
        )
        order = {q.key: i for i, q in enumerate(everything)}
        return sorted(self.answers.values(), key=lambda a: order.get(a.key, len(order)))

    def figures(self, *, resamples: int, seed: int = 0) -> ProbeFigures:
        return probe_figures(
            self.options.targets,
            self.contexts.contexts,
            self.ordered_answers(),
            self.windows,
            resamples=resamples,
            seed=seed,
        )

    def document(self, figures: ProbeFigures) -> dict[str, Any]:
        """The output file's content: options, contexts, every answer, every figure."""
        return {
            "format": FORMAT,
            "created": now_iso(),
            "started": self.started,
            "options": self.options.to_dict(),
            "contexts": {
                **self.contexts.to_dict(),
                "items": [c.reference() for c in self.contexts.contexts],
            },
            "complete": not self.pending(),
            "answers": [a.to_dict() for a in self.ordered_answers()],
            "figures": figures.to_dict(),
        }
