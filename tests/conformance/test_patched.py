"""Everything a monitor replaces is listed in ``docs/CONFORMANCE.md``, and is the original
again after close.

The list is not written by hand from reading the code: each way in runs here with a
snapshot of MindSpore's classes and modules taken while it is open (``patched``), and
what differs from before is the list (classes that stand for many -- every optimizer
class, every clip cell -- folded into one line). The page must say exactly that. After
close, nothing may differ, and a train cell whose network a skip rule wrapped has its
network back. (Every matrix case checks "nothing differs after close" too.)
"""

from __future__ import annotations

import re
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, Model

from msmon_nb.collect.gradtaps import clip_cells
from msmon_nb.collect.hooks import optimizer_bases
from msmon_nb.monitor import Monitor
from tests.conformance import harness as h
from tests.conformance.patched import leftovers, replaced, snapshot

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFORMANCE.md"
BEGIN, END = "<!-- patched:begin -->", "<!-- patched:end -->"


class _During:
    """Snapshots taken while a monitor is open, at the end of each step."""

    def __init__(self) -> None:
        self.taken: list[dict] = []

    def take(self) -> None:
        self.taken.append(snapshot())


def _function_loop(tmp_path, jit: bool, scaling: str, during: _During, **config) -> None:
    net = h.network()
    optimizer = nn.Adam(net.trainable_params(), h.LR)
    step, _ = h.function_step(net, optimizer, scaling, jit=jit)
    with Monitor(save_dir=str(tmp_path), **config) as mon, mon.watch():
        for x, y in h.batches(3):
            step(Tensor(x), Tensor(y))
            during.take()


def _cell_loop(tmp_path, scaling: str, during: _During, **config) -> nn.Cell:
    net = h.network()
    cell = h.TrainCell(net, nn.Momentum(net.trainable_params(), h.LR, 0.9), scaling)
    with Monitor(save_dir=str(tmp_path), **config) as mon, mon.watch():
        for x, y in h.batches(3):
            cell(Tensor(x), Tensor(y))
            during.take()
    return cell


class _Take(Callback):
    def __init__(self, during: _During) -> None:
        super().__init__()
        self.during = during

    def on_train_step_end(self, run_context):
        self.during.take()


def _model(tmp_path, during: _During, **config) -> None:
    import mindspore.dataset as mds

    net = h.network()
    optimizer = nn.Momentum(net.trainable_params(), h.LR, 0.9)
    data = h.batches(3)
    x = np.concatenate([b[0] for b in data])
    y = np.concatenate([b[1] for b in data])
    dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(h.BATCH)
    model = Model(net, h.loss_function(), optimizer)
    with Monitor(save_dir=str(tmp_path), **config) as mon:
        model.train(1, dataset, callbacks=[mon.callback(), _Take(during)], dataset_sink_mode=False)


SKIP = {"alerts": {"grad_explosion": {"action": "skip", "skip_above": 1e6}}}


def _every_way_in(tmp_path) -> tuple[dict, list[str], list[str]]:
    """Run each way in, with and without a skip rule; (snapshot before, replaced while
    open, left after close)."""
    before = snapshot()
    during = _During()
    mode = ms.get_context("mode")
    try:
        _function_loop(tmp_path / "pynative", False, "static", during)
        _function_loop(tmp_path / "jit", True, "clip", during)
        _function_loop(tmp_path / "jit-skip", True, "dynamic", during, **SKIP)
        ms.set_context(mode=ms.GRAPH_MODE)
        cell = _cell_loop(tmp_path / "cell", "dynamic", during, **SKIP)
        network = cell.network
        _model(tmp_path / "model", during)
        _model(tmp_path / "model-skip", during, **SKIP)
    finally:
        ms.set_context(mode=mode)
    assert cell.network is network, "a skip rule's LossTap left on the train cell"
    while_open = sorted({name for taken in during.taken for name in replaced(before, taken)})
    return before, while_open, leftovers(before, snapshot())


def folded(names: list[str]) -> list[str]:
    """The replaced attributes as the page lists them: every optimizer class (and every
    clip cell) one line, the per-tap name of a kept original in one form."""
    optimizers = {f"{c.__module__}.{c.__qualname__}" for c in _subclasses(optimizer_bases())}
    clips = {f"{c.__module__}.{c.__qualname__}" for c in clip_cells()}
    out = set()
    for name in names:
        owner, attr = name.rsplit(".", 1)
        attr = re.sub(r"^(_msmon_original_\w+?)_[0-9a-f]+$", r"\1_<tap>", attr)
        if owner in optimizers:
            owner = "<every Optimizer class defining it>"
        elif owner in clips:
            owner = "<every clip-by-norm Cell class>"
        out.add(f"{owner}.{attr}")
    return sorted(out)


def _subclasses(roots) -> list[type]:
    out, stack = [], list(roots)
    while stack:
        cls = stack.pop()
        if cls not in out:
            out.append(cls)
            stack.extend(cls.__subclasses__())
    return out


def documented() -> list[str]:
    text = DOC.read_text()
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    return sorted(m.group(1) for m in re.finditer(r"^- `([^`]+)`", block, re.M))


@pytest.fixture(scope="module")
def ways_in(tmp_path_factory):
    return _every_way_in(tmp_path_factory.mktemp("ways"))


def test_every_patch_is_the_original_after_close(ways_in):
    _, while_open, left = ways_in
    assert while_open, "no way in replaced anything: the snapshot sees nothing"
    assert not left, f"not the original after close: {left}"


def test_the_page_lists_exactly_what_is_replaced(ways_in):
    _, while_open, _ = ways_in
    listed, seen = documented(), folded(while_open)
    assert listed == seen, (
        f"docs/CONFORMANCE.md lists {sorted(set(listed) - set(seen))} that nothing "
        f"replaced, and misses {sorted(set(seen) - set(listed))}"
    )
