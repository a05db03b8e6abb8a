"""Every REFLEX_* environment variable, declared once, read at one moment, typed and checked.

`get()` reads them all the first time it is called (`phases`, the first module the CLI
imports, calls it; so does anything that needs a value, in a process that did not start
from the CLI) and returns the same `Settings` afterwards: `settings.get().fuse`,
`.cpu_threads`, ... (the variable's name without REFLEX_, in lower case). A value that is
not one the table allows is one `ReflexError("invalid_request", ...)` naming the variable,
the value and what is allowed; the CLI reports it before doing anything else (exit 2).

Adding a switch is one line of TABLE (name, kind, default, scope, purpose); README.md's
table of variables is written from it (`python -m reflex_ipc.settings --markdown`, checked
by tests/test_settings.py), and the test fails when code reads a REFLEX_ variable that is not
here. Kinds: "flag" (0 or 1), a tuple of allowed words, "count" (a whole number >= 1), "int",
"text", "path". An empty value counts as unset. Scope says what reads it: "build" variables
are read by the kernel builds (kernels/build.py, kernels/cpu/build.py, which run before the
package exists) and only listed here; "harness" ones by the tests, scripts and benchmarks.

Code that changes the environment of its own process after start-up (a benchmark sweeping
a value) calls `reload()` (or `reset()`: read again at the next `get()`; tests/conftest.py's
monkeypatch does it for REFLEX_ variables); `override(**values)` sets values for a block of
code (gpu-check's fused-vs-plain comparisons).
"""

import os

