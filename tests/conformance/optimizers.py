"""Every optimizer a user can pick, found by introspection, and how the matrix builds it.

Found: every ``Optimizer`` subclass that ``mindspore.nn``, ``mindspore.mint.optim`` and
``mindspore.experimental.optim`` export, every name that MindCV 0.3.0's and mindone
0.5.0's ``create_optimizer`` compare their ``opt``/``name`` argument with (read from
the factory's source, so a name added in a release shows up here), and every other
``Optimizer`` subclass the packages define, found by walking ``__subclasses__()`` after
importing each of their modules (``walked``): a class no module exports
(``experimental.optim.adamw.SpeedAdamW``) or only a factory builds (``nn.thor``'s), named
by its module path. ``BUILD`` says how
to make each (as its own users make it); ``EXCLUDED`` says why one is not trained here.
``test_optimizers.py`` fails on a found optimizer that is in neither, on an entry of
either that is no longer found, and on an exclusion that stopped being true.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# lr forms each family accepts: nn.Optimizer takes a float, a list, a LearningRateSchedule
# and per-group lrs; the experimental/mint optimizers take a float per group, which
# their users change through lr schedulers (our "parameter" form: the lr Parameter
# changed between steps)
NN_FORMS = ("float", "list", "schedule", "group", "parameter")
FLOAT_FORMS = ("float", "parameter")


@dataclass(frozen=True)
class Spec:
    """How to make one optimizer: ``build(params, lr)`` (lr as the form gives it), the
    lr forms it accepts, and its family (which API its lr and state follow)."""

    build: Callable[..., Any]  # build(params, lr, loss_scale=1.0)
    forms: tuple[str, ...] = NN_FORMS
    family: str = "nn"  # nn | experimental
    # False where its update does nothing in PyNative (test_optimizers checks it still does)
    pynative: bool = True
    loss_scale: bool = False  # takes loss_scale= (and undoes it, or says it does)
    mindcv: bool = False  # built by MindCV's create_optimizer (its trainer's cases)


def _nn(name: str, **kw: Any) -> Spec:
    def build(params, lr, loss_scale=1.0):
        import mindspore.nn as nn

        scale = {"loss_scale": loss_scale} if loss_scale != 1.0 else {}
        return getattr(nn, name)(params, learning_rate=lr, **kw, **scale)

    return Spec(build, loss_scale=_takes(name, "loss_scale"))


def _takes(name: str, argument: str) -> bool:
    """Whether ``mindspore.nn.<name>.__init__`` has ``argument``: read from the class's
    source (MindSpore's ``opt_init_args_register`` hides the signature)."""
    import mindspore.nn as nn

    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(nn, name))))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return argument in [a.arg for a in node.args.args + node.args.kwonlyargs]
    return False


def _exp(module: str, name: str) -> Spec:
    def build(params, lr, loss_scale=1.0):
        return getattr(importlib.import_module(module), name)(params, lr=lr)

    # mint.optim's in-place updates leave the weights as they were when run op by op on
    # the CPU (MindSpore 2.10): there is no training to compare in a PyNative loop
    return Spec(build, FLOAT_FORMS, "experimental", pynative=not module.endswith("mint.optim"))


# the suites' factories take a parameter list (they group it themselves), so no group lr
SUITE_FORMS = ("float", "list", "schedule", "parameter")


def _mindcv(name: str) -> Spec:
    def build(params, lr, loss_scale=1.0):
        from mindcv.optim import create_optimizer

        return create_optimizer(params, opt=name, lr=lr, weight_decay=1e-4, loss_scale=loss_scale)

    # every name takes the factory's loss_scale but lamb (it asserts 1.0; lamb is excluded)
    return Spec(build, SUITE_FORMS, loss_scale=True, mindcv=True)


