"""The start rule: on a CUDA host with `--device auto`, whether a request that comes before the
GPU is ready runs on the cpu backend, waits for the GPU, or starts on the CPU and moves to the
GPU mid-generation (a race).

It compares three estimates of the time until the answer is complete, in ms from now:

    cpu  = [host load] + cpu load + first pass overhead + pass(P) + (T - 1) * step
    gpu  = max(GPU ready + build, host load) + upload(W) + gpu_first(P) + (T - 1) * gpu_step(W)
    race = the CPU's tokens until the GPU is ready, the hand-over, the rest on the GPU

with W the weight bytes a forward pass reads and E their weight count (elements), P the prompt
tokens to evaluate (system1: the prompt and every candidate token, one pass), T the tokens to
generate (times n choices), and picks the smallest (ties within 1% go to the GPU, then to the
CPU over the race). Nothing here imports numpy: the CLI asks `early()` before any model work,
to know whether to bring CUDA up at all.

The constants and where they come from (ARCHITECTURE.md, "Starting on the CPU"; bench/README.md):

* CPU, on `threads` threads of kernel set `isa` (bench/startrule_calibrate.py on the development
  machine, AMD EPYC with AVX-512 VNNI, one thread, process CPU time so that its load average
  of 13-22 did not count; bench/results/startrule-cpu-*.json):
      pass(P) = max(W / CPU_BW_HOST, E * (CPU_NS_FIRST + (P - 1) * CPU_NS_MORE) * isa / threads)
      step    = pass(1) + CPU_STEP_MS                       (a replayed decode graph)
  CPU_NS_FIRST: a one-token pass costs 0.053-0.064 ns per weight (0.6B Q8_0 / Q4_K, SmolLM2
  Q4_1); CPU_NS_MORE: each more token of a batch 0.022-0.034 ns (weight blocks are unpacked
  once per two rows); avx2 1.01-1.13x, the portable C 4.9-13.6x. The first pass also maps the
  file's pages (0.07-0.31 ns per byte; prefault.py maps them on a thread meanwhile) and, in a
  cold process, costs CPU_FIRST_MS more: the H200 host's `--device cpu` probe (issue 28: first
  token 62-89 ms after the tokenizer for the 0.6B Q8_0 shape on 16 threads, where this model
  gives ~17 ms: thread pool start, workers woken per op, the eager pass's Python). The host's
  memory bandwidth cap is assumed (a GPU server's sockets).
* GPU, from the committed H200 figures (bench/results/final-h200-0039d18/cold19,
  scale-h200-508a1a0: 7 cold runs, 0.6B to 32B): the CUDA init thread's backend is ready
  GPU_INIT_MS after it starts (p50; GPU_AFTER_CUINIT_MS after cuInit returns,
  GPU_AFTER_CONTEXT_MS after the primary context), the weights upload at GPU_UPLOAD_GBPS from
  the page cache, the first (eager) forward costs GPU_FIRST_MS plus GPU_PREFILL_MS_PER_GB per
  token and GB, a decode step GPU_STEP_MS + GPU_STEP_MS_PER_GB per GB (a fit to 893 tok/s at
  0.43 GB and 74.8 tok/s at 21.6 GB, Qwen3-shaped Q4_K).
"""

from __future__ import annotations

import os

CHOICES = ("cpu", "gpu", "race")

# -- the CPU side (bench/startrule_calibrate.py; the H200 probe for CPU_FIRST_MS) -----------
CPU_NS_FIRST = 0.058  # ns per weight, a one-token pass, one thread (AVX-512 VNNI / AVX2)
CPU_NS_MORE = 0.028  # ns per weight for each more token of a batch, one thread
CPU_ISA_FACTOR = {"avx512vnni": 1.0, "avx2": 1.1, "generic": 10.0}
CPU_BW_HOST = 60.0e9  # bytes/s all threads together stream at most (assumed, conservative)
CPU_FAULT_NS_PER_BYTE = 0.15  # the first pass: mapping the page-cache pages (one thread)
CPU_FAULT_THREADS = 4  # threads whose page faults overlap well (assumed)
CPU_FIRST_MS = 45.0  # a cold process's first pass beyond the model above (the H200 probe)
CPU_LOAD_MS = 6.0  # CpuOps + the model's weight handles (4-6 ms measured)
CPU_STEP_MS = 0.3  # per decode step besides the weights (attention, sampling, Python)
HOST_LOAD_MS = 137.0  # the CLI's arguments parsed -> tokenizer loaded (numpy, GGUF, vocabulary):
#                       the H200 host's `--device cpu` phase marks (issue 28's probe)
ELEMS_PER_BYTE_EARLY = 1.78  # before the GGUF is parsed: weights per file byte as for Q4_K (an
#                              upper bound for the usual formats: more work for the CPU, never less)

