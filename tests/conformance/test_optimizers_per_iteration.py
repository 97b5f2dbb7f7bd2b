"""The conformance axis "optimizers stepping per iteration" (issue 48): 2, and 2 with a
critic stepping k times, crossed with the loop shapes users write them in (the DCGAN
tutorial's: two value_and_grad + optimizer pairs, two train cells called in turn in
PyNative and GRAPH_MODE, one outer cell stepping both by hand and under ``Model.train``;
WGAN-GP's critic with its gradient penalty) and the scaling forms (MindSpore's
``TrainOneStepWithLossScaleCell`` on D). One optimizer per iteration is the rest of the
matrix. Tiny G and D; each case against an unmonitored twin: one step is one iteration,
each optimizer's values are its own ``opt/<name>/...`` series, exact against float64
norms taken in the twin before each update, ``train/loss``/grad_norm/lr never mix the two
networks, and training is bit-identical."""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from msmon_nb.collect.parts import Part, Parts, derive_names, merge
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.overflow import on_cpu

Z, X, B, ITERATIONS = 4, 6, 8, 5
LR_D, LR_G = 0.002, 0.001


class DLoss(nn.Cell):
    """The discriminator's loss on a real and a generated batch (G's output detached)."""

    def __init__(self, net_d, net_g):
        super().__init__(auto_prefix=False)
        self.net_d, self.net_g, self.bce = net_d, net_g, nn.BCEWithLogitsLoss()

    def construct(self, real, z):
        fake = ops.stop_gradient(self.net_g(z))
        ones, zeros = ops.ones((B, 1), ms.float32), ops.zeros((B, 1), ms.float32)
        return self.bce(self.net_d(real), ones) + self.bce(self.net_d(fake), zeros)


class GLoss(nn.Cell):
    def __init__(self, net_d, net_g):
        super().__init__(auto_prefix=False)
        self.net_d, self.net_g, self.bce = net_d, net_g, nn.BCEWithLogitsLoss()

    def construct(self, real, z):
        return self.bce(self.net_d(self.net_g(z)), ops.ones((B, 1), ms.float32))


class Gan:
    """G, D, their losses, their Adams (the tutorial's betas) and the twin's references."""

    def __init__(self, scaled: bool = False) -> None:
        ms.set_seed(0)
        self.netG = nn.SequentialCell([nn.Dense(Z, 16), nn.ReLU(), nn.Dense(16, X)])
        self.netD = nn.SequentialCell([nn.Dense(X, 16), nn.ReLU(), nn.Dense(16, 1)])
        self.netD.update_parameters_name("d.")
        self.netG.update_parameters_name("g.")
        self.loss_d, self.loss_g = DLoss(self.netD, self.netG), GLoss(self.netD, self.netG)
        self.optD = nn.Adam(self.netD.trainable_params(), LR_D, beta1=0.5)
        self.optG = nn.Adam(self.netG.trainable_params(), LR_G, beta1=0.5)
        self.trainD = nn.TrainOneStepCell(self.loss_d, self.optD)
        if scaled:  # D's train cell with a loss scale (MindSpore's own cell)
            cell = on_cpu(nn.TrainOneStepWithLossScaleCell)
            self.trainD = cell(self.loss_d, self.optD, scale_sense=Tensor(1024.0, ms.float32))
        self.trainG = nn.TrainOneStepCell(self.loss_g, self.optG)
        self.outer = Outer(self.trainD, self.trainG)

        def fd(real, z):
            return self.loss_d(real, z)

        def fg(real, z):
            return self.loss_g(real, z)

        self.grad_d = ms.value_and_grad(fd, None, self.optD.parameters)
        self.grad_g = ms.value_and_grad(fg, None, self.optG.parameters)
        self.ref: dict[str, list[list[float]]] = {"d": [], "g": []}  # per iteration

    def state(self) -> dict[str, np.ndarray]:
        out = {}
        for owner in (self.optD, self.optG):
            for p in owner.get_parameters():
                out[p.name] = p.asnumpy().copy()
        return out

    def reference(self, which: str, real, z) -> None:
        """The twin's float64 norm of ``which``'s gradient, weights as they are now."""
        with_pynative = ms.get_context("mode")
        ms.set_context(mode=ms.PYNATIVE_MODE)
        try:
            _, grads = (self.grad_d if which == "d" else self.grad_g)(real, z)
        finally:
            ms.set_context(mode=with_pynative)
        norm = math.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
        self.ref[which][-1].append(norm)