def _mindone(name: str, **kw: Any) -> Spec:
    # mindone's factory takes no loss_scale: its wrapper (a train cell) undoes the scale
    def build(params, lr, loss_scale=1.0):
        from mindone.trainers.optim import create_optimizer

        return create_optimizer(params, name=name, lr=lr, **kw)

    return Spec(build, SUITE_FORMS)


def _tft(params, lr):
    import mindspore.nn as nn

    return nn.OptTFTWrapper(nn.Momentum(params, lr, 0.9))


def _lars(params, lr):
    import mindspore.nn as nn

    return nn.LARS(nn.Momentum(params, lr, 0.9))


EXPERIMENTAL = (
    "ASGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop",
    "Rprop", "SGD",
)  # fmt: skip
MINDCV = (
    "sgd", "momentum", "nesterov", "adam", "adamw", "lion", "nadam", "adan", "rmsprop",
    "adagrad",
)  # fmt: skip

BUILD: dict[str, Spec] = {
    "nn.ASGD": _nn("ASGD"),
    # AdaFactor rejects group lrs (its MultitypeFuncGraph has no overload for them)
    "nn.AdaFactor": Spec(
        _nn("AdaFactor", scale_parameter=False, relative_step=False, warmup_init=False).build,
        ("float", "list", "schedule", "parameter"),
        loss_scale=_takes("AdaFactor", "loss_scale"),
    ),
    "nn.AdaMax": _nn("AdaMax"),
    "nn.Adadelta": _nn("Adadelta"),
    "nn.Adagrad": _nn("Adagrad"),
    "nn.Adam": _nn("Adam"),
    "nn.AdamOffload": _nn("AdamOffload"),
    "nn.AdamWeightDecay": _nn("AdamWeightDecay", weight_decay=0.01),
    # FTRL: a constant lr only
    "nn.FTRL": Spec(
        _nn("FTRL").build, ("float", "parameter"), loss_scale=_takes("FTRL", "loss_scale")
    ),
    "nn.LazyAdam": _nn("LazyAdam"),
    "nn.Momentum": _nn("Momentum", momentum=0.9),
    "nn.ProximalAdagrad": _nn("ProximalAdagrad"),
    "nn.RMSProp": _nn("RMSProp"),
    "nn.Rprop": _nn("Rprop"),
    "nn.SGD": _nn("SGD"),
    "mint.optim.Adam": _exp("mindspore.mint.optim", "Adam"),
    "mint.optim.SGD": _exp("mindspore.mint.optim", "SGD"),
    **{f"experimental.optim.{n}": _exp("mindspore.experimental.optim", n) for n in EXPERIMENTAL},
    **{f"mindcv:{n}": _mindcv(n) for n in MINDCV},
    "mindone:adam": _mindone("adam"),
    "mindone:adamw": _mindone("adamw"),
    "mindone:adamw_re": _mindone("adamw_re"),
    "mindone:sgd": _mindone("sgd"),
    "mindone:momentum": _mindone("momentum"),
    # CAME takes three betas and two eps (its own defaults), not the factory's defaults
    "mindone:came": _mindone("came", betas=[0.9, 0.999, 0.9999], eps=(1e-30, 1e-16)),
}


def _speed_adamw(params, lr):
    from mindspore.experimental.optim.adamw import SpeedAdamW

    return SpeedAdamW(params, lr=lr)


def _thor(kind: str) -> Callable[..., Any]:
    """``nn.thor``'s classes take the network (they precondition its layers' inputs), not
    a parameter list: ``net``, the network ``params`` belong to. ``nn.thor`` (the factory
    users call: it converts the network's layers first, and picks ``ThorGpu`` off Ascend)
    for ``ThorGpu``; the class itself for ``ThorAscend``, which it picks on Ascend only."""

    def build(params, lr, net=None):
        import numpy as np
        from mindspore import Tensor, nn

        # the module (``mindspore.nn.optim.thor`` the attribute is its factory function)
        thor = importlib.import_module("mindspore.nn.optim.thor")
        make = nn.thor if kind == "ThorGpu" else getattr(thor, kind)
        rates = Tensor(np.full(8, lr, np.float32))
        optimizer = make(net, rates, Tensor(np.full(8, 0.9, np.float32)), 0.9)
        assert type(optimizer).__name__ == kind
        return optimizer

    build.takes_net = True
    return build


