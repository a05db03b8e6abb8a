"""reflex bench: cold-start, warm and decode benchmarks.

    reflex bench cold   [--runs N] [--op generate|system1] [--vs CMD] ...
    reflex bench warm   [--runs N] ...
    reflex bench decode [--tokens N] ...
    reflex bench prefill [--prompt-tokens N] ...  (a warm N-token prompt, no prefix reuse)
    reflex bench all    ...            (cold generate, cold system1, warm, decode)

Cold runs are fresh processes of `reflex generate --max-tokens 1 --json` (or
`reflex system1 --json`), timed by the wall clock from just before spawn to
exit; each child gets $REFLEX_T_LAUNCH so its own phase marks are relative to
the same launch. `--vs CMD` alternates a peer's command (a shell command line,
e.g. llama.cpp's `llama-simple -m M -n 1 -ngl 99 "prompt"`) with ours, run by
run, and reports the ratio pair by pair. Each cold run is also timed to the first byte on
its stdout (reflex's answer; llama-simple flushes its stdout first after the first token);
`--pause S` sleeps between runs (isolated starts), `--drop-caches` drops the page cache
before each run where the host lets root do it. On a GPU, NVML gives energy per cold
start (idle power subtracted) and VRAM in use. Results: one JSON file, plus a
PNG chart when matplotlib is importable.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import time

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_CANDIDATES = (" Paris", " London", " Berlin")


EXAMPLES = """\
  reflex bench cold --runs 10 --device cpu
  reflex bench cold --runs 10 --vs "llama-simple -m M.gguf -n 1 'Hi'" --vs-name llama.cpp
  reflex bench all --out results.json --chart results.png