# -- the GPU side (the committed H200 figures) ----------------------------------------------
GPU_INIT_MS = 290.0  # CUDA init thread start -> backend ready (p50 of 7 cold runs: 224-344)
GPU_AFTER_CUINIT_MS = 135.0  # cuInit returned -> backend ready (113-153)
GPU_AFTER_CONTEXT_MS = 14.0  # primary context made -> backend ready (fatbin, pycuda; 10-16)
GPU_PYCUDA_MS = 100.0  # the pycuda side started late (auto: once the engine wants the GPU, numpy
#                        already imported) -> backend ready: pycuda's import, its context, the fatbin.
#                        H200 (bench/results/cpufirst-h200-74b83be): a GPU pick made after the
#                        tokenizer had its first token 178 ms later, 110-120 more than the other terms
GPU_AFTER_PYCUDA_MS = 8.0  # pycuda imported -> backend ready, the context being there (module load)
GPU_BUILD_MS = 6.0  # CudaOps + the model's device handles (backend_ready -> weights_loaded)
GPU_UPLOAD_GBPS = 15.0  # registered mapping -> device, from the page cache (p50 15.3 GB/s)
GPU_FIRST_MS = 10.0  # the first forward: eager launches, kernels loaded on first use
GPU_PREFILL_MS_PER_GB = 0.05  # per prompt token and GB of weights (512-token prefills)
GPU_STEP_MS = 0.87  # decode step: fixed part
GPU_STEP_MS_PER_GB = 0.579  # decode step: per GB of weights
GPU_SWITCH_MS = 12.0  # the hand-over: state to the GPU, the first step's graph capture
RACE_MARGIN = 0.9  # a race must beat waiting for the GPU by 10%: its costs beside the model
#                    (the GIL shared with the CUDA start-up, cores shared with the upload)
STATE_GBPS = 5.0  # the moved state's bytes through the host (snapshot, pageable upload)

_host = None


def host():
    """{"cores": physical cores this process may use, "isa": the kernel set} (read once;
    /sys and /proc only, no numpy)."""
    global _host
    if _host is None:
        _host = {"cores": physical_cores(), "isa": cpu_isa()}
    return _host


