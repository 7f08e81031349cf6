"""The forecast's knobs, spelled in every place an ownership knob is: the Nodeset spec
(CRD in manifests/ and in the chart), the config file, `sunkd simulate --knobs`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sunkd.cli.simulate import KNOBS, UsageError, _value
from sunkd.domain.events import OwnershipSpec
from sunkd.kubernetes.normalize import parse_ownership
from sunkd.runtime.config import ConfigError, load_settings, pool_spec

ROOT = Path(__file__).resolve().parents[2]


def test_the_nodeset_spec_reads_the_forecast_knobs() -> None:
    spec = parse_ownership({"forecast": True, "forecastHorizonSeconds": 7200,
                            "headroomQuantile": 0.75})
    assert (spec.forecast, spec.forecast_horizon_seconds, spec.headroom_quantile) == (
        True, 7200.0, 0.75)
    assert parse_ownership({}) == OwnershipSpec()  # off by default: today's behaviour
    with pytest.raises(ValueError):
        parse_ownership({"forecast": "yes"})


@pytest.mark.parametrize("crd", ["manifests/crds/nodeset.yaml", "charts/sunkd/crds/nodeset.yaml"])
def test_both_crds_declare_the_forecast_knobs(crd: str) -> None:
    doc = yaml.safe_load((ROOT / crd).read_text())
    ownership = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"]["properties"]["ownership"]["properties"]
    assert ownership["forecast"] == {**ownership["forecast"], "type": "boolean",
                                     "default": False}
    assert ownership["forecastHorizonSeconds"]["default"] == 14400
    assert ownership["headroomQuantile"]["minimum"] == 0.5


def test_the_config_file_reads_the_forecast_knobs(tmp_path: Path) -> None:
    config = tmp_path / "sunkd.toml"
    config.write_text("[[pools]]\nname = 'a'\nforecast = true\n"
                      "forecast_horizon_seconds = 3600\nheadroom_quantile = 0.95\n")
    spec = pool_spec(load_settings(config, env={}).pools[0]).ownership
    assert (spec.forecast, spec.forecast_horizon_seconds, spec.headroom_quantile) == (
        True, 3600.0, 0.95)
    config.write_text("[[pools]]\nname = 'a'\nheadroom_quantile = 1.5\n")
    with pytest.raises(ConfigError, match="headroom_quantile"):
        load_settings(config, env={})


def test_the_block_knob_is_spelled_everywhere_and_off_by_default(tmp_path: Path) -> None:
    assert OwnershipSpec().forecast_block_hours == 0.0  # off: no blocks
    assert parse_ownership({"forecast": True, "forecastBlockHours": 8}).forecast_block_hours == 8
    for crd in ("manifests/crds/nodeset.yaml", "charts/sunkd/crds/nodeset.yaml"):
        doc = yaml.safe_load((ROOT / crd).read_text())
        ownership = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "spec"]["properties"]["ownership"]["properties"]
        assert ownership["forecastBlockHours"]["default"] == 0
        assert ownership["forecastBlockHours"]["maximum"] == 23
    config = tmp_path / "sunkd.toml"
    config.write_text("[[pools]]\nname = 'a'\nforecast = true\nforecast_block_hours = 10\n")
    assert pool_spec(load_settings(config, env={}).pools[0]).ownership.forecast_block_hours == 10
    config.write_text("[[pools]]\nname = 'a'\nforecast_block_hours = 24\n")
    with pytest.raises(ConfigError, match="forecast_block_hours"):
        load_settings(config, env={})
    assert _value(KNOBS["forecastBlockHours"], "8") == 8.0


def test_simulate_reads_the_forecast_knobs() -> None:
    assert _value(KNOBS["forecast"], "on") is True
    assert _value(KNOBS["headroomQuantile"], "0.8") == 0.8
    with pytest.raises(UsageError):
        _value(KNOBS["headroomQuantile"], "0.2")