def _muon(params, lr):
    from mindone.trainers.muon import Muon

    # its QK-clip needs attention projections by name; without it, Muon for the matrices
    matrices = [p for p in params if len(p.shape) == 2]
    rest = [p for p in params if len(p.shape) != 2]
    return Muon(lr=lr, clip_value=None, muon_params=matrices, adamw_params=rest)


# why a found optimizer is not trained by the matrix: (reason, build, a text its error on
# this machine contains). test_optimizers.py checks that each still fails so.
EXCLUDED: dict[str, tuple[str, Callable[[list, Any], Any], str]] = {
    "nn.LARS": ("no CPU kernel for LARSUpdate", _lars, "Unsupported op [LARSUpdate] on CPU"),
    "nn.Lamb": ("no CPU kernel for Lamb", _nn("Lamb").build, "Unsupported op [Lamb] on CPU"),
    "nn.OptTFTWrapper": (
        "Ascend's training fault tolerance wrapper, not an optimizer: needs MindIO TFT",
        _tft,
        "MindIO TFT",
    ),
    "mint.optim.AdamW": (
        "no CPU kernel for AdamW",
        _exp("mindspore.mint.optim", "AdamW").build,
        "The kernel AdamW unregistered",
    ),
    "mint.optim.FusedAdamW": (
        "its in-place copy kernel fails on CPU",
        _exp("mindspore.mint.optim", "FusedAdamW").build,
        "For 'InplaceCopy, an unexpected kernel has been launched",
    ),
    "mindcv:lamb": ("nn.Lamb: no CPU kernel", _mindcv("lamb").build, "Unsupported op [Lamb]"),
    "mindone:adamw_bf16": (
        "bfloat16 AdamW: no CPU kernel",
        _mindone("adamw_bf16").build,
        "Unsupported op [AdamW]",
    ),
    "mindone:adamw_mint": (
        "mint's AdamW: no CPU kernel",
        _mindone("adamw_mint").build,
        "The kernel ZerosLikeExt unregistered",
    ),
    "mindone:adamw_mf": (
        "named only where the factory passes keywords; its selection rejects it",
        _mindone("adamw_mf").build,
        "invalid optimizer",
    ),
    # found by walking subclasses only: no module exports them
    "experimental.optim.adamw.SpeedAdamW": (
        "no CPU kernel for ApplyAdamW (in GRAPH_MODE it runs and leaves the weights as they were)",
        _speed_adamw,
        "Unsupported op [ApplyAdamW] on CPU",
    ),
    "nn.optim.thor.ThorGpu": (
        "THOR (nn.thor's choice off Ascend): no CPU kernel for CholeskyTrsm",
        _thor("ThorGpu"),
        "Unsupported op [CholeskyTrsm] on CPU",
    ),
    "nn.optim.thor.ThorAscend": (
        "THOR for Ascend: its kernels are built with the Ascend toolkit's te package",
        _thor("ThorAscend"),
        "No module named 'te'",
    ),
    "mindone.trainers.muon.Muon": (
        "no CPU kernel for TExt (mint's transpose in its Newton-Schulz iteration)",
        _muon,
        "Unsupported op [TExt] on CPU",
    ),
}

