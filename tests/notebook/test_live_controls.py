"""Real comm messages sent to a real kernel while a %%msmonitor cell is running."""

import queue
import time

import pytest
from jupyter_client.manager import start_new_kernel

from msmon_nb.events.runs import load_run
from tests.support.kernel_code import SETUP

CELL = """%%msmonitor --dir {base} --run live --refresh 0.1
for step in range(2000):
    loss, grads = grad_fn(ms.Tensor(x[:32]), ms.Tensor(y[:32]))
    opt(grads)
    time.sleep(0.02)
"""


class KernelDriver:
    """Reads IOPub, finds the panel's widget, sends its messages like the page does."""

    def __init__(self, kc):
        self.kc = kc
        self.panel = None  # comm id of the panel's widget
        self.status = {}
        self.reply = None
        self.idle_mid_cell = 0

    def pump(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "comm_open" and "_anywidget_id" in content["data"].get("state", {}):
                self.panel = content["comm_id"]
            elif kind == "comm_msg" and content["data"].get("method") == "custom":
                self.status = content["data"]["content"].get("status") or self.status
            elif (
                kind == "status"
                and content["execution_state"] == "idle"
                and msg["parent_header"].get("msg_type") != "execute_request"
            ):
                self.idle_mid_cell += 1
        try:
            self.reply = self.kc.get_shell_msg(timeout=0.01)
        except queue.Empty:
            pass

    def send(self, content):
        data = {"method": "custom", "content": content}
        msg = self.kc.session.msg("comm_msg", {"comm_id": self.panel, "data": data})
        self.kc.shell_channel.send(msg)

    def step(self):
        return self.status.get("step") if self.status.get("step") is not None else -1

    def wait_for(self, predicate, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump(0.2)
            if predicate():
                return
        raise AssertionError(f"timed out; status: {self.status}")


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
    driver.wait_for(lambda: driver.panel and driver.step() >= 20)

    driver.send({"type": "pause"})
    driver.wait_for(lambda: driver.status.get("paused"))
    held = driver.step()
    driver.pump(1.5)
    assert driver.step() == held, "the loop kept stepping while paused"

    driver.send({"type": "freq", "value": 7})
    driver.wait_for(lambda: driver.status.get("freq") == 7)
    driver.send({"type": "resume"})
    driver.wait_for(lambda: driver.step() >= held + 30)

    driver.send({"type": "stop"})
    driver.wait_for(lambda: driver.reply is not None, timeout=60)
    assert driver.reply["content"]["status"] == "ok"
    assert driver.status["state"] == "stopped"
    assert driver.idle_mid_cell == 0, "handling the page's messages published idle"

    run = load_run(tmp_path / "live")
    assert run.status == "stopped"
    steps = run.scalars("train/loss").steps.tolist()
    assert steps[-1] < 1500, "stop should end the loop long before its 2000 steps"
    assert steps[: held + 1] == list(range(held + 1))  # every step before the change
    after = [s for s in steps if s > held + 1]
    assert after and all(s % 7 == 0 for s in after)
