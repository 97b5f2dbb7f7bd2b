"""Torch-style loops (MindNLP's mindtorch) where something cannot be read exactly: one
warning naming it, nothing recorded for it, everything else as usual, and training
bit-identical to the unmonitored twin. Also: the watch attaching when MindNLP is
imported after it began, and two torch-style optimizers stepping in one iteration.

Tiny ``torch.nn.Linear`` classifiers (mindtorch) with a cross-entropy loss, seconds
each. (Not a regression: in mindtorch 0.5.1 on the CPU, ``(out - y).sum()`` and
``mse_loss(out, y)`` give all-zero gradients, seen; cross-entropy, as BERT's, is sound.)
The stand-in for MindNLP's two missing CPU kernels (``tests.mindnlp.support``) is in place
for the monitored and the unmonitored runs alike.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from mindtorch.autograd import value_and_grad

from msmon_nb.collect.hooks import TORCH_OPTIMIZER
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.mindnlp.support import sq64

UPDATES, FEATURES, ROWS, CLASSES = 4, 6, 8, 3


class RelativeSGD(torch.optim.Optimizer):
    """Its lr lives in its own step count, not in ``param_groups`` (``lr=None`` there),
    as transformers' Adafactor with ``relative_step=True`` keeps it."""

    def __init__(self, params):
        super().__init__(params, {"lr": None})
        self.count = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.count += 1
        rate = 0.1 / math.sqrt(self.count)
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.sub_(param.grad * rate)


def classifier(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, CLASSES)
    )


def batches(n: int):
    """Inputs labelled by which of their first three features is largest."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
        out.append((torch.tensor(x), torch.tensor(x[:, :CLASSES].argmax(axis=1))))
    return out


def cross_entropy(model: torch.nn.Module, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def loop(
    accumulate: int = 1,
    optimizer: str = "adamw",
    clip: dict | None = None,
    clip_twice: bool = False,
    clip_first_layer_only: bool = False,
    norms: list | None = None,
):
    """A mindtorch loop: ``value_and_grad`` over a cross-entropy loss (divided by
    ``accumulate``), then a clip as asked, then ``step()``. ``norms``: the twin's float64
    norm of each update's accumulated gradient before clipping."""
    model = classifier()
    params = model.trainable_params()
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    else:
        opt = RelativeSGD(model.parameters())

    def forward(x, y):
        return cross_entropy(model, x, y) / accumulate

    grad_fn = value_and_grad(forward, params, attach_grads=True)
    data = batches(UPDATES * accumulate)
    for update in range(UPDATES):
        for micro in range(accumulate):
            grad_fn(*data[update * accumulate + micro])
        if norms is not None:
            norms.append(math.sqrt(sq64([p.grad for p in params])))
        if clip is not None:
            clipped = list(model[0].parameters()) if clip_first_layer_only else model.parameters()
            torch.nn.utils.clip_grad_norm_(clipped, **clip)
            if clip_twice:
                torch.nn.utils.clip_grad_norm_(model.parameters(), **clip)
        opt.step()
        model.zero_grad()  # (optimizer.zero_grad() fails in mindtorch 0.5.1)
    return {n: p.asnumpy().copy() for n, p in model.named_parameters()}


def watched(tmp_path, config: dict | None = None, **kwargs):
    """The loop's twin, then the loop under watch(): (run, MonitorWarning texts)."""
    norms: list[float] = []
    twin = loop(**kwargs, norms=norms)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(config or {"save_dir": str(tmp_path)}, log_interval=1) as mon, mon.watch():
            weights = loop(**kwargs)
    assert sorted(weights) == sorted(twin)
    for name in twin:
        assert weights[name].tobytes() == twin[name].tobytes(), name
    texts = [str(w.message) for w in said if issubclass(w.category, MonitorWarning)]
    assert min(norms) > 0.1, norms  # (a gradient to compare with)
    return load_run(mon.run_dir), texts, norms


def steps_of(run, tag: str) -> list[int]:
    return run.scalars(tag).steps.tolist() if tag in run.tags else []


def test_lr_outside_param_groups_is_not_recorded_and_said_once(tmp_path):
    run, said, norms = watched(tmp_path, optimizer="relative")
    assert [s for s in said if "learning_rate" in s] == said and len(said) == 1, said
    assert "RelativeSGD.param_groups[0]['lr'] is missing" in said[0]
    assert "train/learning_rate" not in run.tags
    assert steps_of(run, "train/loss") == list(range(UPDATES))
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-3)


def test_clip_by_another_norm_records_neither_norm_of_an_accumulated_update(tmp_path):
    run, said, _ = watched(tmp_path, accumulate=2, clip={"max_norm": 0.1, "norm_type": 1.0})
    assert len(said) == 1 and "clips by the 1.0-norm" in said[0], said
    assert "train/grad_norm_clipped" not in run.tags
    assert "train/grad_norm" not in run.tags  # only the clipped accumulated gradient is seen
    assert steps_of(run, "train/micro_grad_norm") == list(range(UPDATES))
    assert steps_of(run, "train/learning_rate") == list(range(UPDATES))


def test_two_clip_calls_before_one_update(tmp_path):
    run, said, norms = watched(tmp_path, clip={"max_norm": 0.1}, clip_twice=True)
    assert len(said) == 1 and "called 2 times before one optimizer update" in said[0], said
    assert "train/grad_norm_clipped" not in run.tags
    # one micro-batch: its gradient as produced is the update's, before any clip
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-3)


