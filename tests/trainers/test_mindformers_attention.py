"""``attention`` on MindFormers 2.1.0's own ``LLamaAttention`` (rotary position embeddings,
grouped key heads, the causal mask its model builds), found by structure: no
``attention_targets``.

The model is MindFormers' legacy ``LlamaForCausalLM`` as ``test_mindformers`` builds it (its
config classes, no download; ``use_rope_slice``, no fused RmsNorm, float32), here with 4
query heads over 2 key/value heads, trained in PyNative by a ``value_and_grad`` loop and
MindFormers' ``AdamW``. Each layer's attention is recorded as ``attn/<module>/max_logit`` and
``entropy`` on collected steps (``collect.attnsoftmax``: the scores it feeds its softmax).

The reference is independent of that capture: an unmonitored arm whose forward pre-hooks
copy each attention's input, MindFormers' rotary tables (``freqs_cis``) and mask; the logits
are recomputed here in float64 numpy -- the module's ``wq``/``wk`` weights, the rotation, the
key heads repeated per group, QK^T/sqrt(d) -- with the max over the positions the mask lets
through (mask 0) and the entropy of softmax(logits + mask). A third arm, with no hook at
all, gives the weights and AdamW moments the monitored run must equal bit for bit.

On main these modules were refused when named (rotary) and not found otherwise: no
``attn/`` series and a "holds no attention module" warning.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor

MINDFORMERS_DIR = Path(os.environ.get("MSMON_MINDFORMERS_DIR", Path(sys.prefix) / "mindformers"))
STEPS, EVERY, BATCH, SEQ, VOCAB = 5, 2, 2, 16, 64
HEADS, KV_HEADS, HIDDEN, LAYERS = 4, 2, 32, 2
STD = 0.3  # wide enough for logits of a few units, and entropies well below log(SEQ)
PATHS = [f"model.layers.{i}.attention" for i in range(LAYERS)]


@pytest.fixture(scope="module")
def mindformers(tmp_path_factory):
    """The ``mindformers`` package (``test_mindformers``' way in), its log in a temp dir."""
    if str(MINDFORMERS_DIR) not in sys.path:
        sys.path.append(str(MINDFORMERS_DIR))
    os.environ.setdefault("LOCAL_DEFAULT_PATH", str(tmp_path_factory.mktemp("mindformers")))
    try:
        import mindformers
    except ImportError as exc:  # the Makefile installs it; say what is missing
        pytest.fail(f"MindFormers 2.1.0 is not importable from {MINDFORMERS_DIR}: {exc}")
    assert mindformers.__version__ == "2.1.0"
    return mindformers


def build():
    """A fresh tiny Llama and MindFormers' AdamW, seeded alike for every arm."""
    from mindformers.core.optim import AdamW
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM

    ms.set_seed(0)
    config = LlamaConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_heads=HEADS, n_kv_heads=KV_HEADS,
        intermediate_size=64, vocab_size=VOCAB, seq_length=SEQ, batch_size=BATCH,
        use_rope_slice=True, fused_rms_norm=False, compute_dtype="float32",
        layernorm_compute_type="float32", softmax_compute_type="float32",
        rotary_dtype="float32", param_init_type="float32", init_method_std=STD,
    )  # fmt: skip
    net = LlamaForCausalLM(config)
    net.set_train(True)
    opt = AdamW(net.trainable_params(), learning_rate=3e-2)
    return net, opt


def batches():
    # token 0 is MindFormers' pad id: its keys are masked too (padding within the causal mask)
    rng = np.random.default_rng(0)
    return [
        Tensor(rng.integers(0, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int32)) for _ in range(STEPS)
    ]


def train(net, opt):
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    for x in batches():
        _, grads = grad_fn(x)
        opt(grads)


def state(opt):
    return [p.asnumpy().copy() for p in (*opt.parameters, *opt.exp_avg, *opt.exp_avg_sq)]


def attentions(net):
    cells = dict(net.cells_and_names())
    return [cells[p] for p in PATHS]


