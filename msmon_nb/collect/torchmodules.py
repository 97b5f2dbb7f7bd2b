"""MindNLP's models as ``collect.activations`` and ``collect.torchattn`` see them: the
module tree of a ``mindtorch`` ``nn.Module`` (the torch API over MindSpore that MindNLP
0.5 runs transformers' models on), and how a collected step finds it.

A MindNLP model is no ``mindspore.nn.Cell``: the watch's ``Cell.__call__`` hook never
sees it, and its modules are listed by ``named_modules()``, not ``cells_and_names()``.
Its paths are the ``named_modules()`` paths, which are its parameters' prefixes
(``bert.encoder.layer.0.attention.self.query`` for ``...query.weight``), so ``act/...``
tags sit beside ``param/...`` ones as they do for Cells.

Finding the network: while a collected step waits for it, one global forward pre-hook of
mindtorch's own (``register_module_forward_pre_hook``) offers every module call to the
watch, which takes the first one made inside the step's forward pass (the outermost
module: pre-hooks run outer first); the hook is removed at once, and it is never
registered on a step that is not collected. The hooks on the selected modules are
mindtorch's public ``register_forward_hook``; ``handle.remove()`` empties the module's
hook dicts again, so a step that is not collected runs ``_call_impl``'s hook-free path,
exactly the code it ran without us.

Nothing here imports mindtorch: it is looked up in ``sys.modules`` (the loop imported
MindNLP), so a MindSpore-only process never pays for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

MODULE = "mindtorch.nn.modules.module"


def module_class() -> type | None:
    """mindtorch's ``nn.Module`` where the process has imported it, else None."""
    cls = getattr(sys.modules.get(MODULE), "Module", None)
    return cls if isinstance(cls, type) else None


def is_module(obj: Any) -> bool:
    """Whether ``obj`` is a mindtorch ``nn.Module`` (a MindNLP model or one of its parts)."""
    cls = module_class()
    return cls is not None and isinstance(obj, cls)


def module_paths(root: Any) -> list[tuple[str, Any]]:
    """``[(path, module)]`` of every module under ``root`` (itself excluded), by
    ``named_modules()`` (each shared module once, at its first path)."""
    return [(path, module) for path, module in root.named_modules() if path]


def own_params(module: Any) -> list[str]:
    """Names of the parameters ``module`` holds itself (not its sub-modules')."""
    held = getattr(module, "_parameters", None) or {}
    return [name for name, param in held.items() if param is not None]


def is_leaf_holder(module: Any) -> bool:
    """Whether ``module`` holds parameters while none of its sub-modules does (a leaf of
    the parameter tree: ``Linear``, ``LayerNorm``, ``Embedding``...)."""
    if not own_params(module):
        return False
    return not any(own_params(sub) for sub in module.modules() if sub is not module)


class RootHook:
    """The global forward pre-hook that offers each module call of a collected step to
    ``offer`` until ``remove`` (see the module doc); registered only where mindtorch is
    imported."""

    def __init__(self, offer: Callable[[Any], None]) -> None:
        self.handle: Any = None
        register = getattr(sys.modules.get(MODULE), "register_module_forward_pre_hook", None)
        if register is None:
            return

        def offer_module(module: Any, args: tuple) -> None:
            offer(module)  # returns None: the module's inputs go on unchanged

        self.handle = register(offer_module)

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
