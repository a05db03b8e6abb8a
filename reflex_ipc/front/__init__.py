"""`reflex http`: an OpenAI-compatible HTTP front over the engine's Unix socket.

A separate process (the engine keeps no network socket): engine.py holds the engine and its
FIFO queue, api.py maps the OpenAI request and response shapes onto the protocol's ops, and
app.py is the Starlette application. Starlette and Uvicorn are the `http` extra; only
`reflex http` imports this package.
"""

try:
    import reflex_client  # noqa: F401  (installed with reflex-ipc: pyproject's package list)
except ImportError:  # a source checkout run through PYTHONPATH: the client sits in clients/python
    import os
    import sys

    _here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "clients", "python")
    if not os.path.isdir(os.path.join(_here, "reflex_client")):
        raise
    sys.path.append(_here)
