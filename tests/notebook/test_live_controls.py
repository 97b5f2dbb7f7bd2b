"""Real comm messages sent to a real kernel while a %%msmonitor cell is running."""

import queue
import time

import pytest
from jupyter_client.manager import start_new_kernel

from msmon_nb.events.runs import load_run
from tests.notebook.kernel_code import SETUP

CELL = """%%msmonitor --dir {base} --run live --refresh 0.1
for step in range(2000):
    loss, grads = grad_fn(ms.Tensor(x[:32]), ms.Tensor(y[:32]))
    opt(grads)
    time.sleep(0.02)
"""


class KernelDriver:
    """Reads IOPub, tracks widget models, sends comm messages like a front end."""

    def __init__(self, kc):
        self.kc = kc
        self.models = {}  # comm_id -> state
        self.status_html = ""
        self.reply = None

    def pump(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "comm_open":
                self.models[content["comm_id"]] = dict(content["data"].get("state", {}))
            elif kind == "comm_msg" and content["data"].get("method") == "update":
                state = content["data"].get("state", {})
                self.models.setdefault(content["comm_id"], {}).update(state)
                if "steps/s" in str(state.get("value", "")):
                    self.status_html = state["value"]
        try:
            self.reply = self.kc.get_shell_msg(timeout=0.01)
        except queue.Empty:
            pass

    def find(self, model, description=None):
        for comm_id, state in self.models.items():
            if state.get("_model_name") == model and (
                description is None or state.get("description") == description
            ):
                return comm_id
        raise AssertionError(f"no {model} {description} among {len(self.models)} widgets")

    def send(self, comm_id, data):
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        self.kc.shell_channel.send(msg)

    def step(self):
        text = self.status_html.split("step ", 1)[1].split(" ", 1)[0]
        return int(text) if text.isdigit() else -1

    def wait_for(self, predicate, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump(0.2)
            if predicate():
                return
        raise AssertionError(f"timed out; status: {self.status_html}")


@pytest.fixture
def kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_pause_frequency_and_stop_reach_the_running_cell(kernel, tmp_path):
    reply = kernel.execute_interactive(SETUP, timeout=120)
    assert reply["content"]["status"] == "ok"
    driver = KernelDriver(kernel)
    kernel.execute(CELL.format(base=tmp_path))
    driver.wait_for(lambda: driver.status_html and driver.step() >= 20)

    pause = driver.find("ToggleButtonModel", "Pause")
    driver.send(pause, {"method": "update", "state": {"value": True}, "buffer_paths": []})
    driver.wait_for(lambda: "paused" in driver.status_html)
    held = driver.step()
    driver.pump(1.5)
    assert driver.step() == held, "the loop kept stepping while paused"

    freq = driver.find("BoundedIntTextModel")
    driver.send(freq, {"method": "update", "state": {"value": 7}, "buffer_paths": []})
    driver.wait_for(lambda: "every 7 steps" in driver.status_html)
    driver.send(pause, {"method": "update", "state": {"value": False}, "buffer_paths": []})
    driver.wait_for(lambda: driver.step() >= held + 30)

    stop = driver.find("ButtonModel", "Stop")
    driver.send(stop, {"method": "custom", "content": {"event": "click"}})
    driver.wait_for(lambda: driver.reply is not None, timeout=60)
    assert driver.reply["content"]["status"] == "ok"

    run = load_run(tmp_path / "live")
    assert run.status == "stopped"
    steps = run.scalars("train/loss").steps.tolist()
    assert steps[-1] < 1500, "stop should end the loop long before its 2000 steps"
    assert steps[: held + 1] == list(range(held + 1))  # every step before the change
    after = [s for s in steps if s > held + 1]
    assert after and all(s % 7 == 0 for s in after)
