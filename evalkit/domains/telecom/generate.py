"""Generate the telecom data shipped with evalkit: a seeded carrier database, the customer's phone,
and tasks with gold actions of both sides.

    python -m evalkit.domains.telecom.generate [--seed 11] [--out evalkit/domains/telecom/data]

The same seed writes the same `db.json`, `user_db.json` and `tasks.json` (the policy files
beside them are written by hand). Tasks are built like τ²-bench's: a task breaks the phone or
the account with set-up functions (`initialization_actions`), and its gold actions are the
diagnosis and the fixes, the agent's and the customer's, in an order that works. While
generating, every task is checked on a fresh environment: its assertions must fail before the
gold actions (for the troubleshooting tasks) and hold after them, with no gold action failing;
together the tasks must use every tool of both sides.

The world comes from `world.py`, the tasks from `troubleshooting_tasks.py` and `account_tasks.py`
(over the drafts of `task_drafts.py`); this module writes them out and checks them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from evalkit.domains.telecom.account_tasks import account_tasks
from evalkit.domains.telecom.data_model import TelecomDB
from evalkit.domains.telecom.domain import TelecomDomain
from evalkit.domains.telecom.task_drafts import Call, Draft, draw_cases
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.domains.telecom.troubleshooting_tasks import troubleshooting_tasks
from evalkit.domains.telecom.user_data_model import TelecomUserDB
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.domains.telecom.world import generate_db
from evalkit.env import Environment
from evalkit.messages import ToolCall
from evalkit.tasks import Task, parse_tasks

DEFAULT_SEED = 11
DEFAULT_OUT = Path(__file__).parent / "data"


def _drafts(db: dict[str, Any], rng: random.Random) -> list[Draft]:
    cases = draw_cases(db, rng)
    return troubleshooting_tasks(db, cases, rng) + account_tasks(db, cases, rng)


def _function(call: Call, *, assertion: bool = False) -> dict[str, Any]:
    env_type, name, arguments = call
    out: dict[str, Any] = {"env_type": env_type, "func_name": name, "arguments": arguments}
    if assertion:
        out.update({"assert_value": True, "message": None})
    return out


def _task(draft: Draft) -> dict[str, Any]:
    case = draft.case
    task_id = f"[{draft.category}]{'|'.join(draft.issues)}[{case.cid}/{case.lid}]"
    setup = list(draft.setup)
    if draft.phone_known and not any(f == "set_user_info" for _, f, _ in setup):
        setup.insert(0, ("user", "set_user_info", {"name": case.name, "phone_number": case.phone}))
    return {
        "id": task_id,
        "description": {"purpose": draft.purpose, "relevant_policies": None, "notes": None},
        "user_scenario": {
            "persona": None,
            "instructions": {
                "domain": "telecom",
                "reason_for_call": draft.reason,
                "known_info": draft.known,
                "unknown_info": draft.unknown,
                "task_instructions": draft.instructions,
            },
        },
        "initial_state": {
            "initialization_data": (
                None
                if draft.user_data is None
                else {"agent_data": None, "user_data": draft.user_data}
            ),
            "initialization_actions": [_function(c) for c in setup],
            "message_history": None,
        },
        "evaluation_criteria": {
            "actions": [
                {
                    "action_id": f"{name}_{i}",
                    "requestor": requestor,
                    "name": name,
                    "arguments": arguments,
                    "info": None,
                    "compare_args": draft.compare.get(name),
                }
                for i, (requestor, name, arguments) in enumerate(draft.gold)
            ],
            "env_assertions": [_function(c, assertion=True) for c in draft.assertions] or None,
            "communicate_info": draft.communicate,
            "nl_assertions": None,
            "reward_basis": draft.basis,
        },
    }


def check_task(domain: TelecomDomain, task: Task, *, broken_before: bool) -> None:
    """Check that the gold actions of `task` run without error and make its assertions hold
    (and, with `broken_before`, that some assertion fails before them).

    Raises:
        RuntimeError: naming the task and what is wrong.
    """
    criteria = task.evaluation_criteria
    assertions = (criteria.env_assertions if criteria else None) or []
    if broken_before and assertions:
        before = Environment(domain, task)
        if all(before.check_assertion(a) for a in assertions):
            raise RuntimeError(f"task {task.id}: the assertions hold before any gold action")
    env = Environment(domain, task)
    texts = []
    for action in task.gold_actions:
        call = ToolCall(id=action.action_id, name=action.name, arguments=action.arguments)
        call.requestor = action.requestor
        answer = env.replay(call)
        if answer.error:
            raise RuntimeError(f"task {task.id}: gold action {action.name} fails: {answer.content}")
        texts.append(answer.content or "")
    for assertion in assertions:
        if not env.check_assertion(assertion):
            raise RuntimeError(
                f"task {task.id}: {assertion.func_name} fails after the gold actions"
            )
    for info in (criteria.communicate_info if criteria else None) or []:
        if not any(info in text for text in texts):
            raise RuntimeError(f"task {task.id}: no tool result tells the agent {info!r}")


def generate(
    seed: int = DEFAULT_SEED,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The carrier's database, the phone and the tasks for `seed`, each task checked.

    Raises:
        RuntimeError: when a task fails its check or the tasks leave a tool unused.
    """
    rng = random.Random(seed)
    db = generate_db(rng)
    user_db = TelecomUserDB().model_dump(mode="json")
    drafts = _drafts(db, rng)
    raw = [_task(d) for d in drafts]
    tasks = parse_tasks(raw, source="generated telecom tasks")
    domain = TelecomDomain(
        TelecomDB.model_validate(db), TelecomUserDB.model_validate(user_db), "", tasks
    )
    for draft, task in zip(drafts, tasks, strict=True):
        check_task(domain, task, broken_before=draft.broken_before)
    used = {(a.requestor, a.name) for t in tasks for a in t.gold_actions}
    unused = [
        f"{side} {name}"
        for side, toolkit in (("assistant", TelecomTools), ("user", TelecomUserTools))
        for name in toolkit.tool_names()
        if (side, name) not in used
    ]
    if unused:
        raise RuntimeError(f"no task uses: {', '.join(unused)}")
    return db, user_db, raw


def write(out: Path, seed: int = DEFAULT_SEED) -> None:
    """Write `db.json`, `user_db.json` and `tasks.json` into `out`."""
    db, user_db, tasks = generate(seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("db.json", db), ("user_db.json", user_db), ("tasks.json", tasks)):
        (out / name).write_text(
            json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    write(args.out, args.seed)


if __name__ == "__main__":
    main()