# (name, kind, default, scope, purpose). Keep the purpose one sentence: it is README's cell.
TABLE = (
    # engine and CLI
    ("REFLEX_MODEL", "text", None, "engine",
     "The default model: a GGUF path or alias (unset: `smollm2`)."),
    ("REFLEX_CACHE", "path", None, "engine",
     "Reflex's cache folder (models/, tokenizer/, prefix/; unset: reflex-ipc/ in "
     "`$XDG_CACHE_HOME`, else `~/.cache/reflex-ipc`)."),
    ("REFLEX_TOKENIZER_CACHE", "flag", True, "engine",
     "Keep each vocabulary's hashed index in the cache folder (0: build it in every process)."),
    ("REFLEX_LORA", ("merge", "runtime"), None, "engine",
     "How LoRA adapters apply: merged into float weights, or added at run time (unset: merge on "
     "numpy, runtime on cpu and cuda)."),
    ("REFLEX_DETACH", "flag", None, "cli",
     "Run one-shot commands in a detached child so the CUDA driver's teardown happens after the "
     "caller has its answer (unset: when pycuda is installed); 0 also writes the prefix cache "
     "before exiting instead of in a child forked after the answer."),
    ("REFLEX_PREFIX_CACHE", "flag", True, "engine",
     "The prefix cache: prompts' saved states shared by the machine's reflex processes, read "
     "instead of evaluating a prompt's start and written after the answer (0: off; one request: "
     "`prefix_cache: false`, `--no-prefix-cache`)."),
    ("REFLEX_PREFIX_CACHE_DIR", "path", None, "engine",
     "The prefix cache's folder (unset: prefix/ in the cache folder)."),
    ("REFLEX_PREFIX_CACHE_MAX", "text", "4G", "engine",
     "The prefix cache's size cap in bytes, or with K, M, G, T (powers of 1024); the least "
     "recently used files go first."),
    ("REFLEX_PREFIX_CACHE_BLOCK", "count", 256, "engine",
     "Tokens per prefix-cache block (at least 16; prompts under half a block are not cached)."),
    ("REFLEX_PREFIX_CACHE_SHARE", "flag", False, "engine",
     "A backend also reads the prefix-cache segments other backends saved (within float16 "
     "rounding of its own answer)."),
    ("REFLEX_T_LAUNCH", "int", None, "cli",
     "Set by benchmark harnesses (`reflex bench`): the spawn time (time.time_ns()), origin of "
     "the phase marks."),
    ("REFLEX_START", ("auto", "cpu", "gpu", "race"), "auto", "engine",
     "With `--device auto` on a CUDA host, where a request that comes before the GPU is ready "
     "runs: `cpu` on the cpu backend, `gpu` waits for the GPU, `race` starts on the cpu backend and "
     "moves a generation to the GPU once it is ready, `auto` picks by the measured rule "
     "(reflex_ipc/startrule.py)."),
    ("REFLEX_API_KEY", "text", None, "http",
     "`reflex http`'s bearer key when `--api-key` is not given (unset: no key)."),
    # the cpu backend
    ("REFLEX_CPU_THREADS", "count", None, "cpu, numpy",
     "Threads of the cpu backend (unset: the physical cores) and BLAS threads of the numpy "
     "backend (unset: 1)."),
    ("REFLEX_CPU_ISA", ("auto", "generic", "avx2", "neon", "dotprod"), "auto", "cpu",
     "The cpu backend's kernel set: `generic` forces the portable C, `avx2` the AVX2 kernels "
     "without AVX-512 VNNI, `neon` / `dotprod` the aarch64 kernels without dotprod / i8mm "
     "(tests compare them)."),
    ("REFLEX_CPU_GRAPH", "flag", True, "cpu",
     "The cpu backend replays recorded decode steps and small passes in one C call (0: every "
     "op called from Python). The cpu backend only."),
    # the cuda backend
    ("REFLEX_CUDA_GRAPH", "flag", True, "cuda",
     "Captured CUDA graphs: the decode step and small prefill / system1 passes replayed (0: "
     "eager launches). The cuda backend only."),
    ("REFLEX_CUDA_UPLOAD", ("auto", "register", "read", "staging"), "auto", "cuda",
     "How weights reach the GPU: `register` page-locks the file mapping, `read` preads the file "
     "in parallel into pinned buffers, `staging` copies through pinned buffers; `auto` reads "
     "when under 90% of sampled pages are cached, else registers (scripts/gpu/gpu-coldcache "
     "compares them)."),
    ("REFLEX_CUDA_UPLOAD_THREADS", "count", None, "cuda",
     "Threads of the `register` upload (pieces of the mapping; unset: 4) or of `read` (unset: 8)."),
    ("REFLEX_CUDA_UPLOAD_CHUNK_MB", "count", 16, "cuda",
     "MiB per pread of the `read` upload."),
    ("REFLEX_CUDA_STREAM", "flag", True, "cuda",
     "The `read` upload streams: reads in the forward pass's order, each kernel launched once "
     "the tensors it reads are on the device, a MoE layer's routed experts read first; `auto` "
     "also streams MoE files from the page cache (0: the whole file in file order, the first "
     "kernel waiting for all of it)."),
    ("REFLEX_CUDA_UPLOAD_DIRECT", "flag", False, "cuda",
     "The `read` upload uses O_DIRECT, leaving the file out of the page cache (cold-cache "
     "measurements)."),
    ("REFLEX_STATE_PINNED", "flag", None, "cuda",
     "State imports (kv_import, the prefix store) go through one page-locked buffer instead of "
     "pageable memory: 1 always, 0 never; unset: while a weight upload streams (MoE files, "
     "files read from disk: its copies hold the copy engine, which pageable copies wait behind "
     "piece by piece)."),
    ("REFLEX_CUDA_MOE", ("device", "host"), "device", "cuda",
     "Where mixture-of-experts layers are routed; `host` (logits to the host, no graph "
     "capture) is the fallback for routings beyond the routing kernel's shared memory."),
    ("REFLEX_FUSE", "flag", True, "cuda",
     "Fused decode kernels (norm+matvec, rope+K/V store, one-launch split attention, split-K "
     "matvecs); 0 runs each fused op as its plain ops (gpu-check and the kernel-count tests "
     "compare both)."),
    ("REFLEX_MMA", "flag", True, "cuda",
     "Prefill matmuls of 64+ tokens on the tensor-core kernels, inputs rounded to float16 (0: "
     "the float32 kernels; an accuracy fallback, and scripts/gpu/gpu-prefill's A/B)."),
    ("REFLEX_MOE_MMA", "flag", True, "cuda",
     "Mixture-of-experts layers of 32+ tokens as tensor-core GEMMs over the tokens grouped by "
     "expert, inputs rounded to float16 (0: one matvec per token and expert; an accuracy "
     "fallback and gpu-bigmodel's A/B)."),
    ("REFLEX_MOE_SKIP", "flag", True, "cuda",
     "The grouped MoE GEMMs leave out the multiplies of a tile's tokens past its expert's rows "
     "(0: every tile multiplies all 64; the same bits either way, scripts/gpu/gpu-moetile's A/B)."),
    ("REFLEX_MMA_WIDE", "flag", True, "cuda",
     "The tensor-core GEMMs (dense and grouped MoE) read Q4_K / Q5_K / Q6_K weights with wide "
     "loads (0: deq8's byte loads; the same bits either way, scripts/gpu/gpu-moetile's A/B)."),
    ("REFLEX_MLA_FLASH", "flag", True, "cuda",
     "Latent attention (deepseek2) of 128+ queries with keys and values decompressed per head "
     "and the flash kernel (0: the absorbed form, as decode runs it; an accuracy fallback and "
     "gpu-bigmodel's A/B)."),
    ("REFLEX_FLASH", "flag", True, "cuda",
     "Attention of 16+ queries on the tensor-core flash kernel, q and the softmax weights "
     "rounded to float16 (0: the float32 kernel; an accuracy fallback)."),
    ("REFLEX_MATVEC", ("new", "old"), "new", "cuda",
     "One-token matvecs on kernels/matvec.cuh, and few-token MoE experts on kernels/moe_mv.cuh "
     "(`old`: the kernels before them; kept for scripts/gpu/gpu-matvec --decode's and gpu-moedec's A/B)."),
    ("REFLEX_PROFILE", "flag", False, "cuda",
     "CUDA events around every launch inside a profiling window (scripts/gpu/gpu-breakdown's "
     "per-kernel times)."),
    ("REFLEX_TEARDOWN", ("wait", "now"), "wait", "cuda",
     "`now`: a detached child tears its CUDA context down at once instead of first waiting (up "
     "to ~1 s) while another reflex process creates its context."),
    # kernel builds (read by kernels/build.py and kernels/cpu/build.py, listed here)
    ("REFLEX_BUILD_CUDA", "flag", None, "build",
     "Build the CUDA fatbin: 1 always, 0 never (unset: when nvcc and an NVIDIA driver are "
     "present)."),
    ("REFLEX_CUDA_ARCHS", "text", None, "build",
     "The fatbin's targets, e.g. `90` or `80,86,90` (unset: every supported one)."),
    ("REFLEX_CPU_BUILD", ("warn", "strict"), "warn", "build",
     "`strict`: a failed build of the CPU kernels is an error (CI) instead of a warning."),
    # tests, scripts and benchmarks
    ("REFLEX_REQUIRE_NVCC", "flag", False, "harness",
     "tests/test_kernels_build.py fails instead of skipping when nvcc is missing."),
    ("REFLEX_FUZZ", ("short", "long"), "short", "harness",
     "tests/test_fuzz.py's mode."),
    ("REFLEX_FUZZ_SEED", "int", 12, "harness",
     "tests/test_fuzz.py's seed."),
    ("REFLEX_PARITY_DEVICES", "text", "numpy,cpu", "harness",
     "The backends tests/arch/test_goldens.py compares with llama.cpp, comma-separated."),
    ("REFLEX_CMD", "text", None, "harness",
     "The command the client suites (clients/*/tests) start as the real server (unset: "
     "`reflex stdio`)."),
    ("REFLEX_COMMIT", "text", None, "harness",
     "The commit benchmark results record."),
    ("REFLEX_BREAKDOWN_DEVICE", ("cuda", "cpu", "numpy"), "cuda", "harness",
     "scripts/gpu/gpu-breakdown's device."),
    ("REFLEX_SYNTH_DIR", "path", "/tmp/reflex-synth", "harness",
     "Where gpu-check writes its synthetic models."),
    ("REFLEX_SYNTH_TOKENIZER", "path", None, "harness",
     "The GGUF whose tokenizer gpu-check's synthetic models take (unset: "
     "tests/data/synthetic-llama.gguf)."),
)

