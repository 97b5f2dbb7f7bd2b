"""``attention`` inside compiled steps (``@ms.jit`` steps, GRAPH_MODE train cells,
``Model.train``): ``attn/<module>/max_logit`` and ``entropy`` computed in the graph
(``collect.attntaps``) on collected steps only.

Two references:

* the graph's arithmetic: one ``nn.MultiheadAttention`` per mask/layout case, called in a
  jit function with the taps on; what the graph stored (float64 on the CPU, read before
  any float32 rounding of the summary file) against ``attention.signals`` in float64 numpy
  on the same inputs and weights: rtol 1e-14 (measured: one ulp apart at most). The same
  graph in float32 (what other devices reduce in): rtol 2e-6 (measured up to 5.2e-7).
* the compiled loops: an unmonitored twin trained by the same compiled step; before each
  collected step its weights and batch are kept, and the attention modules' inputs are
  recomputed from them in a PyNative forward pass; the logits by the per-head float64
  loop of test_attention (not our code). Graph and PyNative kernels may round a module's
  input apart in its last bit: rtol 2e-6, as the activations' compiled tests. Weights and
  Adam's moments are bit-identical to the twin's, every module's class is its own again
  after the watch, and steps that are not collected compute nothing (counted).
"""

import warnings

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from msmon_nb.collect.acttaps import GraphActivations
from msmon_nb.collect.attention import Snapshot, signals
from msmon_nb.collect.attnform import mha_form
from msmon_nb.collect.attntaps import tapped_attention_class
from msmon_nb.collect.graph import tap_scalar
from msmon_nb.config import CORE_METRICS
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.collect.test_attention import CASES, EVERY, HEADS, build, reference, state

PATHS = ("encoder.layers.0.self_attn", "encoder.layers.1.self_attn")


def case_inputs(case):
    """(module, (query, key, value), masks) of one mask/layout case (test_attention's)."""
    ms.set_seed(3)
    rng = np.random.default_rng(3)
    kw = dict(batch_first=case != "seq_first")
    if case == "bias_kv_zero_attn":
        kw.update(add_bias_kv=True, add_zero_attn=True)
    if case == "separate_kdim":
        kw.update(kdim=6, vdim=6)
    mha = nn.MultiheadAttention(8, 2, **kw)
    q = rng.normal(size=(3, 5, 8)).astype(np.float32)
    k = rng.normal(size=(3, 5, 6 if case == "separate_kdim" else 8)).astype(np.float32)
    if case == "seq_first":
        q, k = q.swapaxes(0, 1).copy(), k.swapaxes(0, 1).copy()
    extra = {}
    if case == "causal_bool":
        extra["attn_mask"] = ms.Tensor(np.triu(np.ones((5, 5), bool), 1))
    if case == "key_padding":
        pad = np.zeros((3, 5), bool)
        pad[0, 3:] = True
        extra["key_padding_mask"] = ms.Tensor(pad)
    if case == "float_per_head":  # (N * H, L, S) additive, -inf beside finite
        mask = rng.normal(size=(3 * 2, 5, 5)).astype(np.float32)
        mask[:, :, 4] = -np.inf
        extra["attn_mask"] = ms.Tensor(mask)
    q = ms.Tensor(q)
    key = q if case != "separate_kdim" else ms.Tensor(k)
    return mha, (q, key, key), extra


def graph_stored(mha, inputs, extra, wide=None):
    """What the tapped class's graph stores for one call of ``mha`` in a jit function:
    [max_logit, entropy, serial], as stored (float64 on the CPU)."""
    if wide is None:
        graph = GraphActivations([], [("m", mha, mha_form(mha))])
        store = graph.stores["attn/m"]
        graph.set_collect(True)
    else:  # the float32 graph other devices run
        store = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="msmon_test_store")
        on = tap_scalar("msmon_test_on", 1, ms.int32)
        count = tap_scalar("msmon_test_count", 0, ms.int32)
        original = type(mha)
        mha.__class__ = tapped_attention_class(original, mha_form(mha), store, on, count, wide)

    @ms.jit
    def call(q, k, v):
        return mha(q, k, v, **extra)[0]

    try:
        call(*inputs)
        return store.asnumpy().astype(np.float64)
    finally:
        if wide is None:
            graph.uninstall()
        else:
            mha.__class__ = original


@pytest.mark.parametrize("case", [*CASES, "float_per_head"])
def test_graph_arithmetic_matches_the_float64_recomputation(case):
    mha, inputs, extra = case_inputs(case)
    want = signals(Snapshot(mha, inputs, extra))
    got = graph_stored(mha, inputs, extra)
    assert got[2] == 1  # the serial: computed once
    # measured: at most 2.2e-16 apart (one ulp) over these cases
    np.testing.assert_allclose(got[0], want["max_logit"], rtol=1e-14)
    np.testing.assert_allclose(got[1], want["entropy"], rtol=1e-14)
    assert type(mha) is nn.MultiheadAttention  # put back
    low = graph_stored(mha, inputs, extra, wide=ms.float32)
    # measured: 3.3e-7 to 5.2e-7 (a few float32 ulps; it grows with the head width)
    np.testing.assert_allclose(low[:2], [want["max_logit"], want["entropy"]], rtol=2e-6)


class Kept(Callback):
    """The twin's weights and batch before each collected step (``Model.train``)."""

    def __init__(self, net):
        self.net, self.kept = net, {}

    def on_train_step_begin(self, run_context):
        step = run_context.original_args().cur_step_num
        if step % EVERY == 0:
            weights = {p.name: p.asnumpy().copy() for p in self.net.trainable_params()}
            batch = run_context.original_args().train_dataset_element[0].asnumpy()
            self.kept[step] = (batch, weights)


