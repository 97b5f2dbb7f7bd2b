"""``msmon view``: a local web viewer over a summary base dir.

``store`` (runs: cheap listing, lazy full loads, tailing), ``downsample`` (min/max per
bucket), ``api`` (the JSON routes docs/guide/viewer.md lists), ``sse`` (server-sent events),
``static`` (the whitelisted page files and plotly.js from its package), ``server``
(HTTP plumbing and ``serve``). Nothing here imports MindSpore, so the viewer starts fast.
"""
