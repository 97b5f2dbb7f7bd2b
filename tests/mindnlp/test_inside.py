"""``activations`` and ``attention`` on MindNLP models (transformers on mindtorch) under
``mon.watch()``: a hand loop (mindtorch's ``value_and_grad``, AdamW) over a tiny BERT and a
tiny Llama (rotary embeddings, 4 query heads over 2 key heads), each with transformers'
eager and sdpa attention, batches with padded positions.

Reference: an unmonitored twin on the same batches, with hooks of its own that only copy
to float64 numpy (forward hooks on the leaves of the parameter tree, found here by its own
walk; the query and key projections' outputs, and Llama's rotary cos/sin). The attention
logits are recomputed from those per head, rotary and grouped heads and the causal and
padding masks applied here, in float64. Summaries hold float32: norms, means and the
attention values are compared at rtol 1e-6 (1e-5 where the module's own float32 logits
are what msmon reads: eager, and Llama's rotated queries), max |x|, non-finite counts and
zero shares exactly. Training is bit-identical (weights and AdamW's state). Steps that
are not collected run no hook and no wrapper of ours (counted), and after the watch no
hook, wrapper or global hook of ours is left.

Both runs use the stand-in for MindNLP's two missing CPU kernels (``tests.mindnlp.support``).
"""

from __future__ import annotations

import math
import sys
import warnings

import mindtorch
import numpy as np
import pytest
import torch
from mindtorch.autograd import value_and_grad
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    TrainerCallback,
    set_seed,
)

from msmon_nb.config import CORE_METRICS
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.mindnlp.support import LR, assert_identical, bert_config, state, trainer
from tests.support.extent64 import stats64

UPDATES, EVERY = 3, 2  # steps 0 and 2 collected
COLLECTED = [s for s in range(UPDATES) if s % EVERY == 0]
VOCAB, SEQ, BATCH = 32, 6, 4
# right padding: rows 1 and 3 have 2 and 1 padded positions
PAD = np.array([[1] * SEQ, [1] * (SEQ - 2) + [0] * 2, [1] * SEQ, [1] * (SEQ - 1) + [0]])
STATS = ("norm", "max_abs", "mean", "nonfinite", "zero_frac")


def bert(impl: str):
    set_seed(0)
    config = BertConfig(**{**bert_config().to_dict(), "attn_implementation": impl})
    return BertForSequenceClassification(config)


def llama(impl: str):
    set_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        attention_dropout=0.0,
        attn_implementation=impl,
    )
    return LlamaForCausalLM(config)


MODELS = {"bert": bert, "llama": llama}


def batches(kind: str) -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(UPDATES):
        ids = rng.integers(0, VOCAB, size=(BATCH, SEQ))
        labels = ids if kind == "llama" else rng.integers(0, 2, size=BATCH)
        out.append(
            {
                "input_ids": torch.tensor(ids),
                "attention_mask": torch.tensor(PAD),
                "labels": torch.tensor(labels),
            }
        )
    return out


def train(model, data, seen=None):
    """The user's loop; ``seen``: the twin's readings (``Seen``) around it."""
    params = model.trainable_params()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def forward(batch):
        return model(**batch).loss

    grad_fn = value_and_grad(forward, params, attach_grads=True)
    model.train()
    for step, batch in enumerate(data):
        if seen is not None:
            seen.begin(step)
        grad_fn(batch)
        optimizer.step()
        model.zero_grad()
    return model, optimizer


def leaves(model) -> list[str]:
    """The paths of the modules holding parameters while none of their sub-modules does."""

    def holds(m):
        return bool(list(m.named_parameters(recurse=False)))

    return [
        path
        for path, m in model.named_modules()
        if path and holds(m) and not any(holds(c) for c in m.modules() if c is not m)
    ]


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Llama's rotary embedding in float64: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    turned = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + turned * sin[:, None]


def reference_attention(q, k, heads, kv_heads, causal, pad, cos=None, sin=None):
    """``{max_logit, entropy}`` recomputed per head in float64 from the projections'
    outputs (batch, length, heads x dim), keys masked by ``pad`` (and the future)."""
    batch, length, width = q.shape
    dim = width // heads
    qh = q.reshape(batch, length, heads, dim).transpose(0, 2, 1, 3)
    kh = k.reshape(batch, length, kv_heads, dim).transpose(0, 2, 1, 3)
    if cos is not None:
        qh, kh = rotate(qh, cos, sin), rotate(kh, cos, sin)
    top, entropies = -math.inf, []
    for b in range(batch):
        for h in range(heads):
            kv = h // (heads // kv_heads)
            for i in range(length):
                keys = [j for j in range(length) if pad[b, j] and (not causal or j <= i)]
                row = np.array([qh[b, h, i] @ kh[b, kv, j] / math.sqrt(dim) for j in keys])
                top = max(top, float(row.max()))
                p = np.exp(row - row.max())
                p /= p.sum()
                entropies.append(float(-(p * np.log(p)).sum()))
    return {"max_logit": top, "entropy": float(np.mean(entropies))}