# packages whose every module is imported before the walk: a class that no module
# exports is a subclass only once its module is loaded
WALKED = (
    "mindspore.nn.optim", "mindspore.experimental.optim", "mindspore.mint.optim",
    "mindcv.optim", "mindone.trainers",
)  # fmt: skip
# modules of those packages that do not import here, and why (test_optimizers checks it)
UNIMPORTABLE = {"mindone.trainers.zero": "needs transformers (not a dependency we install)"}
# classes only a factory builds, by the name it builds them under: the factory's module
# holds the class (test_optimizers checks it), and the name is trained or excluded
BUILT_BY = {
    "mindcv.optim.adamw.AdamW": "mindcv:adamw",
    "mindcv.optim.adan.Adan": "mindcv:adan",
    "mindcv.optim.lion.Lion": "mindcv:lion",
    "mindcv.optim.nadam.NAdam": "mindcv:nadam",
    "mindone.trainers.came.CAME": "mindone:came",
    "mindone.trainers.adamw_bf16.BF16AdamW": "mindone:adamw_bf16",
    "mindone.trainers.adamw_mint.AdamW": "mindone:adamw_mint",
}


def found() -> list[str]:
    """Every optimizer the installed packages offer, as ``source.Name`` or ``suite:name``."""
    names: list[str] = []
    import mindspore.nn as nn
    from mindspore.experimental import optim as experimental

    for module, base, prefix in (
        (nn, nn.Optimizer, "nn"),
        (importlib.import_module("mindspore.mint.optim"), experimental.Optimizer, "mint.optim"),
        (experimental, experimental.Optimizer, "experimental.optim"),
    ):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, base) and value is not base:
                names.append(f"{prefix}.{name}")
    from mindcv.optim import create_optimizer as mindcv_factory
    from mindone.trainers.optim import create_optimizer as mindone_factory

    names += [f"mindcv:{n}" for n in compared_names(mindcv_factory, "opt")]
    names += [f"mindone:{n}" for n in compared_names(mindone_factory, "name")]
    exported = set(exports())
    for path, cls in walked().items():
        if cls not in exported and path not in BUILT_BY:
            names.append(path)
    return sorted(set(names))


def exports() -> list[type]:
    import mindspore.nn as nn
    from mindspore.experimental import optim as experimental

    modules = (nn, importlib.import_module("mindspore.mint.optim"), experimental)
    return [v for m in modules for v in vars(m).values() if isinstance(v, type)]


def walked() -> dict[str, type]:
    """Every subclass of ``nn.Optimizer`` and of the experimental API's ``Optimizer`` once
    every module of ``WALKED`` is imported, by its module path (``mindspore.`` left off)
    and name; the two bases themselves left out, and so are the classes of this test
    suite (``tests.``: the optimizers other tests define, loaded when they ran first in
    the same process)."""
    import mindspore.nn as nn
    from mindspore.experimental import optim as experimental

    import_all()
    roots = (nn.Optimizer, experimental.Optimizer)
    out: dict[str, type] = {}
    stack = [c for root in roots for c in root.__subclasses__()]
    while stack:
        cls = stack.pop()
        path = f"{cls.__module__}.{cls.__qualname__}".removeprefix("mindspore.")
        if path not in out and cls not in roots:
            stack.extend(cls.__subclasses__())
            if not cls.__module__.startswith("tests."):
                out[path] = cls
    return out


def import_all() -> dict[str, str]:
    """Import every module of the ``WALKED`` packages; {module: error} of those that fail."""
    failed: dict[str, str] = {}
    for package in WALKED:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            try:
                importlib.import_module(info.name)
            except Exception as error:  # noqa: BLE001 -- any failure: not importable here
                failed[info.name] = f"{type(error).__name__}: {error}"
    return failed


def compared_names(function: Callable, argument: str) -> list[str]:
    """The strings ``function`` compares ``argument`` with (``arg == "x"``,
    ``arg.lower() in ["x", "y"]``, after ``arg = arg.lower()``): the names it accepts."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    out: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not _is_argument(node.left, argument):
            continue
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, ast.Eq | ast.In):
                out.update(_strings(right))
    return sorted(out)


def _is_argument(node: ast.AST, argument: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id == argument
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "lower"
        and _is_argument(node.func.value, argument)
    )


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [s for item in node.elts for s in _strings(item)]
    return []