class Outer(nn.Cell):
    """The DCGAN tutorial's shape: one cell whose ``construct`` steps D's train cell,
    then G's, and returns both losses."""

    def __init__(self, train_d, train_g):
        super().__init__(auto_prefix=False)
        self.train_d, self.train_g = train_d, train_g

    def construct(self, real, z):
        loss_d = self.train_d(real, z)
        if isinstance(loss_d, tuple):  # a loss-scale cell's (loss, overflow, scale)
            loss_d = loss_d[0]
        return loss_d, self.train_g(real, z)


def batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(ITERATIONS):
        real = rng.normal(size=(B, X)).astype(np.float32)
        out.append((Tensor(real), Tensor(rng.normal(size=(B, Z)).astype(np.float32))))
    return out


def iterate(gan: Gan, shape: str, critic: int, twin: bool) -> list[tuple[list, float]]:
    """One pass of the loop in ``shape``; (D's losses, G's loss) per iteration."""
    out = []
    for real, z in batches():
        if twin:
            gan.ref["d"].append([])
            gan.ref["g"].append([])
        losses = []
        if shape.startswith("outer"):
            loss_d, loss_g = gan.outer(real, z)
            out.append(([float(loss_d.asnumpy())], float(loss_g.asnumpy())))
            continue
        for _ in range(critic):
            if twin:
                gan.reference("d", real, z)
            if shape == "functional":
                loss, grads = gan.grad_d(real, z)
                gan.optD(grads)
            else:
                loss = gan.trainD(real, z)
                loss = loss[0] if isinstance(loss, tuple) else loss
            losses.append(float(loss.asnumpy()))
        if twin:
            gan.reference("g", real, z)
        if shape == "functional":
            loss, grads = gan.grad_g(real, z)
            gan.optG(grads)
        else:
            loss = gan.trainG(real, z)
        out.append((losses, float(loss.asnumpy())))
    return out


def fit(gan: Gan, mon) -> list[tuple[list, float]]:
    """``Model.train`` of the outer cell (its outputs recorded by a callback)."""
    import mindspore.dataset as mds
    from mindspore.train import Callback, Model

    class Losses(Callback):
        def __init__(self):
            self.out = []

        def on_train_step_end(self, run_context):
            loss_d, loss_g = run_context.original_args().net_outputs
            self.out.append(([float(loss_d.asnumpy())], float(loss_g.asnumpy())))

    data = batches()
    real = np.concatenate([r.asnumpy() for r, _ in data])
    z = np.concatenate([z.asnumpy() for _, z in data])
    dataset = mds.NumpySlicesDataset({"real": real, "z": z}, shuffle=False).batch(B)
    losses = Losses()
    callbacks = [losses] if mon is None else [losses, mon.callback()]
    Model(gan.outer).train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
    return losses.out


