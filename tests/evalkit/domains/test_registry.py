"""`evalkit.domains.get_domain` finds registered domains and names the valid ones otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit import domains
from evalkit.domains import domain_names, get_domain, register_domain
from evalkit.domains.base import Domain
from evalkit.errors import UnknownDomainError


def test_retail_is_registered_and_satisfies_the_protocol() -> None:
    assert "retail" in domain_names()
    assert isinstance(get_domain("retail"), Domain)


def test_unknown_name_lists_the_valid_domains() -> None:
    with pytest.raises(UnknownDomainError) as info:
        get_domain("airline")
    assert "unknown domain 'airline'" in info.value.message
    assert "retail" in info.value.message
    assert info.value.exit_code == 2


def test_registered_loader_receives_the_data_dir(
    tmp_path: Path, retail: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(domains, "_LOADERS", dict(domains._LOADERS))
    seen: list[Path | None] = []

    def loader(data_dir: Path | None) -> Domain:
        seen.append(data_dir)
        return retail

    register_domain("test-only", loader)
    assert get_domain("test-only", str(tmp_path)) is retail
    assert seen == [tmp_path]
