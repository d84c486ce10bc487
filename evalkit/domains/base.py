"""What a domain is: a database, toolkits bound to it, a policy and tasks.

A domain gives the episode a fresh pair of toolkits for every run — the agent's, and the user's
where the user acts on a device of their own (telecom). A toolkit is a class whose methods marked
with `@tool` are the tools, named as the methods and described, in OpenAI's `tools` format, from
their signatures and docstrings. Its other public methods (assertions, set-up functions) can be
run by name from a task's `initial_state` and `env_assertions`, as τ²-bench does.

A database is a pydantic model loaded from a file; it is deep-copied by loading it again and
compared by `canonical_hash`, a SHA-256 of its JSON with sorted keys (τ²-bench's DB check).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import orjson
from pydantic import BaseModel, ValidationError

from evalkit.errors import DataError
from evalkit.tasks import Task

F = TypeVar("F", bound=Callable[..., Any])
DB = TypeVar("DB", bound="DomainDB")

_TOOL_MARK = "__evalkit_tool__"


def tool(*, mutates: bool = False) -> Callable[[F], F]:
    """Mark a toolkit method as a tool. `mutates` says whether it can change the database."""

    def mark(func: F) -> F:
        setattr(func, _TOOL_MARK, mutates)
        return func

    return mark


class ToolNotFoundError(ValueError):
    """A call names no tool of the toolkit; the text is τ²-bench's."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Tool '{name}' not found.")


class DomainDB(BaseModel):
    """Base of every domain database."""

    def canonical_hash(self) -> str:
        """SHA-256 of the database's JSON with sorted keys (what the DB check compares)."""
        # Enum keys (telecom's signal strength per network technology) hash as their values.
        option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
        data = orjson.dumps(self.model_dump(), option=option, default=str)
        return hashlib.sha256(data).hexdigest()