def test_clip_of_other_parameters_than_the_update(tmp_path):
    run, said, _ = watched(
        tmp_path, accumulate=2, clip={"max_norm": 0.1}, clip_first_layer_only=True
    )
    assert len(said) == 1 and "clips other parameters" in said[0], said
    assert "train/grad_norm_clipped" not in run.tags and "train/grad_norm" not in run.tags
    assert steps_of(run, "train/loss") == list(range(UPDATES))


def test_skip_cannot_hold_back_a_torch_style_update(tmp_path):
    config = {
        "save_dir": str(tmp_path),
        "alerts": {"grad_explosion": {"action": "skip", "skip_above": 1e9}},
    }
    run, said, _ = watched(tmp_path, config=config)
    assert len(said) == 1 and "cannot be held back" in said[0], said
    assert steps_of(run, "train/grad_norm") == list(range(UPDATES))


def test_mindnlp_imported_after_the_watch_began(tmp_path, monkeypatch):
    """A %%msmonitor cell that imports MindNLP itself: the watch attaches at the loop's
    first framework call."""
    module = sys.modules[TORCH_OPTIMIZER]
    norms: list[float] = []
    loop(accumulate=2, norms=norms)
    assert min(norms) > 0.1, norms
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
        monkeypatch.delitem(sys.modules, TORCH_OPTIMIZER)
        with mon.watch():
            monkeypatch.setitem(sys.modules, TORCH_OPTIMIZER, module)  # "import mindnlp"
            loop(accumulate=2)
    run = load_run(mon.run_dir)
    assert steps_of(run, "train/learning_rate") == list(range(UPDATES))
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-3)


def test_two_torch_style_optimizers_in_one_iteration(tmp_path):
    """A critic and an actor, each with its own AdamW, stepped in turn: one step per
    iteration, each optimizer's own ``opt/<name>/...`` series, no ``train/loss``."""
    critic, actor = classifier(0), classifier(1)
    opt_critic = torch.optim.AdamW(critic.parameters(), lr=0.01)
    opt_actor = torch.optim.AdamW(actor.parameters(), lr=0.02)

    def critic_loss(x, y):
        return cross_entropy(critic, x, y)

    def actor_loss(x, y):
        return cross_entropy(actor, x, (y + 1) % CLASSES)

    grad_critic = value_and_grad(critic_loss, critic.trainable_params(), attach_grads=True)
    grad_actor = value_and_grad(actor_loss, actor.trainable_params(), attach_grads=True)
    losses = {"critic": [], "actor": []}
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for x, y in batches(UPDATES):
            losses["critic"].append(float(grad_critic(x, y).asnumpy()))
            opt_critic.step()
            critic.zero_grad()
            losses["actor"].append(float(grad_actor(x, y).asnumpy()))
            opt_actor.step()
            actor.zero_grad()
    run = load_run(mon.run_dir)
    assert "train/loss" not in run.tags and "train/learning_rate" not in run.tags
    # named after the network each one trains (its param_groups' parameters)
    names = sorted({t.split("/")[1] for t in run.tags if t.startswith("opt/")})
    assert names == ["actor", "critic"], run.tags
    for who, lr in (("critic", 0.01), ("actor", 0.02)):
        assert steps_of(run, f"opt/{who}/loss") == list(range(UPDATES))
        np.testing.assert_allclose(run.scalars(f"opt/{who}/loss").values, losses[who], rtol=1e-6)
        np.testing.assert_allclose(run.scalars(f"opt/{who}/learning_rate").values, lr, rtol=1e-6)
        assert np.all(run.scalars(f"opt/{who}/grad_norm").values > 0.01)


def test_lr_scale_and_checkpoint_refuse_a_torch_style_optimizer(tmp_path):
    """``lr xF`` and ``checkpoint`` act on MindSpore optimizers: on mindtorch's they say
    why not and change nothing."""
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        loop()
    with pytest.raises(ValueError, match=r"AdamW is a torch-style optimizer.*Nothing was changed"):
        mon.scale_lr(0.5)
    with pytest.raises(ValueError, match=r"AdamW is not a MindSpore Cell or optimizer"):
        mon.checkpoint()
    assert not (Path(mon.run_dir) / "checkpoints").exists()


def test_every_second_update_collected(tmp_path):
    """``log_interval=2``: steps between collected ones read nothing, and the collected
    ones are still whole updates (two micro-batches, one clip)."""
    norms: list[float] = []
    loop(accumulate=2, clip={"max_norm": 0.1}, norms=norms)
    assert min(norms) > 0.1, norms  # it clips every update
    with Monitor(save_dir=str(tmp_path), log_interval=2) as mon, mon.watch():
        loop(accumulate=2, clip={"max_norm": 0.1})
    run = load_run(mon.run_dir)
    collected = list(range(0, UPDATES, 2))
    assert mon.step_count == UPDATES  # every update a step, collected or not
    for tag in ("train/grad_norm", "train/grad_norm_clipped", "train/micro_grad_norm"):
        assert steps_of(run, tag) == collected, tag
    np.testing.assert_allclose(
        run.scalars("train/grad_norm").values, [norms[i] for i in collected], rtol=1e-3
    )
    np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, 0.1, rtol=1e-5)
