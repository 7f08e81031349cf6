"""`sunkd demo` and `sunkd sim` on a production install, where the test bed (its own
distribution, `sunkd[testbed]`) is absent: they say how to get it instead of a traceback,
and the daemon's commands never needed it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from sunkd.cli.main import _needs_testbed, main
from sunkd.runtime.config import Settings


@pytest.fixture
def no_testbed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes every `import sunkd_testbed...` raise ModuleNotFoundError, as
    # on a machine where only sunkd's wheel is installed.
    for name in [n for n in sys.modules if n.startswith("sunkd_testbed")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sunkd_testbed", None)


@pytest.mark.parametrize("argv", [["demo", "--duration", "1"], ["sim", "kubeapi"]])
def test_test_bed_commands_say_how_to_install_it(
        no_testbed: None, argv: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv]) == 2
    err = capsys.readouterr().err
    assert "pip install 'sunkd[testbed]'" in err and "./testbed" in err
    assert "Traceback" not in err


def test_other_missing_modules_are_not_blamed_on_the_test_bed() -> None:
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    with pytest.raises(ModuleNotFoundError, match="matplotlib"):
        _needs_testbed("demo", handler)(argparse.Namespace(), Settings())
