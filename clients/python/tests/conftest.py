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


def uds_argv(path):
    """The command that starts the real server on a Unix socket: $REFLEX_CMD
    with its `stdio` replaced by `uds PATH`."""
    argv = reflex_argv()
    i = len(argv) - 1 - argv[::-1].index("stdio") if "stdio" in argv else len(argv)
    return argv[:i] + ["uds", str(path)] + argv[i + 1:]
