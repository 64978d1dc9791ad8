"""MTRouterConfig: the paper's defaults, and strict loading."""

from __future__ import annotations

import pytest

from models.mtrouter.config import MTRouterConfig
from routerops.errors import InputError


def test_defaults_are_the_papers_hyper_parameters():
    cfg = MTRouterConfig()
    # §4.1 "Implement Details" and App. B.
    assert (cfg.learning_rate, cfg.weight_decay, cfg.batch_size, cfg.max_epochs, cfg.patience) == (1e-3, 0.01, 64, 100, 3)
    assert (cfg.attr_embed_dim, cfg.residual_dim, cfg.model_embed_dim, cfg.residual_l2) == (32, 16, 64, 0.001)
    assert cfg.severity_coefficients() == {"high": 1.0, "medium": 0.8, "low": 0.2}
    assert (cfg.progress_p0, cfg.progress_p1, cfg.progress_w_min, cfg.progress_w_max) == (0.3, 0.7, 0.3, 1.0)
    assert cfg.max_history_tokens == 8192
    assert cfg.regressor == "mlp" and cfg.history_mode == "full" and cfg.model_features == "learned"
    assert cfg.error_penalty and cfg.use_random_router_data


def test_from_dict_converts_lists_and_rejects_unknown_keys():
    cfg = MTRouterConfig.from_dict({"hidden_dims": [32, 16], "seed": 3}, source="params.yaml:mtrouter")
    assert cfg.hidden_dims == (32, 16) and cfg.seed == 3
    with pytest.raises(InputError, match="params.yaml:mtrouter.*learning_rat"):
        MTRouterConfig.from_dict({"learning_rat": 0.1}, source="params.yaml:mtrouter")


@pytest.mark.parametrize("bad", [{"history_mode": "everything"}, {"patience": 0}, {"progress_p0": 0.8},
                                 {"val_fraction": 1.5}, {"hidden_dims": []}, {"cost_weight": -1.0}])
def test_invalid_values_are_rejected_with_the_field_named(bad):
    with pytest.raises(InputError) as err:
        MTRouterConfig.from_dict(bad)
    assert err.value.field == next(iter(bad))


def test_params_yaml_spells_out_the_papers_numbers(tmp_path):
    """params.yaml carries every paper number as the run's default: the estimator section builds a
    config equal to the paper defaults except the documented ScienceWorld score scale."""
    from pathlib import Path

    import yaml

    from stages.mtrouter import estimator_config, load_run

    repo = Path(__file__).resolve().parents[3]
    run = load_run(repo / "params.yaml")
    cfg = estimator_config(run)
    assert cfg == MTRouterConfig().replace(score_range=200.0)
    assert run.split_seed == 42 and len(run.seeds) == 3
    written = yaml.safe_load((repo / "params.yaml").read_text())["mtrouter"]["estimator"]
    for key in ("max_history_tokens", "residual_l2", "learning_rate", "patience", "severity_medium", "progress_p1"):
        assert key in written

    bad = yaml.safe_load((repo / "params.yaml").read_text())
    bad["mtrouter"]["estimator"]["patiense"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError, match="mtrouter.estimator.*patiense"):
        estimator_config(load_run(tmp_path / "params.yaml"))
