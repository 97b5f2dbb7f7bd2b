"""The matrix knows every optimizer the installed packages offer, found by introspection:
an optimizer class or factory name it does not know fails here until it is added to
``optimizers.BUILD`` or excluded with a reason that this machine confirms."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from tests.conformance.harness import loss_function, network
from tests.conformance.optimizers import (
    BUILD,
    BUILT_BY,
    EXCLUDED,
    UNIMPORTABLE,
    compared_names,
    exports,
    found,
    import_all,
    walked,
)


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
    # exported by no module: reached only by walking subclasses
    assert {"experimental.optim.adamw.SpeedAdamW", "nn.optim.thor.ThorGpu"} <= set(names)


def test_every_subclass_is_exported_built_by_a_factory_or_named():
    """Each Optimizer subclass the walk reaches is a class a module exports, a class a
    factory name builds (``BUILT_BY``: the factory's module holds it), or found under its
    own path (then trained or excluded like any other name)."""
    import mindcv.optim.optim_factory as mindcv_factory
    import mindone.trainers.optim as mindone_factory

    classes = walked()
    names = set(found())
    held = {id(v) for m in (mindcv_factory, mindone_factory) for v in vars(m).values()}
    for path, name in BUILT_BY.items():
        assert path in classes, f"{path} is no longer a subclass here"
        assert id(classes[path]) in held, f"{name}'s factory no longer holds {path}"
        assert name in names
    exported = set(exports())
    for path, cls in classes.items():
        assert cls in exported or path in BUILT_BY or path in names, path


def test_modules_that_do_not_import_are_the_known_ones():
    """A module of a walked package that fails to import hides its classes from the walk:
    only those named in ``UNIMPORTABLE`` may."""
    assert set(import_all()) == set(UNIMPORTABLE)


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
        # (nn.thor's classes take the network itself)
        extra = {"net": net} if getattr(build, "takes_net", False) else {}
        optimizer = build(net.trainable_params(), 0.01, **extra)
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
