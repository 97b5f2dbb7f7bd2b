"""The matrix knows every optimizer the installed packages offer, found by introspection:
an optimizer class or factory name it does not know fails here until it is added to
``optimizers.BUILD`` or excluded with a reason that this machine confirms."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from tests.conformance.harness import loss_function, network
from tests.conformance.optimizers import BUILD, EXCLUDED, compared_names, found


def test_every_found_optimizer_is_built_or_excluded():
    names = set(found())
    unknown = names - set(BUILD) - set(EXCLUDED)
    assert not unknown, f"optimizers the matrix does not know (add or exclude them): {unknown}"
    stale = (set(BUILD) | set(EXCLUDED)) - names
    assert not stale, f"entries no installed package offers any more: {stale}"
    assert not set(BUILD) & set(EXCLUDED)


def test_introspection_finds_each_source():
    names = found()
    counts = {
        source: sum(n.startswith(source) for n in names)
        for source in ("nn.", "mint.optim.", "experimental.optim.", "mindcv:", "mindone:")
    }
    print(f"{len(names)} optimizers found: {counts}")
    assert counts["nn."] >= 15 and counts["experimental.optim."] >= 10
    assert counts["mint.optim."] >= 2 and counts["mindcv:"] >= 10 and counts["mindone:"] >= 7
    assert {"mindcv:adamw", "mindcv:lion", "mindcv:adan", "mindone:adamw_re"} <= set(names)


def test_factory_names_are_read_from_the_source():
    def factory(params, opt="sgd"):  # written as the suites write theirs
        opt = opt.lower()
        if opt == "sgd":
            return 1
        elif opt in ["momentum", "nesterov"]:  # noqa: RET505
            return 2
        elif opt.lower() in ("adam",):
            return 3
        raise ValueError(opt)

    assert compared_names(factory, "opt") == ["adam", "momentum", "nesterov", "sgd"]


@pytest.mark.parametrize("name", sorted(EXCLUDED))
def test_each_exclusion_still_holds(name):
    """An excluded optimizer still fails here as its reason says: when a MindSpore release
    makes it run on the CPU, this fails and it joins the matrix."""
    reason, build, error = EXCLUDED[name]
    net = network()
    x = Tensor(np.ones((8, 8), np.float32))
    y = Tensor(np.zeros(8, np.int32))
    with pytest.raises(Exception, match=None) as failure:
        optimizer = build(net.trainable_params(), 0.01)
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_function()), optimizer)
        for _ in range(3):
            cell(x, y)
    assert error in str(failure.value), f"{name} ({reason}) now fails otherwise: {failure.value}"
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


@pytest.mark.parametrize("name", sorted(n for n, spec in BUILD.items() if not spec.pynative))
def test_optimizers_kept_out_of_pynative_loops_still_do_not_update_there(name):
    """mint.optim's optimizers do not move the weights when run op by op on the CPU: no
    PyNative case of them would train. When a release fixes that, this fails and they
    join the PyNative loop."""
    net = network()
    params = net.trainable_params()
    optimizer = BUILD[name].build(params, 0.1)
    before = [p.asnumpy().copy() for p in params]
    optimizer(tuple(Tensor(np.ones(p.shape, np.float32)) for p in params))
    assert all(np.array_equal(b, p.asnumpy()) for b, p in zip(before, params, strict=True))
