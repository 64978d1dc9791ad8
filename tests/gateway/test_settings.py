"""The gateway's settings file (gateway/settings.py): the shipped example loads, an unknown key is
refused by name, a flag overrides the file, every GatewayConfig field has a key and a flag, and the
default λ is not the 0 that picks the dearest worker."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import yaml

from gateway.app import GatewayConfig
from gateway.settings import DEFAULT_COST_WEIGHT, FLAGS, GatewaySettings, add_settings_flags, settings_from
from routerops.errors import InputError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "gateway.yaml"


def parse(*argv: str) -> GatewaySettings:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    return settings_from(parser.parse_args(list(argv)))


def test_the_shipped_example_loads_and_states_every_default():
    settings = parse("--config", str(EXAMPLE))
    assert settings.routers == ["router-knn"] and settings.defaults.cost_weight == DEFAULT_COST_WEIGHT
    # the example spells out every key with its default: nothing in it differs from the model's defaults
    assert settings.model_dump(exclude={"routers"}) == GatewaySettings().model_dump(exclude={"routers"})


def test_a_flag_overrides_the_file(tmp_path):
    settings = parse("--config", str(EXAMPLE), "--router", "router-a", "--router", "router-b", "--port", "9001",
                     "--cost-weight", "0", "--log-texts", "--metrics-key-labels")
    assert settings.routers == ["router-a", "router-b"] and settings.server.port == 9001
    assert settings.defaults.cost_weight == 0 and settings.decision_log.texts and settings.observability.key_labels
    assert settings.server.host == "127.0.0.1"  # the rest is the file's


def test_unknown_keys_and_bad_values_are_refused_by_name(tmp_path):
    bad = tmp_path / "gateway.yaml"
    bad.write_text(yaml.safe_dump({"routers": ["r"], "limits": {"max_in_flite": 3}}))
    with pytest.raises(InputError, match=r"gateway.yaml: field 'limits.max_in_flite': Extra inputs"):
        parse("--config", str(bad))
    bad.write_text(yaml.safe_dump({"routers": ["r"], "server": {"port": 70000}}))
    with pytest.raises(InputError, match=r"field 'server.port'"):
        parse("--config", str(bad))
    with pytest.raises(InputError, match=r"field 'routers': name at least one"):
        parse()


def test_every_gateway_config_field_has_a_settings_key_and_a_flag():
    """A field added to GatewayConfig (gateway/proxy.py) must be added to the settings file and a flag."""
    given = GatewaySettings(routers=["r"]).gateway_fields()
    assert set(given) == {f.name for f in dataclasses.fields(GatewayConfig)}
    GatewayConfig(**given)  # and the settings' values are valid ones
    flagged = {path for flags in FLAGS.values() for path in flags.values()}
    leaves = {f"{section}.{name}" for section, info in GatewaySettings.model_fields.items()
              if isinstance(info.annotation, type) and hasattr(info.annotation, "model_fields")
              for name in info.annotation.model_fields} | {"routers", "pool", "price_book", "database", "tracking_uri"}
    assert leaves - flagged == {"observability.service_name"}  # the one key that is file-only


def test_every_flag_has_help():
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    assert all(action.help for action in parser._actions)


def test_the_default_cost_weight_trades_quality_for_cost():
    """λ > 0 by default: of two workers 0.05 apart in estimated quality, one $0.01 dearer per request is
    not worth it; 0.2 apart it is (gateway/settings.py says why 10)."""
    lam = GatewaySettings().defaults.cost_weight
    assert 0.8 - lam * 0.0101 < 0.75 - lam * 0.0001
    assert 0.95 - lam * 0.0101 > 0.75 - lam * 0.0001
