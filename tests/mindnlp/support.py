"""MindNLP 0.5.1 on MindSpore 2.7.0 (``.ci/mindnlp_job``'s venv): tiny models built from
configs (no download), the two CPU kernels MindNLP lacks, and the unmonitored twin's
float64 references.

The stand-in (``install_stand_in``), for exactly the two kernels MindNLP 0.5.1's own
training path misses on the CPU and nothing else, installed once per process, so that
the monitored and the unmonitored runs both use it:

* mindtorch's ``addcdiv`` (its AdamW's update, ``param.addcdiv_``): the CPU backend has
  none; the stand-in is ``input + (tensor1 / tensor2) * value`` with the backend's own
  ``add``/``div``/``mul``;
* ``linalg_vector_norm`` with ``dim=None`` (``clip_grad_norm_``'s norm of each
  gradient): the CPU backend passes ``axis=None`` to MindSpore's ``LpNorm``, which
  refuses it; the stand-in flattens the tensor and takes the norm over its one axis.

Dropout is 0 in every config here: mindtorch keeps its dropout's random state in cached
primitives that ``set_seed`` does not reset, so two unmonitored runs in one process
differ with it (checked); bit-identical twins need none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mindnlp  # noqa: F401  (torch -> mindtorch, transformers patched)
import numpy as np
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

VOCAB, SEQ, BATCH = 32, 6, 4
LR, WARMUP = 1e-2, 1


def install_stand_in() -> None:
    """The two missing CPU kernels (module docstring); idempotent."""
    from mindtorch._apis import cpu
    from mindtorch._op_prim.cpu import legacy

    if getattr(cpu, "_msmon_stand_in", False):
        return

    def addcdiv(input, tensor1, tensor2, value=1.0):
        return cpu.add(input, cpu.mul(cpu.div(tensor1, tensor2), value))

    norm = cpu.linalg_vector_norm

    def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
        if dim is None:
            x, dim = legacy.reshape(x, (-1,)), 0
        return norm(x, ord, dim, keepdim, dtype)

    if not hasattr(cpu, "addcdiv"):
        cpu.addcdiv = addcdiv
    cpu.linalg_vector_norm = linalg_vector_norm
    cpu._msmon_stand_in = True


install_stand_in()


def bert_config() -> BertConfig:
    """A one-layer BERT classifier small enough for a CPU test (no dropout: module
    docstring)."""
    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=SEQ,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def bert(seed: int = 0) -> Any:
    set_seed(seed)
    return BertForSequenceClassification(bert_config())


class Tokens(torch.utils.data.Dataset):
    """Random token ids and labels, the same for every seed-0 instance."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.integers(0, VOCAB, size=(n, SEQ))
        self.y = rng.integers(0, 2, size=n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": torch.tensor(self.x[i]), "labels": torch.tensor(int(self.y[i]))}

    def batch(self, i: int) -> dict[str, Any]:
        """The ``i``-th batch of ``BATCH`` rows, in order (a hand loop's)."""
        rows = slice(i * BATCH, (i + 1) * BATCH)
        return {"input_ids": torch.tensor(self.x[rows]), "labels": torch.tensor(self.y[rows])}


def trainer(accumulate: int, clip: float, updates: int, out_dir: str) -> Any:
    """transformers' Trainer on the tiny BERT: AdamW (mindtorch's), a linear schedule
    with one warmup step, ``max_grad_norm=clip`` (0: no clipping), a log every update."""
    model = bert()
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulate,
        max_steps=updates,
        learning_rate=LR,
        lr_scheduler_type="linear",
        warmup_steps=WARMUP,
        max_grad_norm=clip,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
        log_level="error",
    )
    return Trainer(model=model, args=args, train_dataset=Tokens())


def sq64(grads: list[Any]) -> float:
    """The sum of squares of ``grads`` in float64."""
    return sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)


def grads_of(params: list[Any]) -> list[Any]:
    return [p.grad for p in params if p.grad is not None]


