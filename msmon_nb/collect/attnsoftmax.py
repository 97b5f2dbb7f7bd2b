"""Attention followed through its softmax (``track_metrics: [..., attention]``): a module
whose logits msmon cannot recompute from its inputs and weights -- rotary position
embeddings, grouped key heads, a causal mask built inside ``construct`` (MindFormers 2.1.0's
``LLamaAttention``, ``LLamaAttentionInterleave``, ChatGLM2's ``CoreAttention``) -- is
recorded from the very tensor it feeds its own softmax.

Found by structure (``softmax_form``): a cell that holds, as its own attributes, a softmax
(a ``Softmax`` primitive or an ``nn.Softmax`` sub-cell) and a batched matmul primitive with
``transpose_b=True`` (the Q K^T), i.e. a cell computing softmax(Q K^T * scale + mask) in its
own ``construct``. A router's softmax over experts holds no such matmul and is not taken.

How, without touching training. On a collected PyNative step the softmax attribute is
shadowed, for that step only, by a per-call wrapper stored in the cell's instance dict
(``SoftmaxCapture``): ``self.softmax(score)`` inside the module's ``construct`` then calls
the wrapper, which copies ``score`` to the host and calls the module's own softmax with the
same argument -- the call the module makes anyway, once, so its output and gradient are the
module's own. At the step's end the instance dict is put back exactly as it was (the
primitive object itself where it stood; nothing where a sub-cell was found through
``Cell.__getattr__``). Why this and not a forward hook: no hook sees the softmax's input --
the logits exist only inside the module's ``construct``, after the rotation, the repeat of
grouped key heads and the mask it builds itself. Why not a hook on an ``nn.Softmax`` sub-cell
either: one mechanism for primitives and cells, and registering a hook leaves state on a
MindSpore cell (``activations._hook_state``); a shadowing attribute leaves none. A step not
collected runs the module untouched; the module is never called again; nothing is written.

The signals, on the scores as given (float64, after the step): ``max_logit`` is the largest
score the masks let through and ``entropy`` the mean over batch, heads and queries of the
entropy (nats) of the softmax rows, as ``metrics.logits`` defines them for a softmax input:
the masks are already added, so a score at or below its ``ADDED_CLOSED`` (-5000) is a masked
position. An additive mask of -10000 (MindFormers' ``LowerTriangularMaskWithDynamic``,
GLM2's ``mask * -10000``), -inf or float-min lands a masked position within a logit's size
of -10000 or below, an open one (mask 0) keeps its logit exactly, so the cut half way gives
``collect.attention``'s semantics (a mask <= -10000 is masked) exactly while logits stay
under 5000 in magnitude; an additive position bias that is not a mask (ALiBi) stays in the
score. A call with no open position gives NaN.

Compiled steps (``@ms.jit``, GRAPH_MODE train cells, ``Model.train`` in graph mode) run no
Python inside the module, so nothing is recorded for these modules there: one warning names
them and says to collect in PyNative (``activations.Activations.compiled_root``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from msmon_nb.collect.tensors import to_numpy
from msmon_nb.metrics.logits import logit_signals

SOFTMAX_CLASSES = ("Softmax",)
MATMUL_CLASSES = ("BatchMatMul", "MatMul")


@dataclass(frozen=True)
class SoftmaxForm:
    """Where one attention module computes its softmax: ``owner.<name>``, a primitive or
    an ``nn.Softmax`` sub-cell, called with the masked, scaled logits."""

    owner: Any  # the cell whose construct calls the softmax
    name: str  # the attribute it calls

    kind = "softmax"


def is_softmax_form(form: Any) -> bool:
    return isinstance(form, SoftmaxForm)


def _softmax_attr(cell: Any) -> str | None:
    """The name of ``cell``'s own softmax attribute (primitive or sub-cell), if any."""
    from mindspore import nn
    from mindspore.ops import Primitive

    for name, value in vars(cell).items():
        if isinstance(value, Primitive) and type(value).__name__ in SOFTMAX_CLASSES:
            return name
    for name, sub in cell.name_cells().items():
        if isinstance(sub, nn.Softmax):
            return name
    return None


def _has_qk_matmul(cell: Any) -> bool:
    """Whether ``cell`` holds a matmul primitive that transposes its second input (Q K^T)."""
    from mindspore.ops import Primitive

    return any(
        isinstance(value, Primitive)
        and type(value).__name__ in MATMUL_CLASSES
        and bool(getattr(value, "transpose_b", False))
        for value in vars(cell).values()
    )


def softmax_form(cell: Any) -> SoftmaxForm | None:
    """``cell``'s softmax site when it computes softmax(Q K^T ...) itself (module doc)."""
    name = _softmax_attr(cell)
    if name is None or not _has_qk_matmul(cell):
        return None
    return SoftmaxForm(cell, name)


def softmax_form_within(cell: Any) -> SoftmaxForm | None:
    """The softmax site of ``cell`` or, failing that, of the one cell under it that has
    one (a named ChatGLM2 ``SelfAttention`` holds its ``CoreAttention``); None when none
    or several."""
    own = softmax_form(cell)
    if own is not None:
        return own
    found = [f for _, c in cell.cells_and_names() if c is not cell for f in [softmax_form(c)] if f]
    return found[0] if len(found) == 1 else None


def softmax_modules(paths: list[tuple[str, Any]]) -> list[tuple[str, Any, SoftmaxForm]]:
    """``[(path, cell, form)]`` of every cell among ``paths`` with a softmax site."""
    out = []
    for path, cell in paths:
        form = softmax_form(cell)
        if form is not None:
            out.append((path, cell, form))
    return out


class SoftmaxCapture:
    """One collected step's shadowing of one module's softmax (module doc). ``keep``
    receives the host copy of the scores of the module's first softmax call in the step;
    ``remove()`` puts the instance dict back as it was and tells ``done`` whether the
    softmax was called."""

    def __init__(
        self,
        form: SoftmaxForm,
        keep: Callable[[np.ndarray], None],
        count: Callable[[], None],
        done: Callable[[bool], None],
    ) -> None:
        self.form = form
        self.done = done
        self.called = False
        self.failed = False  # the copy failed (reported as not called)
        held = vars(form.owner)
        self._had = form.name in held
        self._before = held.get(form.name)
        original = getattr(form.owner, form.name)
        capture = self

        def msmon_softmax(*args: Any, **kwargs: Any) -> Any:
            if not capture.called and not capture.failed and args:
                try:
                    scores = np.array(to_numpy(args[0]))
                except Exception:  # noqa: BLE001 - inside the user's forward pass: it goes on
                    capture.failed = True
                else:
                    capture.called = True
                    count()
                    keep(scores)
            return original(*args, **kwargs)

        # written straight into the instance dict: Cell.__setattr__ would file it
        held[form.name] = msmon_softmax

    def remove(self) -> None:
        held = vars(self.form.owner)
        if self._had:
            held[self.form.name] = self._before
        else:
            held.pop(self.form.name, None)
        self.done(self.called)


def score_signals(scores: np.ndarray) -> dict[str, float]:
    """``{max_logit, entropy}`` of one softmax call's input (last axis: the keys), in
    float64, the masks already added (``metrics.logits``)."""
    return logit_signals(scores.astype(np.float64))
