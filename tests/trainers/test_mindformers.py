"""MindFormers 2.1.0 as it ships: its legacy ``LlamaForCausalLM``, ``MFTrainOneStepCell``,
``AdamW`` and ``CosineWithWarmUpLR``, with its own skip of a step by global norm.

MindFormers 2.1.0 pins ``mindspore~=2.11.0`` and ``hyper-parallel``, neither on PyPI: the
Makefile installs it ``--no-deps``, with the packages its import needs, into a dir of its
own (``.venv/mindformers``), appended to ``sys.path`` here so that nothing in the venv
changes. Its code runs unchanged but for two choices and one stand-in:

* the model is 2 layers wide 32, ``use_rope_slice=True`` (RoPE by slicing, which the
  CPU runs) and ``fused_rms_norm=False`` (the fused ``RmsNorm`` has no CPU kernel), all
  in float32;
* the train cell's overflow check: MindSpore's ``get_overflow_status`` reads Ascend's
  float-status registers, which the CPU lacks; as in the MindOCR tests
  (``tests/conformance/suites.py``) exactly ``start_overflow_check`` and
  ``get_overflow_status`` are replaced by ``amp.all_finite``, monitored and unmonitored
  arm alike. The rest -- loss scale, unscale, clip (its ``ClipGradNorm``), the skip rule
  ``global_norm < global_norm_spike_threshold`` -- is MindFormers' own.

The threshold sits inside the range of the run's global norms, so some updates are
skipped: ``train/grad_norm`` must be on every step that updated (equal to the global norm
MindFormers returns) and on none that was skipped, with no warning, and the weights
bit-identical to an unmonitored run; ``param_stats``' per-parameter gradient norms (from
the graph) add up to it. (Before: the first skipped step made the monitor
take the loop for accumulation with per-micro-batch clipping, for good.)
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops
from mindspore.amp import all_finite

from msmon_nb.collect.values import param_tag
from msmon_nb.config import CORE_METRICS
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.reference import assert_same_weights

pytestmark = pytest.mark.usefixtures("graph_mode")

# where the Makefile puts MindFormers 2.1.0 and what its import needs (its MINDFORMERS):
# beside the venv's packages, or where MSMON_MINDFORMERS_DIR says
MINDFORMERS_DIR = Path(os.environ.get("MSMON_MINDFORMERS_DIR", Path(sys.prefix) / "mindformers"))
STEPS, BATCH, SEQ, VOCAB = 12, 2, 16, 64
CLIP = 1.0
THRESHOLD = 1.4  # among the run's global norms (1.33-1.43): 3 of the 12 steps skip


@pytest.fixture(scope="module")
def mindformers(tmp_path_factory):
    """The ``mindformers`` package, its log dir in a temporary one (it writes
    ``./output/log`` otherwise)."""
    if str(MINDFORMERS_DIR) not in sys.path:
        sys.path.append(str(MINDFORMERS_DIR))
    os.environ.setdefault("LOCAL_DEFAULT_PATH", str(tmp_path_factory.mktemp("mindformers")))
    import mindformers

    assert mindformers.__version__ == "2.1.0"
    return mindformers


def build(mindformers):
    """A fresh model, optimizer and train cell, seeded alike for every arm."""
    from mindformers.core.lr import CosineWithWarmUpLR
    from mindformers.core.optim import AdamW
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM
    from mindformers.wrapper import MFTrainOneStepCell

    class CpuOverflowCheck(MFTrainOneStepCell):
        def start_overflow_check(self, pre_cond, compute_input):
            return Tensor([0] * 8, ms.int32), compute_input

        def get_overflow_status(self, status, compute_output):
            return ops.logical_not(all_finite(compute_output))

    ms.set_seed(0)
    config = LlamaConfig(
        num_layers=2, hidden_size=32, num_heads=4, intermediate_size=64, vocab_size=VOCAB,
        seq_length=SEQ, batch_size=BATCH, use_rope_slice=True, fused_rms_norm=False,
        compute_dtype="float32", layernorm_compute_type="float32",
        softmax_compute_type="float32", rotary_dtype="float32", param_init_type="float32",
    )  # fmt: skip
    net = LlamaForCausalLM(config)
    schedule = CosineWithWarmUpLR(learning_rate=1e-3, warmup_steps=2, total_steps=STEPS)
    optimizer = AdamW(net.trainable_params(), learning_rate=schedule)
    cell = CpuOverflowCheck(
        net, optimizer, use_clip_grad=True, max_grad_norm=CLIP, scale_sense=Tensor(1024.0),
        use_skip_data_by_global_norm=True, global_norm_spike_threshold=THRESHOLD,
    )  # fmt: skip
    cell.set_train(True)
    return net, optimizer, cell


def batches():
    rng = np.random.default_rng(0)
    return [
        Tensor(rng.integers(0, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int32)) for _ in range(STEPS)
    ]


@pytest.fixture(scope="module")
def plain(mindformers):
    """The unmonitored arm: MindFormers' own global norm and whether it skipped, per step."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net, optimizer, cell = build(mindformers)
    norms, updated = [], []
    for x in batches():
        out = cell(x)
        norm = float(out[4].asnumpy().reshape(-1)[0])
        norms.append(norm)
        updated.append(not bool(out[1].asnumpy()) and norm < THRESHOLD)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return net, optimizer, norms, updated


