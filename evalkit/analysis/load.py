"""Runs from results files: read them, find the agent's tool schemas, classify every episode, and
group the episodes into runs by domain and agent model. This is the analysis's I/O edge.

Tool schemas are optional and come from a `ToolSource`. The default one takes the schemas a
results file records (`info.environment_info.tool_defs`), else the registered domain's toolkit
(`get_domain`); a domain that is not registered (or a file that names none) has no schemas, and
its failures are classified from the recorded texts alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from evalkit.analysis.channels import DeclaredTools, EpisodeFailures, classify_simulation
from evalkit.analysis.run import DEFAULT_MAX_ERRORS, RunAnalysis, analyze_episodes
from evalkit.analysis.stats import DEFAULT_RESAMPLES
from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from evalkit.errors import ResultsFileError, UnknownDomainError, UsageError
from evalkit.formats import Results, read_results, solo_mode
from evalkit.records import RecordIssue, check_records, summary_lines
from evalkit.tasks import Task
from proxy.errors import ToolsentryError
from proxy.guard.toolcheck import compile_tools

ToolSource = Callable[[str, Results], DeclaredTools | None]
"""Given a domain name and a results file, the agent's declared tools, or None if unknown."""


def recorded_tools(domain: str, results: Results) -> DeclaredTools | None:
    """The tool schemas a results file records in `info.environment_info.tool_defs` (a list of
    OpenAI tools, or a mapping of name to tool); None when absent or not valid tools."""
    environment = results.info.get("environment_info")
    defs = environment.get("tool_defs") if isinstance(environment, dict) else None
    tools = list(defs.values()) if isinstance(defs, dict) else defs
    if not isinstance(tools, list) or not tools:
        return None
    try:
        index = compile_tools(tools)
    except ToolsentryError:
        return None
    return DeclaredTools(index, "tool_defs recorded in the results file")


class DomainData:
    """Registered domains, loaded from `data_dir` when given, each once: the agent's tools (a
    `ToolSource`) and the tasks the records are checked against.

    `data_dir` holds domain directories (`DIR/domains/<name>` or `DIR/<name>`, as τ²-bench's data
    directory does) or is one (`DIR` named after the domain); other domains load the data
    shipped with evalkit; `loaded` are domains already loaded (a replay's). Unregistered
    domains have no tools and no tasks.
    """

    def __init__(self, data_dir: Path | None = None, loaded: Sequence[Domain] = ()) -> None:
        self.data_dir = data_dir
        self._loaded: dict[str, Domain | None] = {d.name: d for d in loaded}

    def domain(self, name: str) -> Domain | None:
        """The domain `name`, or None when it is not registered.

        Raises:
            DataError: when its directory cannot be loaded.
        """
        if name not in self._loaded:
            try:
                self._loaded[name] = get_domain(name, _domain_dir(name, self.data_dir))
            except UnknownDomainError:
                self._loaded[name] = None
        return self._loaded[name]

    def tools(self, domain: str, results: Results) -> DeclaredTools | None:
        """The domain's agent tools (a `ToolSource`); in solo mode the user's tools too."""
        loaded = self.domain(domain)
        if loaded is None:
            return None
        agent_toolkit, user_toolkit = loaded.toolkit_classes()
        directory = _domain_dir(domain, self.data_dir)
        where = "shipped" if directory is None else str(directory)
        tools = agent_toolkit.openai_tools()
        if solo_mode(results) and user_toolkit is not None:  # τ²-bench gives it the user's too
            tools += user_toolkit.openai_tools()
        return DeclaredTools(compile_tools(tools), f"{domain} tools ({where})")

    def tasks(self, domain: str) -> Sequence[Task]:
        """The domain's tasks (none for an unregistered domain)."""
        loaded = self.domain(domain)
        return loaded.tasks if loaded is not None else ()


def _domain_dir(domain: str, data_dir: Path | None) -> Path | None:
    if data_dir is None:
        return None
    for candidate in (data_dir / "domains" / domain, data_dir / domain):
        if candidate.is_dir():
            return candidate
    return data_dir if data_dir.name == domain else None


