"""large_ridge (the linear head's path for big tables) against sklearn's exact RidgeCV: at the same
penalty it gives the same coefficients and the same leave-one-out predictions."""

from __future__ import annotations

import numpy as np
from scipy import linalg
from sklearn.linear_model import Ridge, RidgeCV

from models.mtrouter.linear_head import hat_diagonal, large_ridge


def test_large_ridge_matches_ridgecv_at_the_penalty_it_picks():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 40)).astype(np.float32)
    y = np.stack([x[:, :5].sum(1), x[:, 5:9].sum(1) * 0.3], axis=1) + rng.standard_normal((600, 2))
    alphas = [0.1, 1.0, 10.0, 100.0]
    fit = large_ridge(x, y, alphas, seed=0)
    for t, alpha in enumerate(fit.alpha_):
        exact = RidgeCV(alphas=[alpha], scoring="neg_mean_squared_error", store_cv_results=True).fit(x, y[:, t])
        assert np.allclose(fit.coef_[t], exact.coef_, atol=1e-5)
        assert np.isclose(fit.intercept_[t], exact.intercept_, atol=1e-5)
        assert np.allclose(fit.loo[:, t], exact.cv_results_[:, 0], atol=1e-4)
    assert np.allclose(fit.predict(x), x @ fit.coef_.T + fit.intercept_, atol=1e-5)


def test_single_target_is_shaped_like_sklearn():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 10)).astype(np.float32)
    fit = large_ridge(x, x[:, 0] + 0.1 * rng.standard_normal(300), [0.1, 1.0], seed=0)
    assert fit.coef_.shape == (10,) and np.ndim(fit.intercept_) == 0 and fit.loo.shape == (300,)


def test_hat_diagonal_in_float32_matches_the_float64_solve():
    """The leverages' triangular solves run in float32 (4× faster on the replay's 4.5k-wide factor):
    they must agree with the float64 solve to a relative 1e-5, and large_ridge's leave-one-out
    predictions with those of an explicit refit without each row."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((700, 120)).astype(np.float32)
    xc = x - x.mean(axis=0)
    gram = (xc.T @ xc).astype(np.float64) + 3.0 * np.eye(120)
    lower = linalg.cho_factor(gram, lower=True)[0]
    exact = np.einsum("dn,dn->n", *(2 * [linalg.solve_triangular(np.tril(lower), xc.T.astype(np.float64), lower=True)]))
    np.testing.assert_allclose(hat_diagonal(lower, xc), exact, rtol=1e-5)

    y = x[:, :4].sum(1) + rng.standard_normal(700)
    fit = large_ridge(x, y, [3.0], seed=0)
    for i in (0, 17, 699):  # leave row i out, refit with sklearn's Ridge at the same penalty
        keep = np.arange(700) != i
        refit = Ridge(alpha=3.0).fit(x[keep].astype(np.float64), y[keep])
        assert np.isclose(fit.loo[i], refit.predict(x[i:i + 1].astype(np.float64))[0], atol=1e-5)