def dataset():
    from tests.collect.test_attention import batches

    xs, ys = zip(*[(a.asnumpy(), c.asnumpy()) for a, c in batches()], strict=True)
    data = (np.concatenate(xs), np.concatenate(ys))
    return mds.NumpySlicesDataset(data, column_names=["x", "y"], shuffle=False).batch(8)


def compiled_run(shape, monitor=None):
    """Train the Encoder by a compiled step of ``shape``; returns (optimizer, kept
    {step: (batch, weights before it)}, the network) -- kept only unmonitored."""
    from tests.collect.test_attention import batches

    net, opt, grad_fn = build()
    kept = {}
    if shape == "model_train":
        keep = Kept(net)
        model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
        callbacks = [monitor.callback()] if monitor is not None else [keep]
        model.train(1, dataset(), callbacks=callbacks, dataset_sink_mode=False)
        return opt, keep.kept, net, None
    if shape == "jit":

        @ms.jit
        def step(a, c):
            loss, g = grad_fn(a, c)
            opt(g)
            return loss

    else:
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt)
    watch = monitor.watch() if monitor is not None else None
    if watch is not None:
        watch.__enter__()
    try:
        for i, (a, c) in enumerate(batches()):
            if monitor is None and i % EVERY == 0:
                weights = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
                kept[i] = (a.asnumpy(), weights)
            step(a, c)
    finally:
        if watch is not None:
            watch.__exit__(None, None, None)
    return opt, kept, net, watch


def expected_from(kept):
    """{step: {tag: value}}: the per-head float64 loop over the attention inputs a
    PyNative forward pass of a fresh Encoder with the kept weights gives."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net, _, _ = build()
        seen = {}
        for i, layer in enumerate(net.encoder.layers):

            def hook(cell, args, kwargs, out, path=PATHS[i]):
                seen[path] = (
                    args[0].asnumpy().astype(np.float64),
                    cell.in_proj_weight.asnumpy().astype(np.float64),
                    cell.in_proj_bias.asnumpy().astype(np.float64),
                    kwargs["attn_mask"].asnumpy().astype(np.float64),
                )

            layer.self_attn.register_forward_hook(hook, with_kwargs=True)
        out = {}
        for step, (batch, weights) in kept.items():
            for p in net.trainable_params():
                p.set_data(ms.Tensor(weights[p.name]))
            seen.clear()
            net(ms.Tensor(batch))
            out[step] = {}
            for path, (x, w, b, m) in seen.items():
                top, ent = reference(x, w, b, m, HEADS)
                out[step][f"attn/{path}/max_logit"] = top
                out[step][f"attn/{path}/entropy"] = ent
        return out
    finally:
        ms.set_context(mode=mode)


@pytest.fixture(params=["jit", "graph_cell", "model_train"])
def shape(request):
    if request.param != "jit":
        ms.set_context(mode=ms.GRAPH_MODE)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_compiled_steps_exact_and_training_unchanged(tmp_path, shape):
    plain = compiled_run(shape)
    final, expected = state(plain[0]), expected_from(plain[1])
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY,
               track_metrics=[*CORE_METRICS, "attention"])  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon:
            got = compiled_run(shape, mon)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert not [m for m in said if "attn" in m or "attention" in m], said
    for want, have in zip(final, state(got[0]), strict=True):
        np.testing.assert_array_equal(have, want)
    net = got[2]
    assert all(not hasattr(type(c), "_msmon_attn_of") for _, c in net.cells_and_names())
    run = load_run(mon.run_dir)
    series = {t: run.scalars(t) for t in run.tags() if t.startswith("attn/")}
    steps = sorted(expected)
    assert steps == ([3, 6] if shape == "model_train" else [0, 3, 6])
    assert set(series) == set(expected[steps[0]]) and len(series) == 4
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        np.testing.assert_allclose(s.values, want, rtol=2e-6, err_msg=tag)
    if shape != "model_train":  # computed on collected steps only, two modules each
        graph = got[3].acts.graph
        assert graph.computed() == 2 * len(steps) and graph.reads == len(steps)


def _uncompilable(x, w, b, rows, b_rows, wide):
    try:  # graph syntax has no try: compiling any graph that calls this fails
        return ms.ops.matmul(x, w)
    finally:
        pass


@pytest.mark.parametrize("shape", ["jit", "model_train"], indirect=True)
def test_a_tap_that_cannot_compile_is_switched_off_and_training_goes_on(
    tmp_path, shape, monkeypatch
):
    """The failure is injected (``attntaps._project`` replaced by one with a statement
    MindSpore's graph parser refuses): the step compiles again without any tap of ours,
    once, with one warning; training is bit-identical and nothing stale is recorded."""
    from msmon_nb.collect import attntaps

    plain = compiled_run(shape)
    monkeypatch.setattr(attntaps, "_project", _uncompilable)
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY,
               track_metrics=[*CORE_METRICS, "attention"])  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon:
            got = compiled_run(shape, mon)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    told = [m for m in said if "could not compile" in m]
    assert len(told) == 1 and "Unsupported statement 'Try'" in told[0], said
    for want, have in zip(state(plain[0]), state(got[0]), strict=True):
        np.testing.assert_array_equal(have, want)
    assert all(not hasattr(type(c), "_msmon_attn_of") for _, c in got[2].cells_and_names())
    run = load_run(mon.run_dir)
    assert not [t for t in run.tags() if t.startswith("attn/")]
    collected = [3, 6] if shape == "model_train" else [0, 3, 6]
    assert run.scalars("train/loss").steps.tolist() == collected
