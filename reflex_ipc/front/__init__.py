"""`reflex http` (an OpenAI- and Anthropic-compatible HTTP front over the engine's Unix socket)
and `reflex mcp` (mcp_server.py: a Model Context Protocol server over the in-process engine,
reflex_ipc.Model).

A separate process (the engine keeps no network socket): engine.py holds the engine and its
FIFO queue, api.py maps the OpenAI request and response shapes onto the protocol's ops
(anthropic.py Anthropic's Messages API, responses.py OpenAI's Responses API, classify.py
/v1/classify; textstream.py splits a turn into reasoning, content and tool calls as it
streams), and app.py is the Starlette application. Starlette and Uvicorn are the `http`
extra, the mcp package the `mcp` extra; only `reflex http` and `reflex mcp` import this
package.
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
