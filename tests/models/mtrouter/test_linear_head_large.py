"""large_ridge (the linear head's path for big tables) against sklearn's exact RidgeCV: at the same
penalty it gives the same coefficients and the same leave-one-out predictions."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import RidgeCV

from models.mtrouter.linear_head import large_ridge


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