class Seen:
    """The twin's float64 copies at the collected steps (each module's first call)."""

    def __init__(self, kind: str, model, pad=PAD, collected=COLLECTED) -> None:
        self.kind, self.model, self.pad, self.collected = kind, model, pad, collected
        self.step = -1
        self.now: dict[str, np.ndarray] = {}
        self.by_step: dict[int, dict[str, np.ndarray]] = {}
        self.modules = leaves(model)
        named = dict(model.named_modules())
        for path in self.modules:
            named[path].register_forward_hook(self._keep(path))
        attn = self.attention_path()
        for part in ("q", "k"):
            proj = named[f"{attn}.{self.proj(part)}"]
            proj.register_forward_hook(self._keep(f"{attn}#{part}"))
        if kind == "llama":
            named[attn].register_forward_pre_hook(self._rotary, with_kwargs=True)

    def attention_path(self) -> str:
        if self.kind == "bert":
            return "bert.encoder.layer.0.attention.self"
        return "model.layers.0.self_attn"

    def proj(self, part: str) -> str:
        return {"q": "query", "k": "key"}[part] if self.kind == "bert" else f"{part}_proj"

    def _keep(self, name):
        def hook(module, args, output):
            if self.step in self.collected and name not in self.now:
                self.now[name] = output.asnumpy().astype(np.float64)

        return hook

    def _rotary(self, module, args, kwargs):
        if self.step in self.collected and "#cos" not in self.now:
            cos, sin = kwargs["position_embeddings"]
            self.now["#cos"] = cos.asnumpy().astype(np.float64)
            self.now["#sin"] = sin.asnumpy().astype(np.float64)

    def begin(self, step: int) -> None:
        self.step = step
        self.now = self.by_step.setdefault(step, {})

    def expected(self) -> dict[int, dict[str, float]]:
        """``{step: {tag: value}}`` at the collected steps."""
        attn = self.attention_path()
        out = {}
        for step in self.collected:
            seen = self.by_step[step]
            values = {
                f"act/{path.lower()}/{stat}": v
                for path in self.modules
                for stat, v in stats64(seen[path]).items()
            }
            if self.kind == "bert":
                got = reference_attention(
                    seen[f"{attn}#q"], seen[f"{attn}#k"], 2, 2, False, self.pad
                )
            else:
                q, k = seen[f"{attn}#q"], seen[f"{attn}#k"]
                got = reference_attention(q, k, 4, 2, True, self.pad, seen["#cos"], seen["#sin"])
            values.update({f"attn/{attn}/{stat}": v for stat, v in got.items()})
            out[step] = values
        return out


def functions():
    """The functions the attention capture wraps, as the process holds them now."""
    functional = sys.modules["mindtorch.nn.functional"]
    return [
        functional.softmax,
        functional.scaled_dot_product_attention,
        mindtorch.ops.softmax,
        mindtorch.softmax,
    ]


def hook_dicts(model) -> dict[str, int]:
    return {
        f"{path}:{key}": len(value)
        for path, m in model.named_modules()
        for key, value in vars(m).items()
        if "hook" in key and hasattr(value, "__len__")
    }


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_exact_against_float64_twin_and_training_unchanged(tmp_path, kind, impl):
    data = batches(kind)
    twin_model = MODELS[kind](impl)
    assert twin_model.config._attn_implementation == impl
    seen = Seen(kind, twin_model)
    twin = state(*train(twin_model, data, seen))
    expected = seen.expected()

    plain = functions()
    model = MODELS[kind](impl)
    track = [*CORE_METRICS, "activations", "attention"]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track)
        with Monitor(**cfg) as mon, mon.watch() as watch:
            monitored = state(*train(model, data))
    assert_identical(monitored, twin)

    run = load_run(mon.run_dir)
    tags = {t for t in run.tags() if t.startswith(("act/", "attn/"))}
    assert tags == set(expected[0])
    assert len([t for t in tags if t.startswith("attn/")]) == 2
    for tag in sorted(tags):
        got = run.scalars(tag)
        assert got.steps.tolist() == COLLECTED, tag
        want = np.array([expected[step][tag] for step in COLLECTED])
        if tag.startswith("attn/"):
            exact = kind == "bert" and impl == "sdpa"  # float64 from the module's own q, k
            np.testing.assert_allclose(got.values, want, rtol=1e-6 if exact else 1e-5, err_msg=tag)
        elif tag.endswith(("norm", "mean")):
            np.testing.assert_allclose(got.values, want, rtol=1e-6, atol=1e-30, err_msg=tag)
        else:
            np.testing.assert_array_equal(got.values, np.float32(want), err_msg=tag)
    logit = run.scalars(f"attn/{seen.attention_path()}/max_logit").values
    assert np.all(np.abs(logit) > 1e-3), "a logit to compare with"

    # hooks and wrappers on the collected steps only: one call per module and step
    acts = watch.acts
    assert acts.calls == len(COLLECTED) * (len(seen.modules) + 1)
    assert acts.torch_attn.captures == len(COLLECTED)
    # and nothing of ours left: the model's hook dicts as a never-hooked model's, the
    # functions the process's own, no global module hook
    assert hook_dicts(model) == hook_dicts(MODELS[kind](impl))
    assert functions() == plain
    module = sys.modules["mindtorch.nn.modules.module"]
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    ours = [str(w.message) for w in said if issubclass(w.category, MonitorWarning)]
    assert ours == [], ours