# Switches that were only for A/B runs whose winner is now the default: no longer read
# (a process that sets one gets one warning).
RETIRED = {
    "REFLEX_MM_SPLIT_ROWS": "one-token matvecs of at most 16384 rows always run a block per row",
    "REFLEX_MATVEC_VARIANT": "matvec.cuh's variant is always cuda_ops.mv_pick's",
    "REFLEX_MMNT": "matmuls of 2-63 tokens always run kernels/matvec_nt.cuh",
    "REFLEX_CHUNKED": "recurrent prefill of 128+ tokens a sequence always runs kernels/chunked.cuh; "
                      "gpu-check times both forms",
}


def _attr(name):
    return name[len("REFLEX_"):].lower()


class Settings:
    """The values of TABLE's variables (except scope "build"), as attributes."""

    __slots__ = tuple(_attr(n) for n, _, _, scope, _ in TABLE if scope != "build")

    def __repr__(self):
        return "Settings(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def allowed(kind):
    """What a kind accepts, in words (error messages, README)."""
    if isinstance(kind, tuple):
        return ", ".join(kind)
    return {"flag": "0, 1", "count": "a whole number >= 1", "int": "a whole number",
            "text": "any text", "path": "a path"}[kind]


def parse(name, kind, raw):
    """The value of variable `name` (of `kind`) set to the text `raw`; ReflexError if invalid."""
    v = raw.strip()
    if isinstance(kind, tuple):
        if v in kind:
            return v
    elif kind == "flag":
        if v in ("0", "1"):
            return v == "1"
    elif kind in ("count", "int"):
        try:
            n = int(v)
        except ValueError:
            n = None
        if n is not None and (kind == "int" or n >= 1):
            return n
    elif kind == "path":
        return os.path.expanduser(v)
    else:
        return raw
    from .errors import ReflexError

    raise ReflexError("invalid_request", f"${name}={raw!r} is not valid: expected {allowed(kind)}")


