"""Process widget messages while a cell is still running.

The kernel runs a cell on its main thread; shell messages that arrive meanwhile -- a
button click is a ``comm_msg`` -- wait until the cell ends, which is too late for a
pause or stop button. ``jupyter-ui-poll`` solves this for ipykernel 6 by calling
``kernel.do_one_iteration()``; ipykernel 7 has no such method (jupyter-ui-poll 1.1.0
then silently does nothing, we checked): there, a shell-channel thread forwards every
shell message to the main thread through an inproc ZMQ socket pair. ``KernelEventPump``
reads that socket without blocking at each step boundary:

* ``comm_open``/``comm_msg``/``comm_close`` are handled at once by the kernel's own
  handlers, with the message set as parent while its handler runs and the running
  cell's parent restored afterwards, so the cell's output stays in its cell;
* anything else (a queued ``execute_request``, completion requests...) is handed back
  to the kernel's IO loop in arrival order and runs after the cell, as it would have.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

log = logging.getLogger(__name__)

COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})


class KernelEventPump:
    """Handles pending comm messages of an ipykernel 7 kernel; see the module docstring."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        manager = kernel.shell_channel_thread.manager
        self.socket = manager._shell_channel_to_main.to_socket
        self.reply_stream = manager.get_subshell_to_shell_channel_socket(None)
        from tornado.ioloop import IOLoop

        self.io_loop = IOLoop.current()
        self.handled = 0
        self.deferred = 0

    @classmethod
    def for_current_kernel(cls) -> KernelEventPump | None:
        """A pump for the running IPython kernel, or None outside one (or on ipykernel 6)."""
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        shell = get_ipython()
        kernel = getattr(shell, "kernel", None)
        manager = getattr(getattr(kernel, "shell_channel_thread", None), "manager", None)
        if manager is None or not hasattr(manager, "_shell_channel_to_main"):
            return None
        return cls(kernel)

    def _parent(self) -> tuple[Any, Any]:
        kernel = self.kernel
        ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
        return ident, kernel.get_parent("shell")

    def pump(self, limit: int = 100) -> int:
        """Handle up to ``limit`` pending messages; returns how many comm messages ran."""
        import zmq

        kernel = self.kernel
        session = kernel.session
        ran = 0
        saved = None
        # the common case: nothing waiting. Asking the socket's EVENTS keeps the GIL (a
        # poll or a failed recv gives it up and must win it back from MindSpore's threads)
        if not self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return 0
        try:
            for _ in range(limit):
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                idents, body = session.feed_identities(frames, copy=False)
                header = session.deserialize(body, content=False, copy=False)["header"]
                if header.get("msg_type") not in COMM_TYPES:
                    # runs after the cell, in arrival order, exactly as without us
                    self.io_loop.add_callback(partial(kernel.shell_main, None, frames))
                    self.deferred += 1
                    continue
                _, body = session.feed_identities(frames, copy=False)
                msg = session.deserialize(body, content=True, copy=False)
                if saved is None:
                    saved = self._parent()
                kernel.set_parent(idents, msg, channel="shell")
                handler = kernel.shell_handlers.get(msg["header"]["msg_type"])
                if handler is not None:
                    handler(self.reply_stream, idents, msg)
                ran += 1
        finally:
            if saved is not None:
                kernel.set_parent(saved[0], saved[1], channel="shell")
        self.handled += ran
        return ran


class BusyGuard:
    """Keeps the front end showing the kernel busy while a monitored cell runs.

    ipykernel publishes ``status: idle`` after every control-channel request (JupyterLab's
    debugger sends ``debug_request`` s, its widget manager ``create_subshell_request`` s,
    also while a cell runs) and after every request a subshell handles. JupyterLab and
    Notebook 7 show the last status they received, so mid-cell the kernel looked idle.
    While the guard is active, each idle published for a request other than the running
    cell is followed at once by ``busy`` with the cell as parent; the cell's own idle (its
    end) passes untouched. Feature-detected: a kernel without ``_publish_status`` is left
    alone.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.parent = kernel.get_parent("shell")
        self.reasserted = 0
        self._active = False

    @classmethod
    def for_current_kernel(cls) -> BusyGuard | None:
        """A guard for the running IPython kernel, or None outside one."""
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is None or not callable(getattr(kernel, "_publish_status", None)):
            return None
        return cls(kernel)

    def __enter__(self) -> BusyGuard:
        kernel = self.kernel
        original = kernel._publish_status
        cell_id = (self.parent or {}).get("header", {}).get("msg_id")

        def publish_status(status: str, channel: str, parent: Any = None) -> None:
            original(status, channel, parent)
            if status != "idle" or not self._active or not cell_id:
                return
            about = parent or kernel.get_parent(channel) or {}
            if about.get("header", {}).get("msg_id") != cell_id:
                self.reasserted += 1
                original("busy", "shell", self.parent)

        self._active = True
        kernel._publish_status = publish_status
        return self

    def __exit__(self, *exc: object) -> None:
        self._active = False
        # the instance attribute shadowed the method: removing it restores the original
        self.kernel.__dict__.pop("_publish_status", None)