def physical_cores():
    """Cores this process may run on, counting SMT siblings once (Linux sysfs; else the CPU
    count)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as fh:
                cores.add(fh.read().strip())
        except OSError:
            cores.add(str(c))
    return max(1, len(cores))


def cpu_isa():
    """The kernel set the C backend will pick: "avx512vnni", "avx2" or "generic" (from the
    first flags line of /proc/cpuinfo and $REFLEX_CPU_ISA)."""
    from . import settings

    try:
        forced = settings.get().cpu_isa
    except Exception:  # a bad setting is reported elsewhere
        forced = "auto"
    if forced in ("generic", "avx2"):
        return forced
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    words = set(flags.split())
    if "avx512_vnni" in words and "avx512bw" in words:
        return "avx512vnni"
    if "avx2" in words and "fma" in words:
        return "avx2"
    return "generic"


# -- estimates -------------------------------------------------------------------------------
def cpu_pass_ms(weight_bytes, elems, tokens, threads, isa):
    """One forward pass of `tokens` tokens on the cpu backend (pages mapped, a warm process)."""
    f = CPU_ISA_FACTOR.get(isa, CPU_ISA_FACTOR["generic"])
    compute = elems * (CPU_NS_FIRST + max(0, tokens - 1) * CPU_NS_MORE) * f / max(1, threads) / 1e6
    return max(weight_bytes / CPU_BW_HOST * 1e3, compute)


def cpu_first_touch_ms(weight_bytes, threads):
    return weight_bytes * CPU_FAULT_NS_PER_BYTE / max(1, min(threads, CPU_FAULT_THREADS)) / 1e6


def gpu_step_ms(weight_bytes):
    return GPU_STEP_MS + GPU_STEP_MS_PER_GB * weight_bytes / 1e9


def gpu_first_ms(weight_bytes, tokens):
    return GPU_FIRST_MS + GPU_PREFILL_MS_PER_GB * tokens * weight_bytes / 1e9


def upload_ms(weight_bytes):
    return weight_bytes / (GPU_UPLOAD_GBPS * 1e9) * 1e3


class Request:
    """What the rule knows of a request: prompt tokens to evaluate, tokens to generate (all
    choices), and whether it is one pass (system1, embed: no hand-over inside it)."""

    __slots__ = ("op", "prompt_tokens", "gen_tokens", "one_pass", "state_bytes")

    def __init__(self, op, prompt_tokens, gen_tokens=0, one_pass=False, state_bytes=0):
        self.op, self.prompt_tokens, self.gen_tokens = op, int(prompt_tokens), int(gen_tokens)
        self.one_pass, self.state_bytes = bool(one_pass), int(state_bytes)


def estimate(weight_bytes, req, *, gpu_in_ms, elems=None, cpu_mapped=False, cpu_loaded=True, threads=None,
             isa=None, gpu_ready=False, host_in_ms=0.0):
    """{"cpu", "gpu", "race"} ms from now until the answer is complete.

    gpu_in_ms: ms from now until the GPU backend is ready (before its weights are uploaded);
    gpu_ready: the GPU already holds the weights. elems: the weights' count (default: as many
    as Q4_K packs in weight_bytes). cpu_mapped: the CPU has run a pass in this process (pages
    mapped, pool warm); cpu_loaded: the cpu model exists (else CPU_LOAD_MS more). host_in_ms:
    what both wait for first (the GGUF parse and the tokenizer, when asked before them)."""
    h = host()
    threads = threads or h["cores"]
    isa = isa or h["isa"]
    W = float(weight_bytes)
    E = float(elems) if elems else W * ELEMS_PER_BYTE_EARLY
    P, T = max(1, req.prompt_tokens), max(0, req.gen_tokens)
    step_c = cpu_pass_ms(W, E, 1, threads, isa) + CPU_STEP_MS
    first_c = host_in_ms + (0.0 if cpu_loaded else CPU_LOAD_MS) \
        + (0.0 if cpu_mapped else CPU_FIRST_MS + cpu_first_touch_ms(W, threads)) \
        + cpu_pass_ms(W, E, P, threads, isa)
    cpu = first_c + max(0, T - 1) * step_c
    g_ready = 0.0 if gpu_ready else max(max(0.0, gpu_in_ms) + GPU_BUILD_MS, host_in_ms) + upload_ms(W)
    step_g = gpu_step_ms(W)
    gpu = g_ready + gpu_first_ms(W, P) + max(0, T - 1) * step_g
    if req.one_pass or T <= 1:
        race = cpu  # nothing to move mid-way: the CPU does it all
    elif first_c >= g_ready:
        # the GPU is ready before the CPU's prompt pass ends: the hand-over comes after it
        race = first_c + GPU_SWITCH_MS + (T - 1) * step_g
    else:
        done = 1 + int((g_ready - first_c) / step_c)  # tokens the CPU has by then
        if done >= T:
            race = cpu
        else:
            moved = req.state_bytes + (P + done) * _state_bytes_per_token(W)
            race = first_c + done * step_c + GPU_SWITCH_MS + moved / (STATE_GBPS * 1e9) * 1e3 \
                + (T - done) * step_g
            race = max(race, g_ready + GPU_SWITCH_MS + (T - done) * step_g)
    return {"cpu": round(cpu, 2), "gpu": round(gpu, 2), "race": round(race, 2)}


def _state_bytes_per_token(weight_bytes):
    """A rough K/V size per token for a dense transformer of this size (float16, GQA): about
    weight_bytes / 5500 (Qwen3-0.6B: 114 KB per token for 0.63 GB of Q8_0 weights)."""
    return weight_bytes / 5500.0


def pick(est, allowed=CHOICES):
    """The choice of smallest estimate: ties (within 1%) to the GPU, then the CPU; a race only
    when it beats the GPU by RACE_MARGIN."""
    order = {"gpu": 0, "cpu": 1, "race": 2}
    cand = [c for c in allowed if c != "race" or "gpu" not in allowed or est["race"] <= RACE_MARGIN * est["gpu"]]
    best = min(est[c] for c in cand)
    tied = [c for c in cand if est[c] <= best * 1.01 + 0.5]
    return min(tied, key=order.get)


def gpu_in_ms(now_ms, progress):
    """ms from now until the CUDA backend is ready, from the init thread's milestones so far
    (progress: {"cuda_thread_start_at", "cuinit_at", "context_at", "init_thread_end_at"} in ms
    since launch, those reached) or, when CUDA has not started, as if it started now."""
    p = progress or {}
    if p.get("init_thread_end_at") is not None:
        return 0.0
    if p.get("context_at") is not None:
        drv = max(0.0, p["context_at"] + GPU_AFTER_CONTEXT_MS - now_ms)
    elif p.get("cuinit_at") is not None:
        drv = max(0.0, p["cuinit_at"] + GPU_AFTER_CUINIT_MS - now_ms)
    else:
        start = p.get("cuda_thread_start_at")
        drv = max(0.0, (start if start is not None else now_ms) + GPU_INIT_MS - now_ms)
    if p.get("cuda_thread_start_at") is None or p.get("pycuda_imported_at") is not None:
        return drv  # nothing started (GPU_INIT_MS counts it all), or only the module load is left
    # the driver's thread runs; the pycuda side (import, context, fatbin) has its own time, from
    # when it started, or from now when it has not (auto defers it until the GPU is wanted)
    started = p.get("pycuda_start_at")
    py = (started if started is not None else now_ms) + GPU_PYCUDA_MS
    return max(drv, py - now_ms, 0.0)


def decide(weight_bytes, req, *, mode="auto", now_ms=0.0, progress=None, gpu_ready=False, **kw):
    """{"choice", "est_ms": {cpu, gpu, race}, "mode", "gpu_in_ms", "inputs"}. mode: REFLEX_START
    (auto: the smallest estimate; cpu, gpu, race: forced, estimates recorded all the same)."""
    g_in = 0.0 if gpu_ready else gpu_in_ms(now_ms, progress)
    est = estimate(weight_bytes, req, gpu_in_ms=g_in, gpu_ready=gpu_ready, **kw)
    allowed = ("cpu", "gpu") if (req.one_pass or req.gen_tokens <= 1) else CHOICES
    if mode in CHOICES:
        choice = mode if mode in allowed else "cpu"  # race of one pass: the CPU does it
    else:
        choice = pick(est, allowed)
    h = host()
    return {"choice": choice, "mode": mode, "est_ms": est, "gpu_in_ms": round(g_in, 2),
            "inputs": {"op": req.op, "weight_bytes": int(weight_bytes), "weight_elems": kw.get("elems"),
                       "prompt_tokens": req.prompt_tokens,
                       "gen_tokens": req.gen_tokens, "threads": kw.get("threads") or h["cores"],
                       "isa": kw.get("isa") or h["isa"]}}


# -- before anything is loaded (the CLI) -------------------------------------------------------
def text_tokens_upper(nbytes):
    """At least as many tokens as a text of nbytes UTF-8 bytes can have with a BPE vocabulary
    (about 4 bytes a token in English; one per 2 bytes bounds almost any text)."""
    return nbytes // 2 + 1


def early(path, op, *, prompt_bytes, gen_tokens=0, candidate_bytes=0, chat=False, n=1, mode="auto",
          now_ms=0.0, progress=None):
    """The choice before the GGUF is parsed (what the CLI needs to know to bring CUDA up or not):
    the file's size stands for the weight bytes, the prompt's bytes bound its tokens from
    above (so a long prompt is never taken for a short one). Returns decide()'s dict."""
    try:
        W = os.path.getsize(path)
    except OSError:
        W = 0
    P = text_tokens_upper(prompt_bytes) + (64 if chat else 0) + text_tokens_upper(candidate_bytes)
    one = op in ("system1", "embed")
    req = Request(op, P, 0 if one else gen_tokens * max(1, n), one_pass=one)
    return decide(W, req, mode=mode, now_ms=now_ms, progress=progress, cpu_mapped=False, cpu_loaded=False,
                  host_in_ms=HOST_LOAD_MS)