def test_skip_by_global_norm_keeps_grad_norm_on_every_update(mindformers, plain, tmp_path):
    plain_net, plain_opt, norms, updated = plain
    assert 0 < updated.count(False) < STEPS // 2, norms  # the rule skipped a few steps
    net, optimizer, cell = build(mindformers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = [*CORE_METRICS, "param_stats"]  # per-parameter norms, graph cell
        with Monitor(save_dir=str(tmp_path), track_metrics=metrics) as mon, mon.watch():
            for x in batches():
                cell(x)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert not said, said
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").steps.tolist() == list(range(STEPS))
    grad_norm = run.scalars("train/grad_norm")
    applied = [s for s in range(STEPS) if updated[s]]
    assert grad_norm.steps.tolist() == applied
    np.testing.assert_allclose(grad_norm.values, [norms[s] for s in applied], rtol=1e-6)
    clipped = run.scalars("train/grad_norm_clipped")
    assert clipped.steps.tolist() == applied
    np.testing.assert_allclose(clipped.values, CLIP, rtol=1e-5)
    assert "train/micro_grad_norm" not in list(run.tags())  # no micro-batch here
    assert not mon.alerts, [a.message for a in mon.alerts]
    # param_stats from the optimizer tap's per-gradient norms: on every update, they add
    # up to grad_norm; the weight norms are those of the weights the step left
    per_param = [run.scalars(f"param/{param_tag(p.name)}/grad_norm") for p in optimizer.parameters]
    for series in per_param:
        assert series.steps.tolist() == applied
    total = np.sqrt(sum(series.values.astype(np.float64) ** 2 for series in per_param))
    np.testing.assert_allclose(total, grad_norm.values, rtol=1e-5)
    for p in plain_opt.parameters:
        weight_norm = run.scalars(f"param/{param_tag(p.name)}/weight_norm").values[-1]
        expected = np.linalg.norm(p.asnumpy().astype(np.float64))
        np.testing.assert_allclose(weight_norm, expected, rtol=1e-5)
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())
    # the optimizer's state too: AdamW's moments and global_step
    assert_same_weights(list(optimizer.get_parameters()), list(plain_opt.get_parameters()))


def test_model_train(mindformers, plain, tmp_path):
    """The same run as MindFormers' trainer drives it: ``Model.train`` over a dataset
    (steps from 1, as MindSpore counts them), through the callback's taps. (Its
    ``MFLossMonitor`` is left out: with it, unmonitored ``Model.train`` ends 6e-8 away
    from the hand-driven run, without it bit-identical.)"""
    plain_net, plain_opt, norms, updated = plain
    net, optimizer, cell = build(mindformers)
    data = ms.dataset.GeneratorDataset(
        [(x.asnumpy(),) for x in batches()], ["input_ids"], shuffle=False
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
            ms.train.Model(cell).train(1, data, callbacks=[mon.callback()], dataset_sink_mode=False)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert not said, said
    run = load_run(mon.run_dir)
    applied = [s for s in range(STEPS) if updated[s]]
    grad_norm = run.scalars("train/grad_norm")
    assert grad_norm.steps.tolist() == [s + 1 for s in applied]
    np.testing.assert_allclose(grad_norm.values, [norms[s] for s in applied], rtol=1e-6)
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())
    assert_same_weights(list(optimizer.get_parameters()), list(plain_opt.get_parameters()))


def test_attention_targets_follow_its_rotary_attention_through_its_softmax(mindformers):
    """``attention_targets`` naming MindFormers' ``LLamaAttention``: its logits are of
    queries and keys after rotary position embeddings, which msmon cannot recompute from
    its ``wq``/``wk`` projections, so each named module is followed through the scores it
    feeds its own softmax (``collect.attnsoftmax``; refused before), none refused. The
    values are checked in ``test_mindformers_attention.py``."""
    from msmon_nb.collect.activations import module_paths
    from msmon_nb.collect.attention import attention_modules
    from msmon_nb.collect.attnsoftmax import is_softmax_form

    net, _, _ = build(mindformers)
    found, problems = attention_modules(module_paths(net), [r"layers\.\d+\.attention$"])
    assert problems == []
    assert [path for path, _, _ in found] == [f"model.layers.{i}.attention" for i in (0, 1)]
    for _, cell, form in found:
        assert type(cell).__name__ == "LLamaAttention"
        assert is_softmax_form(form) and form.owner is cell
