"""Synthetic training curves: healthy ones shaped like real runs, and scripted failures.

Healthy shapes follow what real runs show: minibatch loss noise that is multiplicative
and, once the loss is small, heavy-tailed (single batches several times the median);
grad_norm log-normal around a level that drifts (an early rise, then a slow decline);
learning-rate schedules with warmup from 0, cosine or step decay, or constant.
"""

from __future__ import annotations

import math

import numpy as np

Curves = dict[str, tuple[np.ndarray, np.ndarray]]


def decaying_loss(
    steps: np.ndarray, rng: np.random.Generator, start: float = 2.3, floor: float = 0.3
) -> np.ndarray:
    """Power-law decay towards ``floor`` with 15 % multiplicative minibatch noise."""
    level = floor + (start - floor) / (1.0 + steps / 150.0) ** 0.8
    return level * np.exp(rng.normal(0.0, 0.15, steps.size))


def converged_heavy_tail_loss(
    steps: np.ndarray, rng: np.random.Generator, batch: int = 32, p_hard: float = 0.005
) -> np.ndarray:
    """Batch mean of per-sample losses: easy samples ~ Exp(level) with the level falling
    to 0.01, plus rare hard (mislabeled) samples with loss U(0.5, 3). With 0.5 % hard
    samples, 15 % of batches of 32 hold one and sit 3-10x above the median -- the shape
    of a real converged MLP run on separable blobs, where q90 is 2.5x the median."""
    level = 0.01 + 1.1 * np.exp(-steps / 40.0)
    easy = level[:, None] * rng.exponential(1.0, (steps.size, batch))
    hard_mask = rng.random((steps.size, batch)) < p_hard
    hard = np.where(hard_mask, rng.uniform(0.5, 3.0, (steps.size, batch)), 0.0)
    return (easy + hard).mean(axis=1)


def drifting_grad_norm(
    steps: np.ndarray, rng: np.random.Generator, sigma: float = 0.35
) -> np.ndarray:
    """Log-normal grad_norm (``sigma`` in natural-log units) around a level that rises
    3x over the first 10 % of the run, then declines 5x."""
    frac = steps / max(int(steps[-1]), 1)
    level = 0.5 * np.where(frac < 0.1, 1.0 + 20.0 * frac, 3.0 * (1.0 - 0.8 * (frac - 0.1) / 0.9))
    return level * np.exp(rng.normal(0.0, sigma, steps.size))


def warmup_cosine_lr(steps: np.ndarray, peak: float = 1e-3, warmup: int = 200) -> np.ndarray:
    """Linear warmup from 0, then cosine decay to 0 at the last step."""
    total = int(steps[-1])
    warm = peak * steps / warmup
    cos = 0.5 * peak * (1.0 + np.cos(math.pi * (steps - warmup) / max(total - warmup, 1)))
    return np.where(steps < warmup, warm, cos)


def step_decay_lr(steps: np.ndarray, peak: float = 0.1, every: int = 1000) -> np.ndarray:
    """x0.1 every ``every`` steps."""
    return peak * 0.1 ** (steps // every)


def constant_lr(steps: np.ndarray, value: float = 0.05) -> np.ndarray:
    return np.full(steps.size, value)


HEALTHY = ("cosine", "step_decay", "constant", "heavy_tail", "small_batch", "noisy_grads")


def healthy(name: str, seed: int, n: int = 3000, stride: int = 1) -> Curves:
    """One healthy run: tag -> (steps, values); ``stride`` is the collection interval."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n) * stride
    if name == "cosine":
        loss, grad, lr = decaying_loss(steps, rng), drifting_grad_norm(steps, rng), None
        lr = warmup_cosine_lr(steps, warmup=200 * stride)
    elif name == "step_decay":
        loss, grad = decaying_loss(steps, rng, start=4.6, floor=1.2), drifting_grad_norm(steps, rng)
        lr = step_decay_lr(steps, every=1000 * stride)
    elif name == "constant":
        loss, grad = (
            decaying_loss(steps, rng, start=1.1, floor=0.35),
            drifting_grad_norm(steps, rng),
        )
        lr = constant_lr(steps)
    elif name == "heavy_tail":
        loss = converged_heavy_tail_loss(steps, rng)
        grad = drifting_grad_norm(steps, rng, sigma=0.6)
        lr = constant_lr(steps, 0.05)
    elif name == "small_batch":
        loss = converged_heavy_tail_loss(steps, rng, batch=8, p_hard=0.002)
        grad = drifting_grad_norm(steps, rng, sigma=0.6)
        lr = step_decay_lr(steps, every=1000 * stride)
    elif name == "noisy_grads":
        loss = decaying_loss(steps, rng)
        grad = drifting_grad_norm(steps, rng, sigma=0.8)
        lr = warmup_cosine_lr(steps, warmup=50 * stride)
    else:
        raise ValueError(name)
    throughput = 1000.0 * np.exp(rng.normal(0.0, 0.05, n))
    return {
        "train/loss": (steps, loss),
        "train/grad_norm": (steps, grad),
        "train/learning_rate": (steps, lr),
        "train/throughput": (steps, throughput),
        "train/global_step": (steps, steps.astype(float)),
    }
