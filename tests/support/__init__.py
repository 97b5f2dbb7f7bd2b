"""Helpers shared by the tests and the benchmarks (``bench/`` imports them from here):

``tiny``: tiny MindSpore models and data; ``reference``: the unmonitored twin a
third-party trainer is checked against; ``synth``: summary runs written fast, without a
writer; ``events``: record-level helpers; ``curves``: scripted series for the rules;
``jupyter_app``/``kernel_code``: a real JupyterLab page and the code its kernel runs;
``mindinsight``: MindInsight 2.3.1 in a venv of its own; ``envs``: clean environments
for the doctor's subprocesses.
"""