@dataclass
class Reference:
    """What the unmonitored twin saw at each update, in float64 where it is a norm."""

    loss: list[float] = field(default_factory=list)  # the sum of its micro-batch losses
    grad_norm: list[float] = field(default_factory=list)  # accumulated, before clipping
    clipped: list[float] = field(default_factory=list)  # what step() received
    micro: list[float] = field(default_factory=list)  # the largest micro-batch norm
    lr: list[float] = field(default_factory=list)  # param_groups[0]["lr"] at step()
    _losses: list[float] = field(default_factory=list)
    _micro: list[float] = field(default_factory=list)
    _before: np.ndarray | None = None  # the accumulated gradient so far, per tensor
    _pre_clip: float | None = None

    def micro_batch(self, loss: float, params: list[Any]) -> None:
        """After a micro-batch's backward: its loss, and its own gradient's norm (the
        accumulated ``.grad`` minus what the earlier micro-batches left in it)."""
        self._losses.append(loss)
        now = [g.asnumpy().astype(np.float64) for g in grads_of(params)]
        own = now if self._before is None else [a - b for a, b in zip(now, self._before)]  # noqa: B905
        self._micro.append(math.sqrt(sum(float((g**2).sum()) for g in own)))
        self._before = now

    def before_clip(self, params: list[Any]) -> None:
        self._pre_clip = math.sqrt(sq64(grads_of(params)))

    def update(self, optimizer: Any, params: list[Any]) -> None:
        """Right before ``step()``: the update's values; the next update starts."""
        received = math.sqrt(sq64(grads_of(params)))
        self.grad_norm.append(self._pre_clip if self._pre_clip is not None else received)
        self.clipped.append(received)
        self.loss.append(sum(self._losses))
        self.micro.append(max(self._micro))
        self.lr.append(float(optimizer.param_groups[0]["lr"]))
        self._losses, self._micro, self._before, self._pre_clip = [], [], None, None


class _Observe(TrainerCallback):
    def __init__(self, ref: Reference, trainer: Any) -> None:
        self.ref, self.trainer = ref, trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.ref.update(self.trainer.optimizer, list(self.trainer.model.parameters()))


def observe(trainer: Any) -> Reference:
    """The twin's references, read (never written) around the Trainer's own calls: each
    ``training_step``'s loss and gradient, the gradient before ``clip_grad_norm_``, and
    what ``step()`` receives (``on_pre_optimizer_step``)."""
    ref = Reference()
    params = list(trainer.model.parameters())
    step: Callable = trainer.training_step
    clip: Callable = trainer.accelerator.clip_grad_norm_

    def training_step(*args, **kwargs):
        loss = step(*args, **kwargs)
        ref.micro_batch(float(loss.asnumpy()), params)
        return loss

    def clip_grad_norm_(*args, **kwargs):
        ref.before_clip(params)
        return clip(*args, **kwargs)

    trainer.training_step = training_step
    trainer.accelerator.clip_grad_norm_ = clip_grad_norm_
    trainer.add_callback(_Observe(ref, trainer))
    return ref


def state(model: Any, optimizer: Any) -> dict[str, np.ndarray]:
    """Every weight, and AdamW's state (``exp_avg``, ``exp_avg_sq``, ``step``) of each
    parameter, as numpy copies keyed by parameter name."""
    out = {f"w/{n}": p.asnumpy().copy() for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    assert optimizer.state, "the optimizer has no state: it never stepped"
    for param, values in optimizer.state.items():
        for key, value in values.items():
            array = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
            out[f"{key}/{names[id(param)]}"] = np.array(array, copy=True)
    return out


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Bit-identical: the same keys, dtypes, shapes and bytes."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), f"{key} differs"
    kinds = {key.split("/", 1)[0] for key in a}
    assert {"w", "exp_avg", "exp_avg_sq", "step"} <= kinds, kinds
