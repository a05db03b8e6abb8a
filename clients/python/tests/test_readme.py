"""The Python example of clients/README.md runs as written (against the real server)."""
import contextlib
import io
import os
import re

from conftest import CLIENTS, reflex_argv


def test_readme_example():
    with open(os.path.join(CLIENTS, "README.md"), encoding="utf-8") as f:
        code = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    argv = reflex_argv()
    code = code.replace('command="reflex", args=["stdio"]', f"command={argv[0]!r}, args={argv[1:]!r}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and lines[-1].strip() == "Paris", out.getvalue()
