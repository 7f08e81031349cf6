"""The daemon caps glibc's malloc arenas unless the operator chose a number."""

from __future__ import annotations

import platform

import pytest

from sunkd.runtime.malloc import limit_arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_glibc_takes_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert limit_arenas() is True


@pytest.mark.parametrize(("name", "value"), [("MALLOC_ARENA_MAX", "4"),
                                             ("GLIBC_TUNABLES", "glibc.malloc.arena_max=8")])
def test_the_operators_choice_wins(monkeypatch: pytest.MonkeyPatch, name: str,
                                   value: str) -> None:
    monkeypatch.setenv(name, value)
    assert limit_arenas() is False