def read(environ=None):
    """A new Settings from `environ` (default os.environ); ReflexError on the first bad value."""
    env = os.environ if environ is None else environ
    s = Settings()
    for name, kind, default, scope, _ in TABLE:
        if scope == "build":
            continue
        raw = env.get(name)
        setattr(s, _attr(name), parse(name, kind, raw) if raw else default)
    return s


_current = None
_warned = False


def get():
    """The process's settings (read from the environment on the first call)."""
    s = _current
    return s if s is not None else reload()


def reset():
    """Forget the settings: the next get() reads the environment again."""
    global _current
    _current = None


def reload():
    """Read the environment again (after changing it in this process); returns the settings."""
    global _current, _warned
    _current = read()
    if not _warned:
        _warned = True
        old = [n for n in RETIRED if os.environ.get(n)]
        if old:
            import sys

            for n in old:
                print(f"reflex: warning: ${n} is no longer read ({RETIRED[n]})", file=sys.stderr)
    return _current


class override:
    """`with settings.override(fuse=False): ...`: those values inside the block, then the
    previous settings back."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        global _current
        self.saved = get()
        s = Settings()
        for k in Settings.__slots__:
            setattr(s, k, getattr(self.saved, k))
        for k, v in self.values.items():
            setattr(s, k, v)  # AttributeError: no such setting
        _current = s
        return s

    def __exit__(self, *exc):
        global _current
        _current = self.saved
        return False


def markdown():
    """README's table of the variables."""
    rows = ["| variable | values | default | read by | what it does |", "|---|---|---|---|---|"]
    for name, kind, default, scope, purpose in TABLE:
        if default is None:
            d = "unset"
        elif kind == "flag":
            d = "1" if default else "0"
        else:
            d = f"`{default}`"
        rows.append(f"| `{name}` | {allowed(kind)} | {d} | {scope} | {purpose} |")
    rows.append("")
    rows.append("Retired (no longer read; setting one prints a warning): "
                + "; ".join(f"`{n}` ({why})" for n, why in RETIRED.items()) + ".")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown())
    else:
        print(get())
