"""The registry of domains: `get_domain("retail")`, `get_domain("telecom")`, or with `data_dir` for
τ²-bench's own files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evalkit.domains.base import Domain
from evalkit.errors import UnknownDomainError

DomainLoader = Callable[[Path | None], Domain]


def _load_retail(data_dir: Path | None) -> Domain:
    from evalkit.domains.retail import load_retail

    return load_retail(data_dir)


def _load_telecom(data_dir: Path | None) -> Domain:
    from evalkit.domains.telecom import load_telecom

    return load_telecom(data_dir)


_LOADERS: dict[str, DomainLoader] = {"retail": _load_retail, "telecom": _load_telecom}


def register_domain(name: str, loader: DomainLoader) -> None:
    """Make `get_domain(name)` call `loader(data_dir)`; a second registration replaces the first."""
    _LOADERS[name] = loader


def domain_names() -> list[str]:
    """The registered domain names, sorted."""
    return sorted(_LOADERS)


def get_domain(name: str, data_dir: Path | str | None = None) -> Domain:
    """Load the domain `name`, from `data_dir` when given, else from the data shipped with evalkit.

    Raises:
        UnknownDomainError: when `name` is not registered (the message lists the valid names).
        DataError: when the domain's files are missing or invalid.
    """
    loader = _LOADERS.get(name)
    if loader is None:
        valid = ", ".join(domain_names())
        raise UnknownDomainError(f"unknown domain {name!r}; valid domains: {valid}")
    return loader(None if data_dir is None else Path(data_dir))


__all__ = ["Domain", "domain_names", "get_domain", "register_domain"]
