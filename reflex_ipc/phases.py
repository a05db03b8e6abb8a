"""Phase timings from process launch to first token.

`mark(name)` records the time since launch. Launch is the wall-clock time a
benchmark harness passes in $REFLEX_T_LAUNCH (time.time_ns() just before it
spawned us); without it the origin is the moment this module was imported,
which cli.main does first. The CLI puts `snapshot()` in its JSON timings.
"""

import time

_T_IMPORT_WALL = time.time_ns()
_T_IMPORT = time.perf_counter()


def _launch_ns():
    """$REFLEX_T_LAUNCH, read with every other setting now (settings.get: the process's one
    moment); a bad value is reported by the CLI (settings), and the origin is then the import."""
    from . import settings
    from .errors import ReflexError

    try:
        return settings.get().t_launch
    except ReflexError:
        return None


_launch = _launch_ns()
# perf_counter value at launch, from the harness's wall clock
T_LAUNCH = _T_IMPORT - (_T_IMPORT_WALL - _launch) / 1e9 if _launch else _T_IMPORT
HAVE_LAUNCH = T_LAUNCH != _T_IMPORT

_marks: dict = {}
if HAVE_LAUNCH:
    _marks["interpreter_start_to_main"] = round((_T_IMPORT - T_LAUNCH) * 1e3, 3)


def mark(name: str) -> float:
    """Record `name` at now; returns ms since launch."""
    ms = round((time.perf_counter() - T_LAUNCH) * 1e3, 3)
    _marks[name] = ms
    return ms


def since_launch_ms() -> float:
    return (time.perf_counter() - T_LAUNCH) * 1e3


def snapshot() -> dict:
    """Marks so far, in ms since launch (or since main when launch is unknown)."""
    return dict(_marks)