def train(shape: str, tmp_path, critic: int = 1, names=None):
    scaled = shape.endswith("+scale")
    shape = shape.removesuffix("+scale")
    graph = shape in ("cells-graph", "outer-graph", "outer-model")
    mode = ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE
    ms.set_context(mode=mode)
    try:
        twin = Gan(scaled)
        plain = iterate(twin, shape, critic, twin=True)
        if shape.startswith("outer"):  # the references: D's, its update, then G's
            reference = Gan(scaled)
            iterate(reference, "cells", critic, twin=True)
            twin.ref = reference.ref
        gan = Gan(scaled)
        given = names(gan) if names is not None else None
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            if shape == "outer-model":
                with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
                    seen = fit(gan, mon)
            else:
                with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch(given):
                    seen = iterate(gan, shape, critic, twin=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return twin, plain, gan, seen, mon, [str(w.message) for w in said]


SHAPES = ["functional", "cells", "cells-graph", "outer", "outer-graph", "outer-model"]
# D's train cell MindSpore's TrainOneStepWithLossScaleCell (scale 1024)
SHAPES += ["cells+scale", "cells-graph+scale", "outer-graph+scale"]


@pytest.mark.parametrize("shape", SHAPES)
def test_each_network_gets_its_own_series_one_step_an_iteration(tmp_path, shape):
    """Two train cells or two value_and_grad + optimizer pairs called in turn (PyNative
    and GRAPH_MODE), and one outer cell stepping both (PyNative, GRAPH_MODE by hand,
    ``Model.train``): one step per iteration, each network's own exact series."""
    twin, plain, gan, seen, mon, said = train(shape, tmp_path)
    assert seen == plain, "monitoring changed the losses"
    state, twin_state = gan.state(), twin.state()
    assert all(np.array_equal(state[k], twin_state[k]) for k in twin_state), "state moved"
    run = load_run(mon.run_dir)
    first = 1 if shape == "outer-model" else 0  # Model.train counts from 1
    if shape.startswith("cells") and shape.endswith("+scale"):
        np.testing.assert_array_equal(run.scalars("opt/netd/loss_scale").values, 1024.0)
    steps = list(range(first, first + ITERATIONS))
    for name, which, lr in (("netd", "d", LR_D), ("netg", "g", LR_G)):
        norms = run.scalars(f"opt/{name}/grad_norm")
        assert norms.steps.tolist() == steps
        expected = [refs[0] for refs in twin.ref[which]]
        np.testing.assert_allclose(norms.values, expected, rtol=1e-3)
        losses = [p[0][0] if which == "d" else p[1] for p in plain]
        np.testing.assert_allclose(run.scalars(f"opt/{name}/loss").values, losses, rtol=1e-6)
        np.testing.assert_allclose(run.scalars(f"opt/{name}/learning_rate").values, lr)
    assert not {"train/loss", "train/grad_norm", "train/learning_rate"} & set(run.tags)
    assert run.scalars("train/step_time").steps.tolist() == steps
    inside = "outer" in shape
    said_once = "2 optimizers step inside each call" if inside else "2 optimizers step in"
    assert sum(said_once in w and "(netd, netg)" in w for w in said) == 1, said
    assert not mon.alerts, [a.message for a in mon.alerts]


def test_a_critic_stepping_k_times_is_one_step_with_every_update_kept(tmp_path):
    """WGAN's shape: the critic steps 3 times per generator step. One step per iteration;
    the critic's loss is the mean of its 3, its grad_norm the largest of its 3 (float64
    twin), ``updates`` says 3; the generator's as usual."""
    twin, plain, _, seen, mon, _ = train("cells", tmp_path, critic=3)
    assert seen == plain
    run = load_run(mon.run_dir)
    steps = list(range(ITERATIONS))
    norms = run.scalars("opt/netd/grad_norm")
    assert norms.steps.tolist() == steps
    np.testing.assert_allclose(norms.values, [max(r) for r in twin.ref["d"]], rtol=1e-3)
    losses = run.scalars("opt/netd/loss").values
    np.testing.assert_allclose(losses, [np.mean(p[0]) for p in plain], rtol=1e-6)
    np.testing.assert_array_equal(run.scalars("opt/netd/updates").values, 3.0)
    assert "opt/netg/updates" not in run.tags
    np.testing.assert_allclose(
        run.scalars("opt/netg/grad_norm").values, [r[0] for r in twin.ref["g"]], rtol=1e-3
    )


def test_the_users_names(tmp_path):
    """``mon.watch(names=...)``: the user's names, by train cell or by network; without
    them, the variables of the networks each optimizer trains."""
    _, _, _, _, mon, said = train(
        "functional", tmp_path, names=lambda gan: {"critic": gan.trainD, "actor": gan.netG}
    )
    run = load_run(mon.run_dir)
    assert {"opt/critic/loss", "opt/actor/loss"} <= set(run.tags)
    assert not [t for t in run.tags if t.startswith(("opt/netd", "opt/netg"))]
    gan = Gan()
    netD, netG = gan.netD, gan.netG
    assert derive_names([gan.optD, gan.optG], [locals()]) == ["netd", "netg"]
    assert derive_names([gan.optD, gan.optG], [{"x": 1}]) == ["opt0", "opt1"]
    del netD, netG


def test_names_from_the_config(tmp_path):
    """``monitor_config.optimizer_names``: the variable of an optimizer, a train cell or a
    network in the loop's code (here attributes of the loop's own object) -> its name."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    gan = Gan()
    config = {"optimizer_names": {"optD": "critic", "netG": "actor"}}
    with Monitor(save_dir=str(tmp_path), log_interval=1, **config) as mon, mon.watch():
        iterate(gan, "cells", 1, twin=False)
    run = load_run(mon.run_dir)
    assert {"opt/critic/grad_norm", "opt/actor/grad_norm"} <= set(run.tags)


def test_parts_make_iterations():
    """The grouping alone: [D, G] iterations, a critic's k parts, a single optimizer."""
    d, g = object(), object()

    def label(step):
        return ["d" if p.key is d else "g" for p in step]

    def parts(keys, hold=True):
        grouping = Parts(hold_first=hold)
        out = []
        for key in keys:
            out += [
                [("d" if p.key is d else "g") for p in step]
                for step in grouping.add(Part(key, None, True))
            ]
        out += [[("d" if p.key is d else "g") for p in step] for step in grouping.flush()]
        return out, grouping

    steps, grouping = parts([d, g, d, g, d, g])
    assert steps == [["d", "g"]] * 3 and grouping.multi
    steps, _ = parts([d, d, d, g] * 3)
    assert steps == [["d", "d", "d", "g"]] * 3
    steps, grouping = parts([d] * 4, hold=False)
    assert steps == [["d"]] * 4 and not grouping.multi
    steps, grouping = parts([d, d, g, d, g], hold=False)  # G shows up late
    assert steps[:2] == [["d"], ["d"]] and grouping.switched_at == 2


def test_merge_names_each_optimizers_values():
    merged = merge(
        [
            ("netd", {"train/loss": 1.0, "train/grad_norm": 2.0, "train/learning_rate": 0.1}),
            ("netd", {"train/loss": 3.0, "train/grad_norm": 5.0, "train/learning_rate": 0.2}),
            ("netg", {"train/loss": 0.5, "train/grad_norm": 0.1, "param/g.0.weight/grad_norm": 1}),
        ]
    )
    assert merged == {
        "opt/netd/loss": 2.0,
        "opt/netd/grad_norm": 5.0,
        "opt/netd/learning_rate": 0.2,
        "opt/netd/updates": 2.0,
        "opt/netg/loss": 0.5,
        "opt/netg/grad_norm": 0.1,
        "param/g.0.weight/grad_norm": 1.0,
    }


def test_a_gradient_penalty_critic_stepping_k_times(tmp_path):
    """WGAN-GP's shape: the critic's loss takes a gradient of the critic inside it (the
    penalty on its input gradient's norm), and the critic steps 3 times per generator
    step, in a PyNative functional loop. The inner gradient is no step and no micro-batch:
    one step per iteration, the critic's grad_norm the largest of its 3 (float64), its
    updates 3, and training bit-identical to an unmonitored twin."""

    def run(monitored: bool):
        ms.set_seed(0)
        net_g = nn.SequentialCell([nn.Dense(Z, 16), nn.ReLU(), nn.Dense(16, X)])
        net_d = nn.SequentialCell([nn.Dense(X, 16), nn.ReLU(), nn.Dense(16, 1)])
        net_g.update_parameters_name("g.")
        net_d.update_parameters_name("d.")
        opt_d = nn.Adam(net_d.trainable_params(), 1e-3, beta1=0.5, beta2=0.9)
        opt_g = nn.Adam(net_g.trainable_params(), 1e-3, beta1=0.5, beta2=0.9)

        def critic_sum(x):
            return net_d(x).sum()

        input_grad = ms.grad(critic_sum)

        def d_loss(real, z):
            fake = ops.stop_gradient(net_g(z))
            mixed = 0.3 * real + 0.7 * fake
            g = input_grad(mixed)
            penalty = ((ops.sqrt((g * g).sum(1)) - 1) ** 2).mean()
            return net_d(fake).mean() - net_d(real).mean() + 10 * penalty

        def g_loss(real, z):
            return -net_d(net_g(z)).mean()

        grad_d = ms.value_and_grad(d_loss, None, opt_d.parameters)
        grad_g = ms.value_and_grad(g_loss, None, opt_g.parameters)
        norms: list[list[float]] = []
        mon = Monitor(save_dir=str(tmp_path), log_interval=1) if monitored else None
        with mon if mon is not None else nullcontext(), mon.watch() if mon else nullcontext():
            for real, z in batches():
                norms.append([])
                for _ in range(3):
                    _, grads = grad_d(real, z)
                    arrays = [g.asnumpy().astype(np.float64) for g in grads]
                    norms[-1].append(math.sqrt(sum(float((a * a).sum()) for a in arrays)))
                    opt_d(grads)
                _, grads = grad_g(real, z)
                opt_g(grads)
        state = [p.asnumpy().copy() for o in (opt_d, opt_g) for p in o.get_parameters()]
        return state, norms, mon

    plain, _, _ = run(False)
    state, norms, mon = run(True)
    assert all(np.array_equal(a, b) for a, b in zip(plain, state, strict=True))
    run_ = load_run(mon.run_dir)
    got = run_.scalars("opt/net_d/grad_norm")  # named after the variable: net_d
    assert got.steps.tolist() == list(range(ITERATIONS))
    np.testing.assert_allclose(got.values, [max(n) for n in norms], rtol=1e-3)
    np.testing.assert_array_equal(run_.scalars("opt/net_d/updates").values, 3.0)
    assert "train/grad_norm" not in run_.tags
    assert not mon.alerts, [a.message for a in mon.alerts]
