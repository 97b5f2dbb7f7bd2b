"""``%%msmonitor`` and ``%msmonitor``: a thin IPython shell over Monitor, Watch and Panel.

The cell body runs in the user's namespace, compiled under IPython's own cell file name
with the magic line kept as line 1, so a traceback points at the same line numbers as
without the magic; a failure propagates unchanged (the run is marked interrupted), a
stop from the panel ends the cell quietly (the run is marked stopped).
"""

from __future__ import annotations

import ast
import shlex
import sys
from functools import partial
from typing import Any

from IPython.core import magic_arguments
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from msmon_nb.notebook.session import NotebookSession


@magics_class
class MonitorMagics(Magics):
    """IPython magics of msmon_nb (registered by ``%load_ext msmon_nb``)."""

    def __init__(self, shell: Any, session: NotebookSession) -> None:
        super().__init__(shell)
        self.session = session

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("--dir", default=None, help="summary base dir (default ./summary)")
    @magic_arguments.argument(
        "--run",
        default=None,
        help="run name (default run_<date>_<time>; <model_name>_<date>_<time> when the "
        "--config YAML sets model_name)",
    )
    @magic_arguments.argument("--freq", type=int, default=None, help="collect every N steps")
    @magic_arguments.argument("--config", default=None, help="monitor_config YAML file")
    @magic_arguments.argument(
        "--break-on",
        default=None,
        help="stop in the debugger when this is true, e.g. 'grad_norm > 1e4'",
    )
    @magic_arguments.argument(
        "--no-panel", action="store_true", help="monitor without the live panel"
    )
    @magic_arguments.argument(
        "--refresh", type=float, default=0.4, help="seconds between panel updates (at least)"
    )
    @cell_magic
    def msmonitor(self, line: str, cell: str) -> Any:
        """Monitor the training loop in this cell (unchanged code) with a live panel.

        Works for ``value_and_grad`` + optimizer loops, ``mindspore.jit`` steps (loss, and
        grad_norm when returned) and ``Model.train`` (the callback is added for you).
        ``$var`` in the options is expanded from the notebook's namespace.
        """
        __tracebackhide__ = True  # our frames are hidden from the user's traceback
        args = magic_arguments.parse_argstring(self.msmonitor, line)
        code, last_expr = self._compile(line, cell)
        return self.session.run_cell(
            partial(self._execute, code, last_expr),
            save_dir=args.dir,
            run_name=args.run,
            freq=args.freq,
            config_path=args.config,
            break_on=args.break_on,
            panel=not args.no_panel,
            refresh=args.refresh,
        )

    @line_magic("msmonitor")
    def msmonitor_line(self, line: str) -> Any:
        """``%msmonitor status | attach RUN_DIR`` or a control command: ``stop``, ``pause``,
        ``resume``, ``freq N``, ``snapshot`` (``rundir.control.SPECS``)."""
        words = shlex.split(line)
        if not words:
            print(self.session.status())
            return None
        command, rest = words[0], words[1:]
        return self.session.command(command, rest)

    def _compile(self, line: str, cell: str) -> tuple[Any, Any]:
        """Code objects for the cell body (all but a trailing expression, and that one)."""
        shell = self.shell
        source = shell.transform_cell(cell)
        # line 1 of the notebook cell is the %%msmonitor line: keep numbering identical,
        # and let tracebacks show that line where the user sees it
        filename = shell.compile.cache(f"%%msmonitor {line}\n{source}", self._cell_number())
        tree = ast.parse("\n" + source, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
            last = compile(last, filename, "eval")
        return compile(tree, filename, "exec"), last

    def _cell_number(self) -> int:
        """The In[N] of the cell running this magic (its code file is mapped to N)."""
        known = getattr(self.shell.compile, "_filename_map", {})
        frame = sys._getframe(1)
        while frame is not None:
            number = known.get(frame.f_code.co_filename)
            if number is not None:
                return int(number)
            frame = frame.f_back
        return max(1, self.shell.execution_count - 1)

    def _execute(self, code: Any, last_expr: Any) -> Any:
        __tracebackhide__ = True  # IPython hides this frame in tracebacks
        namespace = self.shell.user_ns
        exec(code, namespace)
        if last_expr is not None:
            return eval(last_expr, namespace)
        return None
