"""``collect.attnsoftmax`` without MindFormers: the arithmetic on given scores, what the
structure search takes and leaves, and a module that holds a softmax it never calls.

(MindFormers' own attention, trained, is ``tests/trainers/test_mindformers_attention.py``.)
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.ops import operations as P

from msmon_nb.collect.activations import module_paths
from msmon_nb.collect.attention import attention_modules
from msmon_nb.collect.attnsoftmax import score_signals, softmax_form
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor


def test_scores_with_masks_already_added():
    # one row: open logits 1.5 and -2; a masked position whose logit (+3) beats them
    # lands at 3 - 10000; another at -inf
    row = np.array([[1.5, -2.0, 3.0 - 1e4, -np.inf]], np.float32)
    got = score_signals(row)
    assert got["max_logit"] == 1.5
    p = np.array([1.0, math.exp(-3.5)]) / (1.0 + math.exp(-3.5))
    assert got["entropy"] == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)


def test_every_position_masked_gives_nan_and_a_nan_is_reported():
    assert math.isnan(score_signals(np.full((1, 1, 2, 2), -1e4, np.float32))["max_logit"])
    assert math.isnan(score_signals(np.array([[0.0, np.nan]]))["max_logit"])


class Attention(nn.Cell):
    """softmax(Q K^T / sqrt(d) + a causal mask it builds) with a rotation on Q and K."""

    def __init__(self, width: int = 8, call_softmax: bool = True) -> None:
        super().__init__()
        self.wq = nn.Dense(width, width, has_bias=False)
        self.wk = nn.Dense(width, width, has_bias=False)
        self.qk = P.BatchMatMul(transpose_b=True)
        self.softmax = P.Softmax()
        self.call_softmax = call_softmax
        self.mask = ms.Tensor(np.triu(np.full((4, 4), -1e4, np.float32), 1))

    def construct(self, x):
        q, k = self.wq(x), self.wk(x)
        q, k = q[..., ::-1], k[..., ::-1]  # stands for a rotation: not a projection
        scores = self.qk(q, k) / math.sqrt(8) + self.mask
        probs = self.softmax(scores) if self.call_softmax else ms.ops.exp(scores)
        return ms.ops.bmm(probs, x)


class Router(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Dense(8, 4)
        self.softmax = P.Softmax()

    def construct(self, x):
        return self.softmax(self.gate(x))


def test_structure_takes_an_attention_not_a_router():
    assert softmax_form(Attention()) is not None
    assert softmax_form(Router()) is None
    net = nn.SequentialCell([Attention(), Router()])
    found, problems = attention_modules(module_paths(net), None)
    assert [type(c).__name__ for _, c, _ in found] == ["Attention"] and not problems


def run(tmp_path, net):
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)
    x = ms.Tensor(np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32))
    cfg = dict(save_dir=str(tmp_path), log_interval=1, track_metrics=["loss", "attention"])
    with Monitor(**cfg) as mon, mon.watch():
        for _ in range(3):
            _, grads = grad_fn(x)
            opt(grads)
    return load_run(mon.run_dir)


def test_a_module_that_never_calls_its_softmax_warns_once(tmp_path):
    net = nn.SequentialCell([Attention(call_softmax=False)])
    with pytest.warns(MonitorWarning, match="did not call their softmax") as caught:
        run_ = run(tmp_path, net)
    assert sum("did not call" in str(w.message) for w in caught) == 1
    assert not [t for t in run_.tags() if t.startswith("attn/")]
    assert "softmax" in vars(net[0]) and type(vars(net[0])["softmax"]).__name__ == "Softmax"


def test_a_rotated_module_of_ones_own_is_recorded(tmp_path):
    run_ = run(tmp_path, nn.SequentialCell([Attention()]))
    tags = sorted(t for t in run_.tags() if t.startswith("attn/"))
    assert [t.rsplit("/", 1)[1] for t in tags] == ["entropy", "max_logit"]
    ent = run_.scalars(tags[0]).values
    assert ((ent > 0) & (ent < math.log(4))).all()  # causal: fewer than 4 open keys a row
