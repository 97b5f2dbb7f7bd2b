"""The suites' own train cells, as they ship, configured for a case's scaling.

* mindone 0.5.0: ``mindone.trainers.TrainOneStepWrapper`` (EMA, clipping, accumulation,
  loss scale), with ``mindone.trainers.EMA``;
* MindCV 0.3.0: ``mindcv.utils.train_step.TrainStep`` (what ``create_trainer`` builds for
  clipping, EMA or accumulation);
* MindOCR 0.5.0: ``mindocr.utils.train_step_wrapper.TrainOneStepWrapper`` and its EMA. The
  ``mindocr`` package does not import on MindSpore 2.10 (``mindspore.parallel._transformer``
  is gone), so its modules are loaded from the installed files as they ship, under a
  package of their own (``load_mindocr``), without running ``mindocr/__init__.py``;
* MindSpore 2.10's boost: the ``BoostTrainOneStepCell`` ``Model(..., boost_level="O1")``
  builds (``boost_cell``); its ``BoostTrainOneStepWithLossScaleCell`` is ``EXCLUDED``.

Their dynamic loss scale checks overflow with the NPU float-status kernels, which the CPU
lacks (the suites skip the check there: ``is_cpu_device``). For the ``dynamic`` case the
cell is subclassed so that exactly those two methods check with ``amp.all_finite``
instead -- the one part that is not the suite's code, a stand-in for a device we do not
have -- and the rest (``process_loss_scale``, the update cell, the skipped update) is
theirs.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import mindspore as ms
from mindspore import Tensor, nn

from tests.support.overflow import on_cpu

SUITES = ("mindone", "mindcv", "mindocr", "boost")

# what AutoBoost's "O1" turns on (mindspore.boost.AutoBoost's documentation); "O2" adds
# adasum, which needs data parallel over 16+ devices: on one device it is O1
BOOST_O1 = {
    "less_bn": True, "grad_freeze": True, "adasum": False,
    "grad_accumulation": False, "dim_reduce": False, "loss_scale_group": False,
}  # fmt: skip


def load_mindocr(module: str) -> types.ModuleType:
    """``mindocr.<module>`` from the installed files, as ``mindocr_shipped.<module>``."""
    spec = importlib.util.find_spec("mindocr")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mindocr 0.5.0 is not installed (make venv installs it)")
    root = Path(next(iter(spec.submodule_search_locations)))
    parts = ["mindocr_shipped", *module.split(".")]
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*parts[1:depth]))]
            sys.modules[name] = package
    name = ".".join(parts)
    if name not in sys.modules:
        path = root.joinpath(*parts[1:]).with_suffix(".py")
        loaded = importlib.util.spec_from_file_location(name, path)
        module_object = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module_object
        loaded.loader.exec_module(module_object)
    return sys.modules[name]


def _classes(suite: str) -> tuple[type, type | None]:
    """(the suite's train cell class, its EMA class or None)."""
    if suite == "mindone":
        from mindone.trainers import EMA, TrainOneStepWrapper

        return TrainOneStepWrapper, EMA
    if suite == "mindcv":
        from mindcv.utils.train_step import TrainStep

        return TrainStep, None  # its EMA is a flag of TrainStep
    if suite == "mindocr":
        wrapper = load_mindocr("utils.train_step_wrapper").TrainOneStepWrapper
        return wrapper, load_mindocr("utils.ema").EMA
    if suite == "boost":
        from mindspore.boost import BoostTrainOneStepCell

        return BoostTrainOneStepCell, None
    raise ValueError(suite)


def suite_cell(suite: str, net: nn.Cell, loss_fn: nn.Cell, optimizer: Any, case: Any) -> nn.Cell:
    """The suite's train cell for ``case.scaling`` (none, static, dynamic, clip,
    accumulate, clip_accumulate, ema), with the harness's constants (scale, clip norm,
    micro-batches)."""
    from tests.conformance import harness as h

    cls, ema_cls = _classes(suite)
    scaling = case.scaling
    if scaling == "dynamic":
        cls = on_cpu(cls)
        scale: Any = nn.DynamicLossScaleUpdateCell(
            h.DYNAMIC_SCALE, h.DYNAMIC_FACTOR, h.DYNAMIC_WINDOW
        )
    else:
        scale = Tensor(h.STATIC_SCALE if scaling == "static" else 1.0, ms.float32)
    network = nn.WithLossCell(net, loss_fn)
    accumulate = h.MICRO if scaling in h.ACCUMULATING else 1
    clip = scaling in ("clip", "clip_accumulate")  # the second: after accumulating
    if suite == "boost":
        return boost_cell(net, loss_fn, optimizer)
    if suite == "mindcv":
        return cls(
            network, optimizer, scale_sense=scale, ema=scaling == "ema", ema_decay=0.9,
            clip_grad=clip, clip_value=h.CLIP, gradient_accumulation_steps=accumulate,
        )  # fmt: skip
    ema = ema_cls(net, ema_decay=0.9) if scaling == "ema" else None
    return cls(
        network, optimizer, scale_sense=scale, ema=ema, drop_overflow_update=True,
        gradient_accumulation_steps=accumulate, clip_grad=clip, clip_norm=h.CLIP,
    )  # fmt: skip


def fixed_update_cell(network: nn.Cell, optimizer: Any) -> nn.Cell:
    """What MindCV's ``create_trainer(loss_scale_type="fixed", loss_scale=S,
    drop_overflow_update=True)`` has ``Model`` build on a device (``amp.build_train_network``):
    MindSpore's ``TrainOneStepWithLossScaleCell`` over a ``FixedLossScaleUpdateCell(S)``,
    the optimizer's own scale 1 (MindCV's ``train.py`` gives it ``loss_scale`` only when
    nothing else undoes it). On the CPU both refuse to build it (``EXCLUDED``), so it is
    built here, its overflow check done by ``amp.all_finite`` (``support.overflow.on_cpu``)."""
    from tests.conformance import harness as h

    cell = on_cpu(nn.TrainOneStepWithLossScaleCell)
    return cell(network, optimizer, scale_sense=nn.FixedLossScaleUpdateCell(h.STATIC_SCALE))


def _mindcv_trainer_drop() -> None:
    """MindCV's ``create_trainer`` with a fixed scale and ``drop_overflow_update=True``."""
    from mindcv.optim import create_optimizer
    from mindcv.utils.trainer_factory import create_trainer

    from tests.conformance import harness as h

    net = h.network()
    optimizer = create_optimizer(net.trainable_params(), opt="adamw", lr=h.LR)
    create_trainer(
        net, h.loss_function(), optimizer, None, amp_level="O0", amp_cast_list=None,
        loss_scale_type="fixed", loss_scale=h.STATIC_SCALE, drop_overflow_update=True,
    )  # fmt: skip


def boost_cell(net: nn.Cell, loss_fn: nn.Cell, optimizer: Any) -> nn.Cell:
    """The train cell ``Model(net, loss_fn, optimizer, boost_level="O1", metrics=...)``
    builds: a ``BoostTrainOneStepCell`` over ``LessBN(net)`` whose optimizer is a
    ``FreezeOpt`` (one copy of the optimizer per gradient-freeze group, with gradient
    centralization), each step run by the freeze group the train strategy picks.

    ``AutoBoost`` is a process-wide singleton whose level is fixed by the first
    ``Model`` made in the process (any earlier ``Model(...)`` fixes "O0", and then
    ``boost_level="O1"`` builds a bare ``BoostTrainOneStepCell``), so the O1
    configuration its documentation gives is put in place for this ``Model`` and the
    singleton's own put back after."""
    from mindspore.boost import AutoBoost
    from mindspore.train import Model

    auto = AutoBoost()
    held = auto.level, auto.boost_config
    auto.level, auto.boost_config = "O1", dict(BOOST_O1)
    try:
        return Model(net, loss_fn, optimizer, boost_level="O1", metrics={"acc"}).train_network
    finally:
        auto.level, auto.boost_config = held


def trained_params(suite: str, optimizer: Any, cell: Any) -> list:
    """The Parameters ``cell`` updates: the harness's optimizer's, except under boost,
    whose ``FreezeOpt`` trains the Parameters of the network it rebuilt (``LessBN``
    replaces the last ``Dense`` with a ``CommonHeadLastFN``: a new weight, a
    ``multiplier``, no bias)."""
    if suite == "boost":
        return list(cell.optimizer.parameters)
    return list(optimizer.parameters)


def reference_network(suite: str, net: nn.Cell) -> nn.Cell:
    """The network the suite trains when given ``net``: under boost (O1, O2),
    ``LessBN(net, fn_flag=True)`` as ``AutoBoost`` builds it; else ``net``."""
    if suite == "boost":
        from mindspore.boost import LessBN

        return LessBN(net, fn_flag=True)
    return net


def schedule_index(suite: str, global_step: int | None, step: int) -> int | None:
    """Which entry of an lr list (or point of a schedule) step ``step`` uses. The
    optimizer's ``global_step``, except under boost: ``FreezeOpt`` deals the list out to
    its per-group copies by the train strategy (entry ``j`` to the copy that runs step
    ``j``), each with its own ``global_step``, so step ``step`` uses entry ``step``; the
    optimizer the user gave never steps."""
    return step if suite == "boost" else global_step


def _boost_dynamic_by_model() -> None:
    """``Model(..., boost_level="O1", loss_scale_manager=DynamicLossScaleManager())``:
    ``amp.build_train_network`` refuses an updating loss scale on the CPU before it
    would build ``BoostTrainOneStepWithLossScaleCell``."""
    from mindspore.amp import DynamicLossScaleManager
    from mindspore.train import Model

    from tests.conformance import harness as h

    net = h.network()
    optimizer = nn.Momentum(net.trainable_params(), h.LR, 0.9)
    manager = DynamicLossScaleManager(h.DYNAMIC_SCALE, h.DYNAMIC_FACTOR, h.DYNAMIC_WINDOW)
    Model(net, h.loss_function(), optimizer, boost_level="O1", loss_scale_manager=manager)


def _boost_dynamic_by_hand() -> None:
    """``BoostTrainOneStepWithLossScaleCell`` made and called by hand in GRAPH_MODE: its
    overflow check (no GPU: the Ascend one) has no CPU kernel."""
    from mindspore.boost import BoostTrainOneStepWithLossScaleCell

    from tests.conformance import harness as h

    net = h.network()
    optimizer = nn.Momentum(net.trainable_params(), h.LR, 0.9)
    scale = nn.DynamicLossScaleUpdateCell(h.DYNAMIC_SCALE, h.DYNAMIC_FACTOR, h.DYNAMIC_WINDOW)
    network = nn.WithLossCell(net, h.loss_function())
    cell = BoostTrainOneStepWithLossScaleCell(network, optimizer, scale)
    x, y = h.batches(1)[0]
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        cell(Tensor(x), Tensor(y))
    finally:
        ms.set_context(mode=mode)


# (suite, scaling) cases that cannot run on this machine: (reason, what fails, a text its
# error contains). test_suite_cells.py checks that each still fails so.
EXCLUDED: dict[str, tuple[str, Any, str]] = {
    "boost-model-dynamic": (
        "amp.build_train_network takes no updating loss scale on the CPU",
        _boost_dynamic_by_model,
        "are supported on device `CPU`",
    ),
    "mindcv-trainer-drop": (
        "MindCV's create_trainer builds no drop_overflow_update=True cell on the CPU "
        "(the matrix's trainer_drop builds it as a device would: fixed_update_cell)",
        _mindcv_trainer_drop,
        "are supported on device `CPU`",
    ),
    "boost-cell-dynamic": (
        "BoostTrainOneStepWithLossScaleCell checks overflow with an NPU-only kernel",
        _boost_dynamic_by_hand,
        "Unsupported op [NPUGetFloatStatusV2] on CPU",
    ),
}
