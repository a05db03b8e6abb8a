import os
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python: the reflex_client package

REPO = os.path.dirname(CLIENTS)
VECTORS = os.path.join(REPO, "protocol", "vectors")
# The fake server is used ONLY for fault injection (no ready line, garbage, slow
# answers, a child that dies); everything else runs against the real server.
FAKE = [sys.executable, os.path.join(CLIENTS, "testdata", "fake_server.py")]


def reflex_argv():
    """The command that starts the real server on stdio ($REFLEX_CMD overrides)."""
    return shlex.split(os.environ.get("REFLEX_CMD", "reflex stdio"))