# -- the crossover, for the documentation (python -m reflex_ipc.startrule --table) -------------
SHAPES = {"0.6B Q8_0": (0.633e9, 0.596e9), "0.6B Q4_K": (0.406e9, 0.596e9), "4B Q4_K": (2.72e9, 4.02e9),
          "8B Q4_K": (5.44e9, 8.19e9), "14B Q4_K": (9.76e9, 14.8e9), "32B Q4_K": (21.6e9, 32.8e9)}


def crossover(cores=16, isa="avx512vnni", now_ms=180.0, cuda_start_ms=25.0):
    """Per shape: the choice for a 1-token generate and system1, the most tokens the CPU
    still generates alone, and the longest prompt it still takes for one token, on a host of
    `cores` cores deciding `now_ms` after spawn (the CLI's decision after its tokenizer)."""
    global _host
    saved = _host
    _host = {"cores": cores, "isa": isa}
    try:
        rows = []
        prog = {"cuda_thread_start_at": cuda_start_ms}
        for name, (W, E) in SHAPES.items():
            def choice(P, T, one=False):
                return decide(W, Request("x", P, T, one_pass=one), elems=E, now_ms=now_ms, progress=prog)["choice"]

            T = 1
            while T < 4096 and choice(6, T + 1) == "cpu":
                T += 1
            P = 1
            while P < 8192 and choice(P * 2, 1) == "cpu":
                P *= 2
            d = decide(W, Request("x", 6, 1), elems=E, now_ms=now_ms, progress=prog)
            rows.append({"shape": name, "gen1": d["choice"], "gen1_est_ms": d["est_ms"],
                         "system1_x3": choice(9, 0, True), "cpu_max_tokens": T if choice(6, 1) == "cpu" else 0,
                         "cpu_max_prompt_tokens": P if choice(1, 1) == "cpu" else 0,
                         "gen32": choice(6, 32)})
        return rows
    finally:
        _host = saved


if __name__ == "__main__":
    import json
    import sys

    cores = int(sys.argv[sys.argv.index("--cores") + 1]) if "--cores" in sys.argv else 16
    for row in crossover(cores):
        print(json.dumps(row))
