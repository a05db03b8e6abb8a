"""Where a decode step's time goes on the cpu backend: Python or C (issue 18).

    python3 bench/cpu_budget.py [--model M] [--threads 1] [--tokens 64] [--out FILE]

Measures ms per one-token decode step (after a 16-token prompt) three ways, in one process:
- replay: the step recorded once and replayed by one C call (what generate does);
- eager:  model.forward in Python, every op a ctypes call into the kernels;
- python: the eager step with every kernel call replaced by a no-op, i.e. the Python
          cost alone (model code, op wrappers, ctypes argument conversion).
eager - python is the C time of an eager step; replay is (almost) all C. Prints a JSON
object (and writes it to --out).
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "Write a short story about a dragon who learns to bake bread.\n\nOnce upon a time,"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ["REFLEX_CPU_THREADS"] = str(args.threads)
    sys.path.insert(0, ROOT)
    from reflex_ipc.backends import cpu_ops
    from reflex_ipc.engine import load_runner
    from reflex_ipc.runtime.batch import Batch

    r = load_runner(args.model, device="cpu", n_ctx=1024)
    ops = r.ops
    assert ops.name == "cpu", ops.name
    ids = r.tok.encode(PROMPT)[:16]
    n = args.tokens
    ex = r.exec
    ex.prefill(ids, room=5 * n + 16, reuse=False)
    tid = ids[-1]

    def replay(start):  # executor steps: one captured graph launch each
        for _ in range(n):
            ex.step(tid)

    def eager(start):
        for k in range(n):
            r.model.forward(ex.state, Batch(ops, [tid], [start + k]))

    def timed(fn, start):
        t0 = time.perf_counter()
        fn(start)
        return (time.perf_counter() - t0) / n * 1e3

    p = len(ids)
    replay(p)  # records the graph
    res = {"model": r.path, "threads": ops.threads, "isa": ops.isa, "tokens": n,
           "replay_ms": min(timed(replay, p) for _ in range(3)),
           "eager_ms": min(timed(eager, p) for _ in range(3))}
    real = dict(ops._fns)
    ops._fns = {code: (lambda *a: 0) for code in real}
    try:
        res["python_ms"] = min(timed(eager, p) for _ in range(3))
    finally:
        ops._fns = real
    res["eager_c_ms"] = res["eager_ms"] - res["python_ms"]
    res["python_share_of_eager"] = res["python_ms"] / res["eager_ms"]
    res["replay_tok_s"] = 1e3 / res["replay_ms"]
    res["library"] = cpu_ops.library_path()
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
