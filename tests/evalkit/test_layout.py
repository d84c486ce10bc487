"""The tests mirror `evalkit/`: every module `evalkit/X/m.py` has `tests/evalkit/X/test_m.py`, or a
line below saying where it is tested and why not in a module of its own name."""

from __future__ import annotations

from pathlib import Path

import evalkit

PACKAGE = Path(evalkit.__file__).parent
TESTS = Path(__file__).parent

_DOMAIN_GENERATOR = (
    "the generator's part: test_generate.py of its domain checks every task it makes"
)
_REPLAY = "a part of the replay package, tested through its public names in test_replay.py"
_PROBE = "a part of the probe package, tested through its public names in test_probe.py"

# Module (relative to evalkit/) -> where it is tested instead, and why.
ELSEWHERE: dict[str, str] = {
    "sim/generic.py": "the generic turn, over HTTP in sim/test_server.py and the README quickstarts",
    "domains/retail/data_model.py": "the database's models, read and written by test_tools.py",
    "domains/retail/world.py": _DOMAIN_GENERATOR,
    "domains/telecom/account_tasks.py": _DOMAIN_GENERATOR,
    "domains/telecom/data_model.py": "the database's models, read and written by test_tools.py",
    "domains/telecom/phone_state.py": "what the phone's settings mean: test_user_tools.py",
    "domains/telecom/task_drafts.py": _DOMAIN_GENERATOR,
    "domains/telecom/troubleshooting_tasks.py": _DOMAIN_GENERATOR,
    "domains/telecom/user_data_model.py": "the phone's models, read and written by test_user_tools.py",
    "domains/telecom/world.py": _DOMAIN_GENERATOR,
    "errors.py": "the hierarchy: each error is asserted where it is raised (test_formats.py, ...)",
    "exits.py": "exit codes of the commands: test_cli.py and probe/test_command.py",
    "messages.py": "the message models every episode test builds (test_wire.py, test_agent.py)",
    "probe/asking.py": _PROBE,
    "probe/contexts.py": _PROBE,
    "probe/figures.py": _PROBE,
    "probe/render.py": "the probe's pages and tables, written by the command: probe/test_command.py",
    "probe/run.py": "the journal and --resume, through the command: probe/test_command.py",
    "replay/arms.py": _REPLAY,
    "replay/endpoints.py": _REPLAY,
    "replay/options.py": _REPLAY,
    "replay/run.py": _REPLAY,
    "replay/tasks.py": _REPLAY,
    "tasks.py": "the task models every domain test loads (domains/test_conformance.py)",
    "termination.py": "the reasons an episode ends with, asserted in test_orchestrator.py",
}


def mirror_of(module: Path) -> Path:
    """Where the test module of `module` (a path relative to evalkit/) goes."""
    return TESTS / module.parent / f"test_{module.name}"


def modules() -> list[Path]:
    """Every module of evalkit/ but the packages' `__init__.py`, relative to evalkit/."""
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def test_every_module_has_a_test_module_or_a_stated_reason() -> None:
    missing = [str(m) for m in modules() if not mirror_of(m).exists() and str(m) not in ELSEWHERE]
    assert not missing, "add tests/evalkit/…/test_<name>.py, or a line to ELSEWHERE"


def test_every_stated_reason_is_still_needed() -> None:
    known = {str(m) for m in modules()}
    stale = [m for m in ELSEWHERE if m not in known or mirror_of(Path(m)).exists()]
    assert not stale, "these modules are gone or have their test module now"