Exit 1 when a run failed (ours or the --vs peer's), with what failed on stderr."""


def add_arguments(p):
    p.add_argument("mode", choices=["cold", "warm", "decode", "prefill", "all"],
                   help="cold: fresh processes, spawn to exit; warm: requests to one `reflex stdio`; "
                        "decode: tokens/s; prefill: a long prompt; all: cold, warm and decode")
    p.add_argument("--model", metavar="MODEL", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    from ..ops import DEVICES

    p.add_argument("--device", default="auto", choices=DEVICES, help="default: %(default)s")
    p.add_argument("--runs", type=int, default=10, metavar="N", help="cold processes / warm requests (default 10)")
    p.add_argument("--op", default="generate", choices=["generate", "system1"], help="cold: which op")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, metavar="TEXT", help="default: %(default)r")
    p.add_argument("--candidate", action="append", metavar="TEXT", help="system1 candidates (default: 3 cities)")
    p.add_argument("--tokens", type=int, default=128, metavar="N", help="decode: tokens to generate (default 128)")
    p.add_argument("--prompt-tokens", type=int, default=512, metavar="N", help="prefill: prompt length (default 512)")
    p.add_argument("--pause", type=float, default=0.0, metavar="SECONDS", help="cold: seconds of sleep between runs")
    p.add_argument("--idle-w", type=float, metavar="WATTS", help="cold: the GPU's idle power (W) measured before; "
                   "default: measure it (3 s)")
    p.add_argument("--energy-tail", type=float, default=0.0, metavar="SECONDS",
                   help="cold: seconds after exit that the energy window still holds (work left running)")
    p.add_argument("--drop-caches", action="store_true", help="cold: drop the page cache before each run")
    p.add_argument("--vs", metavar="COMMAND", help="cold: a peer's shell command, alternated with ours")
    p.add_argument("--vs-name", default="peer", metavar="NAME", help="the peer's name in the table")
    p.add_argument("--label", default="", metavar="TEXT", help="a free-form label stored in the results")
    p.add_argument("--out", metavar="FILE", help="write the results JSON here")
    p.add_argument("--chart", metavar="FILE", help="write a PNG chart here (needs matplotlib)")


# -- statistics -------------------------------------------------------------------
def stats(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None

    def pct(p):
        k = (len(xs) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"n": len(xs), "p50": round(pct(0.5), 3), "p95": round(pct(0.95), 3),
            "min": round(xs[0], 3), "max": round(xs[-1], 3)}


# -- NVML (optional) ---------------------------------------------------------------
class GPU:
    """NVML handle for energy, power and memory; every method is a no-op without it."""

    def __init__(self):
        self.nv = None
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.h = nv.nvmlDeviceGetHandleByIndex(0)
            self.nv = nv
        except Exception:
            pass

    def info(self):
        if not self.nv:
            return None
        nv = self.nv

        def s(x):
            return x.decode() if isinstance(x, bytes) else x

        return {"name": s(nv.nvmlDeviceGetName(self.h)),
                "driver": s(nv.nvmlSystemGetDriverVersion()),
                "memory_total_mib": nv.nvmlDeviceGetMemoryInfo(self.h).total // 2**20}

    def energy_mj(self):
        try:
            return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) if self.nv else None
        except Exception:
            return None

    def energy_at_tick(self, timeout=0.5):
        """(mJ, perf_counter time) read right after the energy counter moves. NVML's counter
        advances in steps (~100 ms apart on the H200, ~12 J at idle power): a read at a random
        moment is up to one step off, ~75% of one 0.35 s start's energy above idle. Two reads
        taken at steps bound a window whose energy is exact; the time it waited is spent idle
        (subtracted with the idle power). (None, time) without a counter; on a counter that does
        not move within `timeout`, the plain read."""
        e0 = self.energy_mj()
        if e0 is None:
            return None, time.perf_counter()
        end = time.perf_counter() + timeout
        while True:
            e = self.energy_mj()
            t = time.perf_counter()
            if e != e0 or t > end:
                return e, t
            time.sleep(0.0005)

    def counter_steps(self, seconds=1.0):
        """The energy counter's step period (ms) and size (mJ), medians over `seconds`."""
        if not self.nv:
            return None
        ticks = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            e, t = self.energy_at_tick(0.3)
            ticks.append((e, t))
        if len(ticks) < 3:
            return None
        periods = sorted((b[1] - a[1]) * 1e3 for a, b in zip(ticks, ticks[1:]))
        steps = sorted(b[0] - a[0] for a, b in zip(ticks, ticks[1:]))
        return {"period_ms": round(periods[len(periods) // 2], 2), "step_mj": steps[len(steps) // 2],
                "n": len(periods)}

    def idle_power_w(self, seconds=3.0):
        """Idle power from the energy counter between two of its steps `seconds` apart (the
        same counter the runs are measured with, so that the two agree), else the median of
        power samples."""
        if not self.nv:
            return None
        e0, t0 = self.energy_at_tick()
        time.sleep(seconds)
        e1, t1 = self.energy_at_tick()
        if e0 is not None and e1 is not None and e1 > e0:
            return (e1 - e0) / 1000.0 / (t1 - t0)
        samples = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            samples.append(self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0)
            time.sleep(0.05)
        samples.sort()
        return samples[len(samples) // 2]

    def process_mib(self, pid):
        if not self.nv:
            return None
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                if p.pid == pid and p.usedGpuMemory is not None:
                    return p.usedGpuMemory / 2**20
        except Exception:
            pass
        return None

    def used_mib(self):
        return self.nv.nvmlDeviceGetMemoryInfo(self.h).used / 2**20 if self.nv else None


# -- runs ----------------------------------------------------------------------------
def reflex_cmd():
    exe = shutil.which("reflex")
    return [exe] if exe else [sys.executable, "-m", "reflex_ipc"]


def cold_argv(args):
    base = reflex_cmd()
    model = ["--model", args.model] if args.model else []
    if args.op == "system1":
        cands = [c for c in (args.candidate or DEFAULT_CANDIDATES) for c in ("--candidate", c)]
        return base + ["system1", "--json", "--device", args.device, *model, args.prompt, *cands]
    return base + ["generate", "--json", "--max-tokens", "1", "--device", args.device, *model,
                   args.prompt]


def drop_page_cache():
    """Drop the page cache (root, and a host that allows it); True when it was dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def timed_process(argv, shell=False, gpu=None, idle_w=None, tail_s=0.0):
    """Run argv; wall time spawn->exit and spawn->first byte on stdout, NVML energy for both
    (net of idle power when idle_w is given). Returns (record, stdout bytes, stderr text);
    stderr goes to a file, never a pipe that could fill before stdout's first byte.

    Energy to exit is read at counter steps (GPU.energy_at_tick): the spawn follows the step
    before it within a millisecond, and the window closes at the first step at least tail_s
    after exit (a tail that also holds work a process leaves running after it exits, such as
    a detached driver teardown); the window's idle energy (idle_w x its length) is subtracted.
    Energy to the first byte is a plain read at that moment (within one counter step)."""
    import tempfile

    env = dict(os.environ)
    e0, tw0 = gpu.energy_at_tick() if gpu else (None, None)
    t_ns = time.time_ns()
    env["REFLEX_T_LAUNCH"] = str(t_ns)
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, shell=shell, env=env, stdout=subprocess.PIPE, stderr=err)
        fd = proc.stdout.fileno()
        chunks = [os.read(fd, 1 << 16)]
        first = (time.perf_counter() - t0) * 1e3 if chunks[0] else None
        e_first = gpu.energy_mj() if gpu and chunks[0] else None
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 16))
        rc = proc.wait()
        wall = (time.perf_counter() - t0) * 1e3
        if gpu and tail_s:
            time.sleep(tail_s)
        e1, tw1 = gpu.energy_at_tick() if gpu else (None, None)
        proc.stdout.close()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    out = {"wall_ms": round(wall, 3), "rc": rc,
           "first_byte_ms": round(first, 3) if first is not None else None}
    if e0 is not None and e1 is not None:
        joules = (e1 - e0) / 1000.0
        out["energy_j"] = round(joules, 4)
        out["energy_window_ms"] = round((tw1 - tw0) * 1e3, 3)
        if idle_w is not None:
            out["energy_net_j"] = round(joules - idle_w * (tw1 - tw0), 4)
        if e_first is not None:
            out["energy_first_j"] = round((e_first - e0) / 1000.0, 4)
            if idle_w is not None:
                out["energy_first_net_j"] = round(out["energy_first_j"] - idle_w * (first / 1e3 + t0 - tw0), 4)
    if rc != 0:
        out["stderr_tail"] = stderr[-2000:]
    return out, b"".join(chunks), stderr


def parse_llama_simple(stderr):
    """llama-simple's own figures from its stderr: the decode summary line and
    llama_perf_context_print's load / prompt eval / eval times (ms), when present."""
    import re

    out = {}
    m = re.search(r"decoded (\d+) tokens in ([\d.]+) s, speed: ([\d.]+) t/s", stderr)
    if m:
        out.update(decoded=int(m.group(1)), decode_s=float(m.group(2)), speed_tps=float(m.group(3)))
    for key, name in (("load time", "load_ms"), ("prompt eval time", "prompt_eval_ms"), ("eval time", "eval_ms")):
        m = re.search(r"llama_perf_context_print:\s+" + key + r"\s*=\s*([\d.]+) ms(?:\s*/\s*(\d+) (?:tokens|runs))?",
                      stderr)
        if m:
            out[name] = float(m.group(1))
            if m.group(2):
                out[name.replace("_ms", "_n")] = int(m.group(2))
    return out


def spread(xs):
    """{mean, sd, cv} of the non-None xs (cv = sample sd / mean), None under two values."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return {"n": len(xs), "mean": round(mean, 4), "sd": round(sd, 4),
            "cv": round(sd / abs(mean), 4) if mean else None}


def mean_net_energy(runs, idle_w):
    """Energy per run above idle, from the totals over all runs: (sum of the runs' energy -
    idle power x their summed energy windows) / n."""
    ok = [r for r in runs if r.get("rc") == 0 and r.get("energy_j") is not None]
    if not ok or idle_w is None:
        return None
    total = sum(r["energy_j"] for r in ok) - idle_w * sum(r.get("energy_window_ms", r["wall_ms"]) for r in ok) / 1e3
    return round(total / len(ok), 3)


def upload_gbps(timings):
    """The CUDA upload's GB/s of a cold run's timings (all pieces' bytes over their span)."""
    ups = ((timings or {}).get("cuda") or {}).get("upload") or []
    b = sum(u.get("bytes") or 0 for u in ups)
    ms = sum(u.get("upload_ms") or 0 for u in ups)
    return round(b / ms / 1e6, 3) if b and ms else None


def upload_modes(timings):
    """How a cold run's arenas were uploaded: "register", "read" (+ "staging"), joined
    with "+" for several files; None without CUDA upload timings."""
    ups = ((timings or {}).get("cuda") or {}).get("upload") or []
    return "+".join(str(u.get("mode")) for u in ups) or None


def mode_counts(runs):
    """{mode: runs} over runs' "upload_mode"."""
    out = {}
    for r in runs:
        m = r.get("upload_mode")
        if m:
            out[m] = out.get(m, 0) + 1
    return out


def run_cold(args, gpu):
    idle_w = (args.idle_w if args.idle_w is not None else gpu.idle_power_w()) if gpu.nv else None
    argv = cold_argv(args)
    ours, peer, ratios = [], [], []
    dropped = None
    for i in range(args.runs):
        if i and args.pause:
            time.sleep(args.pause)
        if args.drop_caches:
            dropped = drop_page_cache()
        r, stdout, _ = timed_process(argv, gpu=gpu, idle_w=idle_w, tail_s=args.energy_tail)
        try:
            res = json.loads(stdout.decode().strip().splitlines()[-1])
            r["timings"] = res.get("timings")
            r["upload_GB_per_s"] = upload_gbps(r["timings"])
            r["upload_mode"] = upload_modes(r["timings"])
            if args.op == "generate":
                r["text"] = res.get("text")
        except (ValueError, IndexError):
            r["timings"] = None
        ours.append(r)
        if args.vs:
            if args.pause:
                time.sleep(args.pause)
            if args.drop_caches:
                drop_page_cache()
            p, _, err = timed_process(args.vs, shell=True, gpu=gpu, idle_w=idle_w, tail_s=args.energy_tail)
            p["llama_simple"] = parse_llama_simple(err) or None
            peer.append(p)
            if r["rc"] == 0 and p["rc"] == 0:
                ratios.append(p["wall_ms"] / r["wall_ms"])
    phase_names = []
    for r in ours:
        for k in ((r.get("timings") or {}).get("phases") or {}):
            if k not in phase_names:
                phase_names.append(k)

    def energy(runs):
        ok = [r for r in runs if r["rc"] == 0]
        return {"energy_net_j": stats([r.get("energy_net_j") for r in ok]),
                "energy_net_j_mean": mean_net_energy(ok, idle_w),
                "energy_net_j_spread": spread([r.get("energy_net_j") for r in ok]),
                "energy_first_net_j_spread": spread([r.get("energy_first_net_j") for r in ok]),
                "first_byte_ms": stats([r.get("first_byte_ms") for r in ok])}

    result = {
        "mode": "cold", "op": args.op, "runs": args.runs, "argv": argv, "pause_s": args.pause,
        "drop_caches": dropped,
        "idle_power_w": idle_w,
        "energy_counter": gpu.counter_steps() if gpu.nv else None, "energy_tail_s": args.energy_tail,
        "wall_ms": stats([r["wall_ms"] for r in ours if r["rc"] == 0]),
        "failures": sum(r["rc"] != 0 for r in ours),
        "phases_ms": {k: stats([((r.get("timings") or {}).get("phases") or {}).get(k)
                                for r in ours]) for k in phase_names},
        "upload_GB_per_s": stats([r.get("upload_GB_per_s") for r in ours]),
        "upload_modes": mode_counts(ours),
        **energy(ours),
        "per_run": ours,
    }
    if args.vs:
        result["vs"] = {"name": args.vs_name, "command": args.vs,
                        "wall_ms": stats([p["wall_ms"] for p in peer if p["rc"] == 0]),
                        "failures": sum(p["rc"] != 0 for p in peer),
                        **energy(peer),
                        "speedup_pairwise": stats(ratios), "per_run": peer}
    return result


class Server:
    """A `reflex stdio` child for warm and decode runs. Warm figures are taken with the
    weights resident, as llama-bench takes its own after its load: REFLEX_CUDA_STREAM=0
    (unless the caller set it) makes the CUDA upload whole before the first kernel, where
    a streamed MoE file would otherwise still be uploading behind the warm-up and the first
    measured requests (bench/results/issue27-h200-1afa5db: 30B-A3B prefills of 917-2,045
    tok/s while uploading, 7,590 once resident)."""

    def __init__(self, args):
        argv = reflex_cmd() + ["stdio", "--device", args.device]
        if args.model:
            argv += ["--model", args.model]
        env = dict(os.environ, REFLEX_T_LAUNCH=str(time.time_ns()))
        env.setdefault("REFLEX_CUDA_STREAM", "0")
        t0 = time.perf_counter()
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.ready = json.loads(self.p.stdout.readline())
        self.ready_ms = (time.perf_counter() - t0) * 1e3
        self.n = 0

    def request(self, op, **params):
        self.n += 1
        line = json.dumps({"id": self.n, "op": op, **params}).encode() + b"\n"
        t0 = time.perf_counter()
        self.p.stdin.write(line)
        self.p.stdin.flush()
        while True:
            msg = json.loads(self.p.stdout.readline())
            if msg.get("event") == "result":
                msg["_client_ms"] = (time.perf_counter() - t0) * 1e3
                if not msg.get("ok"):
                    raise RuntimeError(f"{op} failed: {msg.get('error')}")
                return msg

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def run_warm(args, gpu):
    s = Server(args)
    try:
        cands = list(args.candidate or DEFAULT_CANDIDATES)
        first = s.request("generate", prompt=args.prompt, max_tokens=1)
        gen = [s.request("generate", prompt=args.prompt, max_tokens=1)["_client_ms"]
               for _ in range(args.runs)]
        sys1 = [s.request("system1", prompt=args.prompt, candidates=cands)["_client_ms"]
                for _ in range(args.runs)]
        # a prompt of a new length every time: no captured graph fits, each pass runs op by op
        words = "one two three four five six seven eight nine ten eleven twelve".split()
        varied = [s.request("system1", prompt=" ".join(words[:i % len(words) + 1]) + " " + args.prompt,
                            candidates=cands)["_client_ms"] for i in range(args.runs)]
        vram = gpu.process_mib(s.p.pid)
    finally:
        s.close()
    return {"mode": "warm", "ready_ms": round(s.ready_ms, 3), "ready": s.ready,
            "first_request_ms": round(first["_client_ms"], 3),
            "first_request_timings": first.get("timings"),
            "generate_1_token_ms": stats(gen), "system1_3_candidates_ms": stats(sys1),
            "system1_3_candidates_new_prompt_each_ms": stats(varied),
            "vram_process_mib": vram}


def run_decode(args, gpu):
    s = Server(args)
    try:
        s.request("generate", prompt=args.prompt, max_tokens=4)  # warm-up
        best = None
        for _ in range(3):
            r = s.request("generate", prompt=args.prompt, max_tokens=args.tokens,
                          stop=[], temperature=0)
            t = r.get("timings") or {}
            n = r.get("completion_tokens") or len(r.get("token_ids") or [])
            dec = t.get("decode")
            tps = (n - 1) / (dec / 1e3) if dec and n > 1 else None
            if tps and (best is None or tps > best["tokens_per_s"]):
                best = {"tokens_per_s": round(tps, 2), "tokens": n, "decode_ms": dec,
                        "prompt_eval_ms": t.get("prompt_eval")}
        vram = gpu.process_mib(s.p.pid)
    finally:
        s.close()
    return {"mode": "decode", "best_of_3": best, "vram_process_mib": vram}


PREFILL_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
                 "they you were her she there been one all we their has would when if so no will more can who out "
                 "up what about into than them its some could time only new these two may first then do any like "
                 "my now over such our man me even most made after also did many off before must well back through "
                 "years much where your way down should because each just those people how too little state good very "
                 "make world still see own men work long here get both between life being under never day same "
                 "another know while last might us great old year come since against go came right used take three").split()


def prefill_prompt(n_words, salt=0):
    """About n_words tokens of English-like text (one Qwen2/GPT-2 token per word mostly), its
    first words changed by salt so that no two prompts share a prefix."""
    w = PREFILL_WORDS
    return " ".join(w[(i * 7 + salt * 13 + (i * i) % 11) % len(w)] if i >= 2 else f"{w[(salt + i * 5) % len(w)]}"
                    for i in range(n_words))


def run_prefill(args, gpu):
    """Warm prompt processing of a prompt of --prompt-tokens tokens (cache_prompt off, a new
    prompt each time): its prompt_eval ms and tokens/s; p50 over --runs after one warm-up."""
    s = Server(args)
    try:
        s.request("generate", prompt=prefill_prompt(args.prompt_tokens, 999), max_tokens=1, cache_prompt=False)
        rows = []
        for i in range(args.runs):
            r = s.request("generate", prompt=prefill_prompt(args.prompt_tokens, i), max_tokens=1,
                          cache_prompt=False)
            t = r.get("timings") or {}
            n = r.get("prompt_tokens")
            pe = t.get("prompt_eval")
            rows.append({"prompt_tokens": n, "prompt_eval_ms": pe, "client_ms": round(r["_client_ms"], 3),
                         "tokens_per_s": round(n / (pe / 1e3), 2) if n and pe else None})
        vram = gpu.process_mib(s.p.pid)
    finally:
        s.close()
    return {"mode": "prefill", "prompt_tokens": stats([r["prompt_tokens"] for r in rows]),
            "prompt_eval_ms": stats([r["prompt_eval_ms"] for r in rows]),
            "tokens_per_s": stats([r["tokens_per_s"] for r in rows]), "per_run": rows,
            "env": {k: v for k, v in os.environ.items() if k.startswith("REFLEX_") and k != "REFLEX_T_LAUNCH"},
            "vram_process_mib": vram}


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), else what platform knows (also bench/*.py's)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(gpu):
    cpu = cpu_model()
    from .. import settings

    commit = settings.get().commit
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        except OSError:
            commit = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "gpu": gpu.info(), "commit": commit or None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def chart(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("bench: matplotlib not importable; no chart\n")
        return False
    bars = []
    for r in results["runs"]:
        if r["mode"] == "cold" and r.get("wall_ms"):
            bars.append((f"reflex cold {r['op']}", r["wall_ms"]["p50"]))
            if r.get("vs") and r["vs"].get("wall_ms"):
                bars.append((f"{r['vs']['name']} cold (paired with {r['op']})",
                             r["vs"]["wall_ms"]["p50"]))
        if r["mode"] == "warm":
            for k in ("generate_1_token_ms", "system1_3_candidates_ms"):
                if r.get(k):
                    bars.append((f"warm {k.split('_ms')[0]}", r[k]["p50"]))
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(bars)))
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color="#3b7dd8")
    for i, (_, v) in enumerate(bars):
        ax.text(v, i, f" {v:.1f} ms", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("p50 ms (lower is better)")
    gpu = (results["machine"].get("gpu") or {}).get("name")
    where = gpu or ("CPU" if results.get("device") == "cpu" else f"device {results.get('device')}")
    ax.set_title(f"reflex-ipc on {where}: {results.get('label') or os.path.basename(results['model'] or '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def rechart(json_path, png_path):
    """Draw the chart of a results file again (e.g. here, from a GPU run's JSON)."""
    with open(json_path) as fh:
        return chart(json.load(fh), png_path)


def run(args):
    from ..modelpath import resolve_model

    if args.model:
        args.model = resolve_model(args.model)
    gpu = GPU()
    out = {"machine": machine_info(gpu), "model": args.model or resolve_model(None),
           "device": args.device, "label": args.label, "runs": []}
    modes = ["cold", "warm", "decode"] if args.mode == "all" else [args.mode]
    for mode in modes:
        if mode == "cold":
            ops = ["generate", "system1"] if args.mode == "all" else [args.op]
            for op in ops:
                args.op = op
                out["runs"].append(run_cold(args, gpu))
        elif mode == "warm":
            out["runs"].append(run_warm(args, gpu))
        elif mode == "prefill":
            out["runs"].append(run_prefill(args, gpu))
        else:
            out["runs"].append(run_decode(args, gpu))
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    if args.chart:
        chart(out, args.chart)
    print(summary_table(out))
    bad = failures(out)
    for line in bad:
        sys.stderr.write(f"reflex bench: {line}\n")
    return 1 if bad else 0


def _num(x, unit="", digits=1):
    """x formatted for the table ("-" when absent), integers without a fraction."""
    if x is None:
        return "-"
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return (f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}") + (f" {unit}" if unit else "")


def _p50(st):
    return (st or {}).get("p50")


def summary_table(out):
    """The results as a plain table: one row per measurement, p50 / p95 where there are
    runs; what was not measured here (energy and VRAM without NVML) is left out."""
    rows = [("measurement", "p50", "p95", "runs", "notes")]

    def row(what, st, unit="ms", notes=""):
        st = st or {}
        rows.append((what, _num(st.get("p50"), unit), _num(st.get("p95"), unit),
                     _num(st.get("n")), notes))

    for r in out["runs"]:
        if r["mode"] == "cold":
            notes = f"{r['failures']} failed" if r["failures"] else ""
            if r.get("energy_net_j_mean") is not None:
                notes += f"{'; ' if notes else ''}{r['energy_net_j_mean']} J a start above idle"
            row(f"cold {r['op']} (spawn to exit)", r.get("wall_ms"), notes=notes)
            row("  first stdout byte", r.get("first_byte_ms"))
            for k, st in r["phases_ms"].items():
                if st:
                    row(f"  phase {k}", st)
            v = r.get("vs")
            if v:
                failed = v["failures"]
                row(f"cold {v['name']} (spawn to exit)", v.get("wall_ms"),
                    notes=f"{failed} of {r['runs']} FAILED" if failed else "")
                sp = v.get("speedup_pairwise")
                ratio = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
                rows.append((f"  {v['name']} / reflex, pair by pair", ratio(_p50(sp)),
                             ratio((sp or {}).get("p95")), _num((sp or {}).get("n")),
                             "" if sp else "no pair where both ran"))
        elif r["mode"] == "warm":
            rows.append(("warm: server ready", _num(r.get("ready_ms"), "ms"), "", "", ""))
            rows.append(("warm: first request", _num(r.get("first_request_ms"), "ms"), "", "", ""))
            row("warm generate 1 token", r.get("generate_1_token_ms"))
            row("warm system1, 3 candidates", r.get("system1_3_candidates_ms"))
            row("  a new prompt each time", r.get("system1_3_candidates_new_prompt_each_ms"))
            if r.get("vram_process_mib") is not None:
                rows.append(("  VRAM of the server", _num(r["vram_process_mib"], "MiB", 0), "", "", ""))
        elif r["mode"] == "prefill":
            n = _p50(r.get("prompt_tokens"))
            row(f"prefill {_num(n)}-token prompt", r.get("prompt_eval_ms"))
            row("  tokens/s", r.get("tokens_per_s"), unit="tok/s")
        else:
            b = r.get("best_of_3") or {}
            rows.append(("decode (best of 3)", _num(b.get("tokens_per_s"), "tok/s"), "", "3",
                         f"{b['tokens']} tokens in {_num(b.get('decode_ms'), 'ms')}" if b else "no run"))
            if r.get("vram_process_mib") is not None:
                rows.append(("  VRAM of the server", _num(r["vram_process_mib"], "MiB", 0), "", "", ""))
    widths = [max(len(str(x[i])) for x in rows) for i in range(5)]
    lines = []
    for i, x in enumerate(rows):
        cells = [str(x[0]).ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(x[1:4], widths[1:4])]
        lines.append(("  ".join(cells) + ("  " + x[4] if x[4] else "")).rstrip())
        if i == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def failures(out) -> list:
    """What failed in the runs, one line each: ours, or the --vs peer's."""
    bad = []
    for r in out["runs"]:
        if r["mode"] != "cold":
            continue
        if r["failures"]:
            bad.append(f"{r['failures']} of {r['runs']} cold reflex runs failed")
        v = r.get("vs")
        if v and v["failures"]:
            codes = sorted({p["rc"] for p in v["per_run"] if p["rc"] != 0})
            tail = next((p.get("stderr_tail") for p in v["per_run"] if p["rc"] != 0), "") or ""
            last = tail.strip().splitlines()[-1:] or ["(nothing on stderr)"]
            bad.append(f"{v['failures']} of {r['runs']} runs of the peer {v['name']!r} failed "
                       f"(exit status {', '.join(map(str, codes))}): {v['command']}; its stderr "
                       f"ended: {last[0]}")
    return bad