def rotate(x, cos, sin):
    """MindFormers' ``RotaryEmbedding`` with ``use_rope_slice``: x cos + [-x2, x1] sin."""
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def reference(x, wq, wk, cos, sin, mask):
    """(max_logit, entropy) of one attention call, float64, from its input and weights."""
    dim = HIDDEN // HEADS
    q = (x @ wq.T).reshape(BATCH, SEQ, HEADS, dim).transpose(0, 2, 1, 3)
    k = (x @ wk.T).reshape(BATCH, SEQ, KV_HEADS, dim).transpose(0, 2, 1, 3)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k = np.repeat(k, HEADS // KV_HEADS, axis=1)  # query head h reads key head h // group
    logits = q @ k.swapaxes(-1, -2) / math.sqrt(dim)
    mask = np.broadcast_to(mask, logits.shape)
    top = float(logits[mask == 0].max())
    shown = logits + mask
    p = np.exp(shown - shown.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = float(np.mean(-np.where(p > 0, p * np.log(p), 0.0).sum(-1)))
    return top, entropy


@pytest.fixture(scope="module")
def arms(mindformers):
    """(expected {step: {tag: value}}, final state of the hook-free arm, the attributes
    its attention modules' training itself rebinds)."""
    net, opt = build()
    before = [dict(vars(c)) for c in attentions(net)]
    train(net, opt)
    final = state(opt)
    rebound = {
        k for b, c in zip(before, attentions(net), strict=True) for k in b if vars(c)[k] is not b[k]
    }

    net, opt = build()
    seen: dict[str, tuple] = {}
    for path, cell in zip(PATHS, attentions(net), strict=True):

        def pre_hook(cell, args, path=path):
            x, (cos, sin, _), mask = args[0], args[1], args[2]
            seen.setdefault(
                path,
                tuple(
                    t.asnumpy().astype(np.float64)
                    for t in (x, cell.wq.weight, cell.wk.weight, cos, sin, mask)
                ),
            )

        cell.register_forward_pre_hook(pre_hook)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    expected = {}
    for step, x in enumerate(batches()):
        seen.clear()
        _, grads = grad_fn(x)
        opt(grads)
        if step % EVERY == 0:
            expected[step] = {}
            for path, args in seen.items():
                top, ent = reference(*args)
                expected[step][f"attn/{path}/max_logit"] = top
                expected[step][f"attn/{path}/entropy"] = ent
    same = all(np.array_equal(a, b) for a, b in zip(state(opt), final, strict=True))
    assert same, "the reference arm's hooks changed training"
    return expected, final, rebound


def run_watched(tmp_path, **extra):
    net, opt = build()
    before = [dict(vars(c)) for c in attentions(net)]
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY,
               track_metrics=["loss", "attention"], **extra)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch() as watch:
            train(net, opt)
    problems = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    after = [dict(vars(c)) for c in attentions(net)]
    return mon, watch, opt, problems, before, after


def check_series(mon, expected):
    run = load_run(mon.run_dir)
    series = {t: run.scalars(t) for t in run.tags() if t.startswith("attn/")}
    assert set(series) == set(expected[0]) and len(series) == 2 * LAYERS
    steps = sorted(expected)
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        np.testing.assert_allclose(s.values, want, rtol=1e-6, err_msg=tag)
    return series


def test_llama_attention_found_exact_and_training_unchanged(tmp_path, arms):
    expected, final, rebound = arms
    mon, watch, opt, problems, before, after = run_watched(tmp_path)
    assert not problems
    for got, want in zip(state(opt), final, strict=True):
        np.testing.assert_array_equal(got, want)
    series = check_series(mon, expected)
    # the causal mask counts: the mean row has fewer than SEQ open keys
    for i in range(LAYERS):
        ent = series[f"attn/model.layers.{i}.attention/entropy"].values
        assert (ent > 0).all() and (ent < math.log(SEQ)).all()
    # each module's softmax shadowed on collected steps only, then put back as it was:
    # the same attributes, the same objects but those MindSpore's own calls rebind
    assert watch.acts.calls == len(expected) * LAYERS
    assert not watch.acts.handles
    for b, a in zip(before, after, strict=True):
        assert a.keys() == b.keys()
        assert {k for k in b if a[k] is not b[k]} <= rebound
        assert a["softmax"] is b["softmax"] and a["_primitives"] == b["_primitives"]


def test_named_rotary_module_is_followed_not_refused(tmp_path, arms):
    """``attention_targets`` naming a rotary, grouped-head module (refused before)."""
    expected = arms[0]
    named = {s: {t: v for t, v in d.items() if ".layers.0." in t} for s, d in expected.items()}
    mon, _, _, problems, _, _ = run_watched(tmp_path, attention_targets=[r"layers\.0\.attention$"])
    assert not problems
    run = load_run(mon.run_dir)
    for tag in named[0]:
        np.testing.assert_allclose(
            run.scalars(tag).values, [named[s][tag] for s in sorted(named)], rtol=1e-6
        )
    assert {t for t in run.tags() if t.startswith("attn/")} == set(expected[0])


def test_compiled_step_warns_once_and_training_unchanged(tmp_path, mindformers):
    """A jit step: not recorded (the scores exist only inside the compiled graph); one
    warning names the modules and the way to record them; the weights are the plain arm's."""
    net, opt = build()
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    @ms.jit
    def step(x):
        loss, grads = grad_fn(x)
        opt(grads)
        return loss

    for x in batches()[:2]:
        step(x)
    final = state(opt)

    net, opt = build()
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    @ms.jit
    def watched(x):
        loss, grads = grad_fn(x)
        opt(grads)
        return loss

    cfg = dict(save_dir=str(tmp_path), log_interval=1, track_metrics=["loss", "attention"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch():
            for x in batches()[:2]:
                watched(x)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    about = [m for m in said if "only a PyNative step shows" in m]
    assert len(about) == 1 and all(p in about[0] for p in PATHS), said
    assert "LLamaAttention" in about[0] and "PYNATIVE_MODE" in about[0]
    assert not [t for t in load_run(mon.run_dir).tags() if t.startswith("attn/")]
    for got, want in zip(state(opt), final, strict=True):
        np.testing.assert_array_equal(got, want)


def test_glm2_core_attention_through_its_nn_softmax(tmp_path, mindformers):
    """ChatGLM2's ``CoreAttention`` (an ``nn.Softmax`` sub-cell; 2 key/value groups for 4
    heads; the causal mask built inside its ``construct``), found by structure beside an
    ``InferAttention`` sibling that training never calls (no warning for it). Reference:
    the same softmax input taken another way, a forward pre-hook on that ``nn.Softmax`` in
    an unmonitored arm, reduced here in numpy. (On MindSpore 2.10 that mask comes out as
    +240 at the future positions -- ``bool * -10000`` wraps in uint8 -- and the module
    attends to them: ``max_logit`` shows what the softmax is fed, whatever it is.)"""
    from mindformers.models.glm2 import ChatGLM2Config, ChatGLM2ForConditionalGeneration

    def glm2():
        ms.set_seed(0)
        config = ChatGLM2Config(
            num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, kv_channels=8,
            ffn_hidden_size=64, padded_vocab_size=VOCAB, vocab_size=VOCAB, seq_length=SEQ,
            batch_size=BATCH, multi_query_attention=True, multi_query_group_num=KV_HEADS,
            compute_dtype="float32", layernorm_compute_type="float32", param_init_type="float32",
            rotary_dtype="float32", use_flash_attention=False, rmsnorm=False,
        )  # fmt: skip
        net = ChatGLM2ForConditionalGeneration(config)
        net.set_train(True)
        return net, ms.nn.Adam(net.trainable_params(), learning_rate=1e-2)

    paths = [f"transformer.encoder.layers.{i}.self_attention.core_attention" for i in range(LAYERS)]
    rng = np.random.default_rng(1)
    xs = [Tensor(rng.integers(1, VOCAB, size=(BATCH, SEQ)).astype(np.int32)) for _ in range(3)]

    def loop(net, opt):
        grad_fn = ms.value_and_grad(lambda x: net(x, x), None, opt.parameters)
        for x in xs:
            seen.clear()
            _, grads = grad_fn(x)
            opt(grads)
            yield

    seen: dict[str, np.ndarray] = {}
    net, opt = glm2()
    cells = dict(net.cells_and_names())
    for path in paths:

        def pre_hook(cell, args, path=path):  # returns None: the input goes on unchanged
            seen.setdefault(path, args[0].asnumpy().copy())

        cells[path].softmax.register_forward_pre_hook(pre_hook)
    expected = []
    for _ in loop(net, opt):
        want = {}
        for path, scores in seen.items():
            s = scores.astype(np.float64)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            want[f"attn/{path}/max_logit"] = float(s[s > -5e3].max())
            want[f"attn/{path}/entropy"] = float(np.mean(-(p * np.log(p)).sum(-1)))
        expected.append(want)
    final = [p.asnumpy().copy() for p in opt.parameters]

    net, opt = glm2()
    cfg = dict(save_dir=str(tmp_path), log_interval=1, track_metrics=["loss", "attention"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch():
            for _ in loop(net, opt):
                pass
    assert not [w for w in caught if issubclass(w.category, MonitorWarning)]
    for got, want in zip([p.asnumpy() for p in opt.parameters], final, strict=True):
        np.testing.assert_array_equal(got, want)
    run = load_run(mon.run_dir)
    assert {t for t in run.tags() if t.startswith("attn/")} == set(expected[0])
    assert len(expected[0]) == 2 * LAYERS
    for tag in expected[0]:
        s = run.scalars(tag)
        assert s.steps.tolist() == list(range(len(xs)))
        np.testing.assert_allclose(s.values, [e[tag] for e in expected], rtol=1e-6, err_msg=tag)