def compare(run, expected: dict[int, dict[str, float]], steps: list[int]) -> None:
    """Every act/ and attn/ series of ``run`` against the twin's, at ``steps``."""
    tags = {t for t in run.tags() if t.startswith(("act/", "attn/"))}
    assert tags == set(expected[steps[0]])
    for tag in sorted(tags):
        got = run.scalars(tag)
        assert got.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        if tag.startswith("attn/") or tag.endswith(("norm", "mean")):
            np.testing.assert_allclose(got.values, want, rtol=1e-6, atol=1e-30, err_msg=tag)
        else:
            np.testing.assert_array_equal(got.values, np.float32(want), err_msg=tag)


class _Steps(TrainerCallback):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen.begin(state.global_step)


def test_trainer_records_them_at_each_update_first_micro_batch(tmp_path):
    """transformers' Trainer (MindNLP's training_step), two micro-batches an update,
    clipping on, sdpa BERT: each module's first call of the update, as for Cells."""
    updates = 3
    steps = list(range(updates))
    twin = trainer(2, 0.05, updates, str(tmp_path / "twin"))
    seen = Seen("bert", twin.model, pad=np.ones((BATCH, SEQ), int), collected=steps)
    twin.add_callback(_Steps(seen))
    twin.train()
    expected = seen.expected()

    monitored = trainer(2, 0.05, updates, str(tmp_path / "monitored"))
    track = [*CORE_METRICS, "activations", "attention"]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cfg = dict(save_dir=str(tmp_path / "runs"), log_interval=1, track_metrics=track)
        with Monitor(**cfg) as mon, mon.watch():
            monitored.train()
    assert_identical(state(monitored.model, monitored.optimizer), state(twin.model, twin.optimizer))
    compare(load_run(mon.run_dir), expected, steps)
    ours = [str(w.message) for w in said if issubclass(w.category, MonitorWarning)]
    assert ours == [], ours


def test_attention_rule_names_the_module_whose_logits_grow(tmp_path):
    """The user's loop scales BERT's query and key weights by 1.2 an update from step
    20 (logits x1.44 a step): ``attention_logit_growth`` (diagnose.attention) reads the
    attn/ series and names the module, with an onset near 20 (the loop stops there)."""
    grows = 20
    model = bert("sdpa")
    attn = model.bert.encoder.layer[0].attention.self
    params = model.trainable_params()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    grad_fn = value_and_grad(lambda batch: model(**batch).loss, params, attach_grads=True)
    rng = np.random.default_rng(2)
    track = [*CORE_METRICS, "attention"]
    cfg = dict(save_dir=str(tmp_path), log_interval=1, track_metrics=track)
    with Monitor(**cfg) as mon, mon.watch():
        for step in range(60):
            ids = rng.integers(0, VOCAB, size=(BATCH, SEQ))
            labels = rng.integers(0, 2, size=BATCH)
            grad_fn({"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)})
            optimizer.step()
            model.zero_grad()
            if step >= grows:
                with torch.no_grad():
                    attn.query.weight.mul_(1.2)
                    attn.key.weight.mul_(1.2)
            if any(a.kind == "attention_logit_growth" for a in mon.alerts):
                break
    found = [a for a in mon.alerts if a.kind == "attention_logit_growth"]
    tag = "attn/bert.encoder.layer.0.attention.self/max_logit"
    logits = load_run(mon.run_dir).scalars(tag).values
    assert found, [a.kind for a in mon.alerts]
    assert logits[-1] > 30 * logits[grows], "the logits grew"
    assert found[0].tag == tag
    assert grows - 3 <= found[0].since_step <= grows + 5, found[0].since_step


def test_what_cannot_be_recorded_is_said_once(tmp_path):
    """``act_grad`` (mindtorch runs no module backward hook), ``moe`` (routers of mindtorch
    models not followed), a named module that computes no attention (Llama's MLP), a
    pattern naming nothing: one warning each; the rest is recorded."""
    model = llama("sdpa")
    track = [*CORE_METRICS, "activations", "act_grad", "attention", "moe"]
    cfg = dict(
        save_dir=str(tmp_path),
        log_interval=1,
        track_metrics=track,
        module_targets=["^lm_head$"],
        attention_targets=[r"layers\.0\.mlp$", "^nothing$"],
    )
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch():
            train(model, batches("llama"))
    tags = {t.rsplit("/", 1)[0] for t in load_run(mon.run_dir).tags()}
    assert {t for t in tags if t.startswith(("act", "attn"))} == {
        "act/lm_head",
        "attn/model.layers.0.self_attn",
    }
    ours = [str(w.message) for w in said if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 4, ours
    assert any("routers of MindNLP (mindtorch) models are not followed" in m for m in ours)
    assert any("act_grad is not recorded for MindNLP" in m for m in ours), ours
    assert any("model.layers.0.mlp ran on a collected step" in m for m in ours), ours
    assert any("'^nothing$' names no module" in m for m in ours), ours
