"""``metrics.spectral``: sigma_max by warm-started Lanczos, and the stable rank, against
numpy's float64 SVD on weights of a real trained layer and on matrices with a known
spectrum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from msmon_nb.metrics.spectral import TOL, stable_rank, start_vector, top_singular


def known(m, n, singular, seed=0):
    """An m x n matrix with the given singular values (float64)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, len(singular))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(singular))))
    return (u * np.asarray(singular)) @ v.T


def trained_layers():
    """The weights of a small MLP after 150 Adam steps on a real task (MindSpore, CPU)."""
    import mindspore as ms
    from mindspore import nn

    ms.set_seed(0)
    rng = np.random.default_rng(0)
    net = nn.SequentialCell(
        [nn.Dense(32, 96), nn.ReLU(), nn.Dense(96, 96), nn.ReLU(), nn.Dense(96, 10)]
    )
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grad_fn = ms.value_and_grad(lambda a, c: loss(net(a), c), None, opt.parameters)
    x = rng.normal(size=(1024, 32)).astype(np.float32)
    y = (x @ rng.normal(size=(32, 10))).argmax(1).astype(np.int32)
    history = []
    for step in range(150):
        idx = rng.integers(0, len(y), 64)
        _, grads = grad_fn(ms.Tensor(x[idx]), ms.Tensor(y[idx]))
        opt(grads)
        if step % 10 == 9:
            history.append([p.asnumpy().copy() for p in opt.parameters if p.ndim == 2])
    return history


def test_known_spectrum_wide_and_tall():
    singular = [5.0, 4.0, 1.0, 0.5]
    for shape in ((40, 12), (12, 40)):
        w = known(*shape, singular)
        top = top_singular(w)
        assert top.converged
        assert top.sigma == pytest.approx(5.0, rel=1e-10)
        assert top.vector.shape == (12,)  # the smaller side
        assert stable_rank(w, top.sigma) == pytest.approx(sum(s * s for s in singular) / 25)


def test_trained_weights_exact_when_warm_started():
    history = trained_layers()
    vectors = [None] * len(history[0])
    cold_products, warm_products = [], []
    for weights in history:
        for i, w in enumerate(weights):
            s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
            warm = top_singular(w, vectors[i])
            cold = top_singular(w)
            vectors[i] = warm.vector
            # (a few stop at the product cap with the residual above TOL: their value is
            # still within float32 precision, the residual bound being loose)
            # float32 products: agreement to float32 precision
            assert warm.sigma == pytest.approx(s[0], rel=2e-6)
            # a cold start may stop short (the cap): then it is a lower bound
            assert cold.sigma <= s[0] * (1 + 1e-6)
            rank = stable_rank(w, warm.sigma)
            assert rank == pytest.approx(float((s * s).sum() / s[0] ** 2), rel=4e-6)
            assert 1.0 <= rank <= min(w.shape) * (1 + 1e-6)
            warm_products.append(warm.products)
            cold_products.append(cold.products)
    assert sum(warm_products) < sum(cold_products)


def test_capped_answer_is_a_lower_bound():
    # a tiny gap: two products cannot separate 1.0 from 0.999
    w = known(200, 100, [1.0, 0.999, 0.998, 0.5] + [0.1] * 20, seed=3)
    top = top_singular(w, max_products=2)
    assert not top.converged
    assert top.sigma <= 1.0 + 1e-12
    assert TOL < 1e-3


def test_zero_nan_and_float16():
    assert top_singular(np.zeros((5, 3))).sigma == 0.0
    assert stable_rank(np.zeros((5, 3)), 0.0) is None
    bad = known(6, 4, [2.0, 1.0])
    bad[1, 2] = np.nan
    top = top_singular(bad)
    assert math.isnan(top.sigma) and top.vector is None
    assert math.isnan(stable_rank(bad, top.sigma))
    half = known(16, 8, [3.0, 1.0, 0.5]).astype(np.float16)
    s = np.linalg.svd(half.astype(np.float64), compute_uv=False)
    assert top_singular(half).sigma == pytest.approx(s[0], rel=1e-6)


def test_start_leaves_the_global_rng_alone():
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    start_vector(10)
    top_singular(known(8, 6, [1.0, 0.5]))
    assert np.array_equal(np.random.get_state()[1], before)