def load_json_db(cls: type[DB], path: Path) -> DB:
    """Load a database model from a JSON file.

    Raises:
        DataError: when the file is missing, not JSON, or does not fit the model.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DataError(f"{path}: no such database file") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno})") from exc
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise DataError(f"{path}: not a {cls.__name__}: {exc}") from exc


def update_db(db: DB, update: Mapping[str, Any]) -> DB:
    """A copy of `db` with `update` merged in recursively (τ²-bench's `initialization_data`)."""

    def merge(base: Any, patch: Any) -> Any:
        if isinstance(base, dict) and isinstance(patch, Mapping):
            out = dict(base)
            for key, value in patch.items():
                out[key] = merge(base.get(key), value) if key in base else value
            return out
        return patch

    return type(db).model_validate(merge(db.model_dump(), update))


class Toolkit:
    """Tools over one database. Subclasses define methods marked with `@tool`."""

    _tools: ClassVar[dict[str, bool]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, bool] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if callable(member) and hasattr(member, _TOOL_MARK):
                    found[name] = bool(getattr(member, _TOOL_MARK))
        cls._tools = dict(sorted(found.items()))

    def __init__(self, db: DomainDB | None) -> None:
        self.db = db

    @classmethod
    def tool_names(cls) -> list[str]:
        """The names of the tools, sorted."""
        return list(cls._tools)

    @classmethod
    def has_tool(cls, name: str) -> bool:
        """Whether `name` is one of the tools."""
        return name in cls._tools

    @classmethod
    def mutates(cls, name: str) -> bool:
        """Whether the tool `name` can change the database (unknown names: False)."""
        return cls._tools.get(name, False)

    def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Run the tool `name` with keyword `arguments`, as the model passed them.

        Raises:
            ToolNotFoundError: when `name` is not a tool.
            Exception: whatever the tool raises — wrong arguments raise Python's own `TypeError`,
                business rules raise `ValueError` — the environment turns it into `Error: …`.
        """
        if name not in self._tools:
            raise ToolNotFoundError(name)
        return getattr(self, name)(**arguments)

    def run_function(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Run any public method by name (set-up actions and assertions of a task).

        Raises:
            ValueError: when the toolkit has no such public method.
        """
        func = getattr(self, name, None) if not name.startswith("_") else None
        if func is None or not callable(func):
            raise ValueError(f"Function {name} not found in {type(self).__name__}")
        return func(**arguments)

    @classmethod
    def openai_tools(cls) -> list[dict[str, Any]]:
        """The tools in OpenAI's `tools` format, from signatures and docstrings, sorted by name."""
        return [tool_schema(getattr(cls, name)) for name in cls._tools]

    def db_hash(self) -> str | None:
        """The canonical hash of the toolkit's database (None without one)."""
        return None if self.db is None else self.db.canonical_hash()


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """One function in OpenAI's `tools` format.

    The description is the docstring up to its `Args:` section; each parameter's description
    comes from its line in `Args:`; types come from the annotations. Parameters without a
    default are required.
    """
    doc = inspect.getdoc(func) or ""
    summary, arg_docs = _split_docstring(doc)
    hints = typing.get_type_hints(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        if name == "self":
            continue
        prop = _json_type(hints.get(name, str))
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": summary,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    summary: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    for line in doc.splitlines():
        header = _SECTION.match(line.strip())
        if header and not line.startswith(" "):
            section = header.group(1)
            current = None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments"):
            entry = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if entry and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = entry.group(1)
                args[current] = entry.group(2).strip()
            elif current is not None and line.strip():
                args[current] = f"{args[current]} {line.strip()}"
    return "\n".join(summary).strip(), args


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(options[0]) if len(options) == 1 else {}
    if origin in (list, tuple, set):
        (item,) = typing.get_args(annotation)[:1] or (str,)
        return {"type": "array", "items": _json_type(item)}
    if origin is dict or annotation is dict:
        return {"type": "object"}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in simple:
        return {"type": simple[annotation]}
    return {}


@runtime_checkable
class Domain(Protocol):
    """A domain an episode can run in.

    `toolkit_classes` names the toolkit classes (tool names, schemas and which tools change state,
    without loading a database). `fresh_toolkits` returns new toolkits over fresh databases every
    call (episodes must not share state): the agent's, and the user's or None. `sync_tools` runs after every tool call
    and every set-up function (telecom keeps the user's device and the network consistent);
    domains without a user side do nothing there.
    """

    @property
    def name(self) -> str: ...

    @property
    def policy(self) -> str: ...

    @property
    def tasks(self) -> list[Task]: ...

    def get_task(self, task_id: str) -> Task: ...

    def toolkit_classes(self) -> tuple[type[Toolkit], type[Toolkit] | None]: ...

    def fresh_toolkits(self) -> tuple[Toolkit, Toolkit | None]: ...

    def sync_tools(self, agent_tools: Toolkit, user_tools: Toolkit | None) -> None: ...


class BaseDomain:
    """The parts every domain shares: name, policy text, tasks, and lookup of a task by id.

    Subclasses implement `toolkit_classes` and `fresh_toolkits` (and `sync_tools` where the user
    has tools).
    """

    def __init__(self, name: str, policy: str, tasks: list[Task]) -> None:
        self._name = name
        self._policy = policy
        self._tasks = tasks
        self._by_id = {t.id: t for t in tasks}

    @property
    def name(self) -> str:
        return self._name

    @property
    def policy(self) -> str:
        return self._policy

    @property
    def tasks(self) -> list[Task]:
        return self._tasks

    def get_task(self, task_id: str) -> Task:
        """The task with id `task_id`.

        Raises:
            DataError: when the domain has no such task.
        """
        try:
            return self._by_id[task_id]
        except KeyError:
            raise DataError(f"domain {self._name!r} has no task {task_id!r}") from None

    def toolkit_classes(self) -> tuple[type[Toolkit], type[Toolkit] | None]:
        raise NotImplementedError

    def fresh_toolkits(self) -> tuple[Toolkit, Toolkit | None]:
        raise NotImplementedError

    def sync_tools(self, agent_tools: Toolkit, user_tools: Toolkit | None) -> None:
        return None
