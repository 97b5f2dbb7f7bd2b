"""What trains beside a monitor and after it closed is what trains in a process that
never imported msmon_nb: bit-identical.

Every case of the matrix splits its plain arm around the monitored one (``harness.
run_case``): a second optimizer instance, compiled and half trained while the monitor
ran, finishing after it closed; and it checks that every class and module attribute is
the original again (``patched``). Here, once per loop shape, that plain arm is compared
with the same training in a fresh interpreter in which ``import msmon_nb`` cannot even
succeed, computed once per session. A patch left in place, a compile cache holding our
wrappers, a Parameter of ours written into the user's graph: any of them that changes a
bit of training shows here, whatever ``patched`` can name.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conformance.harness import Case, run_case
from tests.conftest import run_python

# one case per loop shape, each through the most wrappers that loop has: the amp
# scaler's unscale and the PyNative hooks; a jit step with clipping (optimizer tap, clip
# taps, compile cache); a hand-driven cell with a dynamic scale (the loss-scale taps);
# Model.train with the optimizer's own loss scale
PROBES = {
    "pynative": Case("nn.Adam", "pynative", "list", "static"),
    "jit": Case("nn.Adam", "jit", "list", "clip"),
    "cell": Case("nn.Adam", "cell", "list", "dynamic"),
    "model": Case("nn.Momentum", "model", "schedule", "optscale"),
}

REFERENCE = """
import json, sys
sys.modules["msmon_nb"] = None  # the reference may not import msmon_nb, even by accident
import mindspore as ms
import numpy as np
from tests.conformance.harness import STEPS, Case, Training

out = {}
for loop, fields in json.loads(sys.argv[1]).items():
    case = Case(**fields)
    ms.set_context(mode=ms.GRAPH_MODE if loop in ("cell", "model") else ms.PYNATIVE_MODE)
    training = Training(case, None)
    training.steps(0, STEPS)
    training.finish()
    for name, value in training.arm.state.items():
        out[f"{loop}|{name}"] = value
np.savez(sys.argv[2], **out)
assert not [m for m in sys.modules if m.startswith("msmon_nb") and sys.modules[m]]
"""


@pytest.fixture(scope="session")
def never_imported(tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """{loop: {Parameter: value}} of each probe's plain training in a fresh process."""
    path = tmp_path_factory.mktemp("reference") / "states.npz"
    fields = {loop: vars(case) for loop, case in PROBES.items()}
    run_python(REFERENCE, json.dumps(fields), str(path), timeout=600)
    out: dict[str, dict[str, np.ndarray]] = {loop: {} for loop in PROBES}
    with np.load(path) as saved:
        for key in saved.files:
            loop, name = key.split("|", 1)
            out[loop][name] = saved[key]
    return out


@pytest.mark.parametrize("loop", sorted(PROBES))
def test_beside_and_after_close_is_a_process_without_msmon(loop, tmp_path, never_imported):
    plain, _ = run_case(PROBES[loop], tmp_path)
    reference = never_imported[loop]
    assert plain.state.keys() == reference.keys()
    differ = [k for k in reference if not np.array_equal(plain.state[k], reference[k])]
    assert not differ, f"trained beside and after a monitor, {loop}: {differ} differ"
    assert "msmon_nb" in sys.modules  # (this process did import it)