def default_tool_source(data_dir: Path | None = None) -> ToolSource:
    """Recorded schemas first, then the domain registry's (see the module docstring)."""
    return recorded_first(DomainData(data_dir))


def recorded_first(data: DomainData) -> ToolSource:
    """The schemas a file records, else those of `data`'s domain."""

    def source(domain: str, results: Results) -> DeclaredTools | None:
        return recorded_tools(domain, results) or data.tools(domain, results)

    return source


@dataclass
class _Group:
    domain: str
    model: str
    max_errors: int
    episodes: list[EpisodeFailures]
    labels: list[str]
    sources: list[str]
    schema_source: str | None
    issues: list[RecordIssue] = field(default_factory=list)
    simulations: int = 0
    notes: list[str] = field(default_factory=list)


def load_runs(
    paths: Sequence[Path],
    *,
    tools: ToolSource | None = None,
    data: DomainData | None = None,
    label: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[RunAnalysis]:
    """Read results files and analyse them as runs (see `analyze_results`).

    Raises:
        ResultsFileError: when a file cannot be read.
        DataError: when a domain directory cannot be loaded.
    """
    loaded = [(Path(path), read_results(path)) for path in paths]
    return analyze_results(
        loaded, tools=tools, data=data, label=label, resamples=resamples, seed=seed
    )


def analyze_results(
    files: Sequence[tuple[Path | None, Results]],
    *,
    tools: ToolSource | None = None,
    data: DomainData | None = None,
    label: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[RunAnalysis]:
    """Analyse results (each with the path it was read from, or None) as runs: one per
    (domain, agent model), in order of first appearance; the files of one run (trials, shards)
    are pooled. Files of one domain and model that differ in configuration (`CONFIGURATION`:
    a replay's arm, profile, repair, API) are refused, never pooled.

    `tools` finds the agent's schemas (default: recorded ones, else `data`'s); `data` (default:
    the shipped domains) gives the tasks each file's records are checked against
    (`evalkit.records`), whose findings become the run's `warnings`. A run's budget is the
    smallest `max_errors` among its files (τ²-bench's default, 10, when a file records none).
    Its label is `label`, else `run_label` of its first file.

    Raises:
        UsageError: when files of one domain and model ran under different configurations.
        DataError: when a domain directory cannot be loaded.
    """
    data = data or DomainData()
    source = tools or recorded_first(data)
    groups: dict[tuple[str, str], _Group] = {}
    firsts: dict[tuple[str, str], tuple[Path | None, Results]] = {}
    for path, results in files:
        domain, model = run_key(results)
        check_one_configuration(
            firsts.setdefault((domain, model), (path, results)), (path, results)
        )
        declared = source(domain, results)
        group = groups.get((domain, model))
        if group is None:
            group = groups[(domain, model)] = _Group(
                domain, model, _max_errors(results), [], [], [], None
            )
        group.max_errors = min(group.max_errors, _max_errors(results))
        group.labels.append(run_label(results, path))
        if path is not None:
            group.sources.append(str(path))
        if declared is not None and group.schema_source is None:
            group.schema_source = declared.source
        group.episodes.extend(classify_simulation(s, declared) for s in results.simulations)
        group.issues += check_records(results, data.tasks(domain))
        group.simulations += len(results.simulations)
        note = results.missing_note()
        if note is not None:
            group.notes.append(f"{path}: {note}" if path is not None else note)
    return [
        analyze_episodes(
            g.episodes,
            max_errors=g.max_errors,
            label=label or _pooled_label(g.labels),
            domain=g.domain,
            model=g.model,
            schema_source=g.schema_source,
            sources=g.sources,
            warnings=[*g.notes, *summary_lines(g.issues, g.simulations)],
            resamples=resamples,
            seed=seed,
        )
        for g in groups.values()
    ]


GENERIC_STEMS: Final = frozenset({"results", "result", "run", "simulations"})


def run_label(results: Results, path: Path | None = None) -> str:
    """What a run is called in tables and legends: its replay arm (`info.toolsentry.arm`), else
    its file's name — the directory's when the file has a generic name such as
    `results.json` — else its agent model."""
    block = results.info.get("toolsentry")
    arm = block.get("arm") if isinstance(block, dict) else None
    if isinstance(arm, str) and arm:
        return arm
    if path is not None:
        stem = path.stem
        if stem.lower() not in GENERIC_STEMS:
            return stem
        if path.resolve().parent.name:
            return path.resolve().parent.name
    return run_key(results)[1]


def _pooled_label(labels: Sequence[str]) -> str:
    first = labels[0]
    others = len(labels) - 1
    return first if others == 0 or set(labels) == {first} else f"{first} (+{others} more)"


def run_key(results: Results) -> tuple[str, str]:
    """(domain, agent model) as the file's `info` names them; `unknown` where it does not."""
    environment = results.info.get("environment_info")
    agent = results.info.get("agent_info")
    domain = environment.get("domain_name") if isinstance(environment, dict) else None
    model = agent.get("llm") if isinstance(agent, dict) else None
    return (
        domain if isinstance(domain, str) and domain else "unknown",
        model if isinstance(model, str) and model else "unknown",
    )


def _max_errors(results: Results) -> int:
    value: Any = results.info.get("max_errors")
    return value if isinstance(value, int) and value >= 0 else DEFAULT_MAX_ERRORS


def pair_cells(
    a_runs: Sequence[RunAnalysis], b_runs: Sequence[RunAnalysis]
) -> list[tuple[RunAnalysis, RunAnalysis]]:
    """Pair A's runs with B's into cells: by domain, and within a domain in the order given
    (the first A model of a domain with the first B model of that domain, and so on).

    Raises:
        UsageError: when a domain has a different number of runs on the two sides.
    """
    cells: list[tuple[RunAnalysis, RunAnalysis]] = []
    domains = list(dict.fromkeys(r.domain for r in [*a_runs, *b_runs]))
    for domain in domains:
        a_side = [r for r in a_runs if r.domain == domain]
        b_side = [r for r in b_runs if r.domain == domain]
        if len(a_side) != len(b_side):
            raise UsageError(
                f"domain {domain!r}: A has {_describe(a_side)} but B has {_describe(b_side)}; "
                "give each side the same domains and models"
            )
        cells.extend(zip(a_side, b_side, strict=True))
    return cells


def _describe(runs: Sequence[RunAnalysis]) -> str:
    if not runs:
        return "no run"
    models = ", ".join(r.model for r in runs)
    return f"{len(runs)} run(s) ({models})"


# -- run directories: what `evalkit replay` (and `make demo`) writes ------------------------------

REPLAY_FILE: Final = "replay.json"
"""The index a replay directory keeps: its options, its arms and each arm's results file."""

REPAIRED: Final = "reask"


@dataclass(frozen=True)
class Arm:
    """One arm of a run directory: its name, its configuration and its analysis."""

    name: str
    model: str
    profile: str | None
    repair: str
    path: Path
    run: RunAnalysis

    @property
    def repaired(self) -> bool:
        return self.repair == REPAIRED

    @property
    def subject(self) -> str:
        """What the arm runs: its damage profile, else its model."""
        return self.profile or self.model


def arm_files(directory: Path) -> list[Path]:
    """The results files of a run directory, in its arms' order: those `replay.json` names,
    else every `*/results.json` below it, else its `*.json` files.

    Raises:
        ResultsFileError: when the directory holds no results file or its index is unreadable.
    """
    index = directory / REPLAY_FILE
    if index.is_file():
        try:
            named = json.loads(index.read_text(encoding="utf-8")).get("results")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            raise ResultsFileError(f"{index}: cannot read the replay's index: {exc}") from exc
        if isinstance(named, dict) and named:
            return [directory / str(relative) for relative in named.values()]
    found = sorted(directory.glob("*/results.json")) or sorted(
        p for p in directory.glob("*.json") if p.name != REPLAY_FILE
    )
    if not found:
        raise ResultsFileError(
            f"{directory}: no results files in this directory (expected {REPLAY_FILE}, "
            "*/results.json or *.json, as `evalkit replay --out DIR` writes)"
        )
    return found


def load_arms(
    directory: Path,
    *,
    data: DomainData | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[Arm]:
    """Every arm of a run directory, each analysed on its own and named by its arm.

    Raises:
        ResultsFileError: when a file cannot be read or the directory holds none.
        UsageError: when one arm's files hold several domains or models.
        DataError: when a domain directory cannot be loaded.
    """
    data = data or DomainData()
    arms = []
    for path in arm_files(directory):
        results = read_results(path)
        runs = analyze_results([(path, results)], data=data, resamples=resamples, seed=seed)
        if len(runs) != 1:
            raise UsageError(f"{path}: holds {len(runs)} runs; an arm is one domain and model")
        block = _block(results)
        profile, repair = block.get("profile"), block.get("repair")
        arms.append(
            Arm(
                name=runs[0].label,
                model=runs[0].model,
                profile=profile if isinstance(profile, str) and profile else None,
                repair=repair if isinstance(repair, str) and repair else "off",
                path=path,
                run=runs[0],
            )
        )
    return arms


def finding_pairs(arms: Sequence[Arm]) -> list[tuple[Arm, Arm]]:
    """The (reference, candidate) pairs a replay's headline compares: every arm without repair
    against the first one without repair, then each arm without repair against the same model
    or profile with repair. Empty when there is nothing to compare."""
    plain = [a for a in arms if not a.repaired]
    repaired = [a for a in arms if a.repaired]
    reference = plain[0] if plain else None
    pairs = [(reference, other) for other in plain[1:] if reference is not None]
    for arm in plain:
        pairs += [(arm, r) for r in repaired if r.subject == arm.subject and r.model == arm.model]
    return pairs


def arm_pairs(a_arms: Sequence[Arm], b_arms: Sequence[Arm]) -> list[tuple[Arm, Arm]]:
    """Two run directories' arms paired by name.

    Raises:
        UsageError: when the two directories have no arm name in common.
    """
    by_name = {arm.name: arm for arm in b_arms}
    pairs = [(arm, by_name[arm.name]) for arm in a_arms if arm.name in by_name]
    if not pairs:
        raise UsageError(
            f"the two run directories share no arm (A: {', '.join(a.name for a in a_arms)}; "
            f"B: {', '.join(b.name for b in b_arms)})"
        )
    return pairs


# -- one configuration per run ---------------------------------------------------------------

CONFIGURATION: Final = ("arm", "profile", "repair", "api", "upstream")
"""The fields of a file's `info.toolsentry` block that make a configuration: files that differ in
one of them are different runs, never trials of one."""


def _block(results: Results) -> dict[str, Any]:
    block = results.info.get("toolsentry")
    return block if isinstance(block, dict) else {}


def configuration(results: Results) -> dict[str, Any]:
    """What a results file ran under, beyond its domain and model (see `CONFIGURATION`)."""
    block = _block(results)
    return {key: block.get(key) for key in CONFIGURATION if block.get(key) is not None}


def check_one_configuration(
    first: tuple[Path | None, Results], other: tuple[Path | None, Results]
) -> None:
    """Refuse to pool two files of one domain and model that ran under different configurations.

    Raises:
        UsageError: naming the files and every field that differs.
    """
    a, b = configuration(first[1]), configuration(other[1])
    differences = [
        f"{key} {a.get(key, '(none)')} vs {b.get(key, '(none)')}"
        for key in CONFIGURATION
        if a.get(key) != b.get(key)
    ]
    if differences:
        names = " and ".join(str(p) if p else "a results file" for p in (first[0], other[0]))
        raise UsageError(
            f"{names} are not trials of one configuration ({'; '.join(differences)}): they are "
            "not pooled into one run; compare them (evalkit compare A B), or pass their run "
            "directory, which analyses each arm on its own"
        )
