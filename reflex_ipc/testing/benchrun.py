#!/usr/bin/env python3
"""The GPU host's model benchmarks of issues 15, 16 and 19, under a time budget.

    benchrun.py scale    OUT [--budget-s 540]   Qwen3-shaped 0.6B/4B/8B/14B/32B Q4_K (issue 19, 6)
    benchrun.py families OUT [--budget-s 540]   Qwen3-30B-A3B, DeepSeek-V2-Lite, Qwen3.5 ~2B (15, 16)
    benchrun.py cold19   OUT [--budget-s 300]   0.6B Q8_0 and Q4_K: issue 19's targets 1-5 and 7
    benchrun.py bigmodel OUT [--budget-s 360]   the families again for issue 27 (scripts/gpu/gpu-bigmodel)

(scripts/gpu/gpu-bench-scale, gpu-bench-families and gpu-bench-cold19 call these.) For each
model: generate it into --models-dir (reflex_ipc/testing/shaped.py, scripts/gpu/make_shaped.py; or make_gguf.py's
qwen3-shaped for cold19), read it once (page cache; GB/s recorded), then, each step a
subprocess of `reflex bench` (reflex_ipc/commands/bench.py) run from the byte-compiled user
venv (scripts/gpu/make-user-venv), with a timeout:

- cold: `reflex generate --max-tokens 1` alternating with `llama-simple -m M -n 1 -ngl 99 P`
  run by run (spawn->exit and spawn->first byte on stdout, NVML energy above idle to the first
  byte and to exit, the upload's GB/s from reflex's own timings); a 1-pair probe first sets
  the number of pairs the model's share of the budget allows (at least 3);
- cold from a dropped page cache, when the host lets root drop it (recorded either way);
- llama-bench -m M -p 512 -n 128 -ngl 99 -r 3 -o json (tg128 and pp512 in one process);
- reflex decode (128 tokens, best of 3), prefill (512 tokens, p50), warm (system1 x3 etc.),
  with VRAM from NVML.
bigmodel (issue 27; scripts/gpu/gpu-bigmodel runs it after its kernel and engine checks): the
families' models, 30B-A3B first, with the cold starts from a dropped page cache, at most 3
pairs a side, and per model an A/B of its prefill switch (REFLEX_MOE_MMA for the MoE models,
REFLEX_MLA_FLASH for DeepSeek: 0 vs 1 alternating) and a per-kernel breakdown of a 512-token
prefill and of decode tokens (reflex_ipc.testing.breakdown's parts, REFLEX_PROFILE=1) when a
target is missed.
cold19 adds: energy repetitions until the spread (sample sd / mean) of both engines' energy
per start is under 20% (or the budget ends: recorded), 20 back-to-back starts vs isolated
starts 2 s apart, a 500-token-prompt cold start vs llama-simple, prefill with REFLEX_MMA=0
vs =1 (alternating).

One JSON per model in OUT (MODEL.json), rewritten after every step (a failed step or model
records its error and the run goes on), then OUT/summary.json and a table on stdout.
Peers: --llama-simple / --llama-bench or $LLAMA_SIMPLE / $LLAMA_BENCH (built on the host by
hand; this repository holds no llama.cpp code). A missing peer skips its side.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from reflex_ipc.commands.bench import GPU, machine_info, prefill_prompt, spread, stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
HERE = os.path.join(ROOT, "scripts", "gpu")  # make-user-venv

PROMPT = "The capital of France is"
SCALE = ["qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]
FAMILIES = ["qwen35-2b", "deepseek-v2-lite", "qwen3-30b-a3b"]
COLD19 = ["q8_0", "q4k"]
BIGMODEL = ["qwen3-30b-a3b", "deepseek-v2-lite", "qwen35-2b"]
# issue 27's targets (ratios against llama.cpp) and each model's prefill switch for the A/B
BIGMODEL_TARGETS = {"prefill_ratio": 1.0, "decode_ratio": 1.1}
BIGMODEL_COLD_DROPPED = {"qwen3-30b-a3b": 2.0}
BIGMODEL_SWITCH = {"qwen3-30b-a3b": "REFLEX_MOE_MMA", "deepseek-v2-lite": "REFLEX_MLA_FLASH"}
ENERGY_TAIL_S = 0.25  # the energy window's hold after exit (bench cold --energy-tail): a detached teardown  # make_gguf.py qwen3-shaped kinds (Qwen3-0.6B-shaped)


# ---------------------------------------------------------------------------------------
# peers' outputs
def parse_llama_bench(text):
    """llama-bench -o json's stdout -> [{n_prompt, n_gen, avg_ts, stddev_ts, samples_ts, ...}].
    Tolerates a run cut short (an array never closed) and jsonl."""
    text = (text or "").strip()
    if not text:
        return []
    for attempt in (text, text.rstrip(",") + "\n]"):
        try:
            v = json.loads(attempt)
            return v if isinstance(v, list) else [v]
        except ValueError:
            pass
    rows = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{") and line.endswith("}"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def llama_bench_figures(rows):
    """{"tg": {...}, "pp": {...}} from parse_llama_bench rows (tokens/s: mean and samples)."""
    out = {}
    for r in rows:
        kind = "tg" if r.get("n_gen") and not r.get("n_prompt") else "pp" if r.get("n_prompt") and not r.get("n_gen") \
            else "pg"
        out[kind] = {"n_prompt": r.get("n_prompt"), "n_gen": r.get("n_gen"), "avg_ts": r.get("avg_ts"),
                     "stddev_ts": r.get("stddev_ts"), "samples_ts": r.get("samples_ts"),
                     "model_size": r.get("model_size"), "build_commit": r.get("build_commit"),
                     "flash_attn": r.get("flash_attn"), "n_ubatch": r.get("n_ubatch")}
    return out


# ---------------------------------------------------------------------------------------
class Budget:
    def __init__(self, seconds):
        self.t0 = time.monotonic()
        self.seconds = seconds

    def left(self):
        return self.seconds - (time.monotonic() - self.t0)

    def used(self):
        return round(time.monotonic() - self.t0, 1)


def drop_caches_allowed():
    """Whether root may drop the page cache here (a gVisor sandbox refuses): one real drop."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True, None
    except OSError as e:
        return False, f"{type(e).__name__}: {e}"


def read_file(path, chunk=1 << 24):
    """Read path once (into the page cache); (seconds, GB/s)."""
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(chunk)
        mv = memoryview(buf)
        while True:
            k = fh.readinto(mv)
            if not k:
                break
            n += k
    dt = time.perf_counter() - t0
    return round(dt, 3), round(n / dt / 1e9, 3) if dt else None


def run_group(argv, timeout, **kw):
    """subprocess.run in a new session; on timeout the whole group (the bench's children: a
    cold reflex, llama-simple) is killed. Returns (rc or None on timeout, stdout, stderr)."""
    import signal

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         **kw)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = p.communicate()
        return None, out, err


class Runner:
    def __init__(self, a):
        self.a = a
        self.budget = Budget(a.budget_s)
        self.out = os.path.abspath(a.out)
        os.makedirs(self.out, exist_ok=True)
        self.gpu = GPU()  # NVML when importable (its methods are no-ops without it)
        self.machine = machine_info(self.gpu)
        self.simple = a.llama_simple or os.environ.get("LLAMA_SIMPLE") or None
        self.lbench = a.llama_bench or os.environ.get("LLAMA_BENCH") or None
        self.summary = {"suite": a.suite, "machine": self.machine, "budget_s": a.budget_s, "device": a.device,
                        "python": self.python_argv(), "llama_simple": self.simple, "llama_bench": self.lbench,
                        "models": {}}
        self.can_drop, why = drop_caches_allowed() if a.drop_caches else (False, "not asked")
        self.summary["drop_caches"] = {"allowed": self.can_drop, "why_not": why}

    # -- reflex ----------------------------------------------------------------------
    def python_argv(self):
        return [self.a.python, "-m", "reflex_ipc"]

    def reflex_env(self, extra=None):
        env = dict(os.environ)
        if self.a.python_isolated:  # a venv: its own site-packages, not this checkout's
            env.pop("PYTHONPATH", None)
        env.update(extra or {})
        return env

    def bench(self, mode, model, timeout, *args, env=None):
        """`reflex bench MODE` as a subprocess; its JSON (or an error record)."""
        jpath = os.path.join(self.out, f".bench-{os.getpid()}.json")
        if os.path.exists(jpath):
            os.unlink(jpath)
        argv = self.python_argv() + ["bench", mode, "--model", model, "--device", self.a.device,
                                     "--out", jpath, *map(str, args)]
        t0 = time.monotonic()
        timeout = self.cap(timeout)
        rc, _, err = run_group(argv, timeout, cwd="/tmp", env=self.reflex_env(env))
        if rc is None:
            return {"error": f"timeout after {timeout:.0f} s", "argv": argv, "stderr_tail": err[-1500:]}
        if rc != 0 or not os.path.exists(jpath):
            return {"error": f"rc {rc}", "argv": argv, "stderr_tail": err[-1500:]}
        with open(jpath) as fh:
            res = json.load(fh)
        os.unlink(jpath)
        r = res["runs"][0] if len(res["runs"]) == 1 else res["runs"]
        r["seconds"] = round(time.monotonic() - t0, 2)
        return r

    def cold(self, model, n, timeout, prompt=PROMPT, peer=True, extra=(), env=None):
        args = ["--runs", n, "--prompt", prompt, "--energy-tail", ENERGY_TAIL_S, *extra]
        if self.idle_w is not None:
            args += ["--idle-w", round(self.idle_w, 3)]
        if peer and self.simple:
            args += ["--vs", f"{shlex.quote(self.simple)} -m {shlex.quote(model)} -n 1 -ngl 99 {shlex.quote(prompt)}",
                     "--vs-name", "llama-simple"]
        return self.bench("cold", model, timeout, *args, env=env)

    def llama_bench(self, model, timeout, reps=3):
        if not self.lbench:
            return {"error": "no llama-bench (--llama-bench or $LLAMA_BENCH)"}
        argv = [self.lbench, "-m", model, "-p", "512", "-n", "128", "-ngl", "99", "-r", str(reps), "-o", "json"]
        t0 = time.monotonic()
        timeout = self.cap(timeout)
        rc, out, err = run_group(argv, timeout)
        res = {"argv": argv, "rc": rc, "seconds": round(time.monotonic() - t0, 2),
               "figures": llama_bench_figures(parse_llama_bench(out))}
        if rc is None:
            res["error"] = f"timeout after {timeout:.0f} s"
        elif rc != 0:
            res["error"] = f"rc {rc}"
        if rc != 0:
            res["stderr_tail"] = err[-1500:]
        return res

    def cap(self, timeout):
        """A step's timeout, never past the budget's end."""
        return max(1.0, min(timeout, self.budget.left() - 2))

    # -- records ---------------------------------------------------------------------
    def save(self, rec):
        path = os.path.join(self.out, rec["model"] + ".json")
        with open(path + ".tmp", "w") as fh:
            json.dump(rec, fh, indent=1)
        os.replace(path + ".tmp", path)

    def step(self, rec, name, fn):
        """Run one step; its result (or the exception) into rec["steps"][name], saved."""
        t0 = time.monotonic()
        if self.budget.left() < 10:
            rec["steps"][name] = {"skipped": "budget spent"}
            self.save(rec)
            print(f"[{self.budget.used():6.1f} s] {rec['model']} {name}: skipped, budget spent", file=sys.stderr,
                  flush=True)
            return rec["steps"][name]
        try:
            rec["steps"][name] = fn()
        except Exception as e:  # one step's failure must not lose the others'
            rec["steps"][name] = {"error": f"{type(e).__name__}: {e}"}
        rec["steps"][name] = rec["steps"][name] or {}
        if isinstance(rec["steps"][name], dict):
            rec["steps"][name].setdefault("seconds", round(time.monotonic() - t0, 2))
        rec["budget_used_s"] = self.budget.used()
        self.save(rec)
        r = rec["steps"][name]
        note = (r.get("error") or r.get("skipped") or "ok") if isinstance(r, dict) else "ok"
        print(f"[{self.budget.used():6.1f} s] {rec['model']} {name}: {str(note)[:120]} "
              f"({r.get('seconds') if isinstance(r, dict) else '-'} s)", file=sys.stderr, flush=True)
        return r

    def measure_idle(self):
        self.idle_w = self.gpu.idle_power_w(2.0) if self.gpu.nv else None
        return self.idle_w

    # -- a model -----------------------------------------------------------------------
    def generate(self, name, path):
        if self.a.suite == "cold19" and not self.a.tiny:
            from reflex_ipc.testing.synthetic import qwen3_shaped

            t0 = time.perf_counter()
            qwen3_shaped(path, kind=name, vocab=os.path.join(ROOT, "scripts/fixtures/data/qwen2-vocab.npz"))
            dt = time.perf_counter() - t0
            return {"model": name, "path": path, "bytes": os.path.getsize(path), "seconds": round(dt, 3),
                    "GB_per_s": round(os.path.getsize(path) / dt / 1e9, 3)}
        from reflex_ipc.testing.shaped import write_model

        return write_model("qwen3-0.6b" if self.a.suite == "cold19" else name, path, tiny=self.a.tiny)

    def run_model(self, name, share_s):
        """Every step of one model within about share_s seconds."""
        t_model = time.monotonic()
        os.makedirs(self.a.models_dir, exist_ok=True)
        label = f"qwen3-0.6b-{name}" if self.a.suite == "cold19" else name
        path = os.path.join(self.a.models_dir, label + (".tiny" if self.a.tiny else "") + ".gguf")
        rec = {"model": label, "suite": self.a.suite, "machine": self.machine, "device": self.a.device,
               "share_s": round(share_s, 1), "steps": {}}
        self.summary["models"][label] = rec
        gen = self.step(rec, "generate", lambda: self.generate(name, path))
        if "error" in gen:
            return rec
        rec["file_bytes"] = gen.get("bytes")
        try:
            self.step(rec, "page_cache", lambda: dict(zip(("seconds_read", "GB_per_s"), read_file(path))))
            self.step(rec, "idle", lambda: {"idle_power_w": self.measure_idle()})

            def left():  # what remains of this model's share (never more than the budget)
                return min(share_s - (time.monotonic() - t_model), self.budget.left() - 5)

            # cold: a probe pair (also the warm-up after generation), then what the share allows
            probe = self.step(rec, "cold_probe", lambda: self.cold(path, 1, max(30, left())))
            pair_s = max(0.2, probe.get("seconds", 10.0)) if "error" not in probe and "skipped" not in probe \
                else None
            if pair_s is not None:
                # at least 3 pairs where the budget has room (else what fits); at most --max-pairs
                n = max(3, min(self.a.max_pairs, int(0.40 * left() / pair_s)))
                n = max(1, min(n, int((self.budget.left() - 20) / pair_s)))
                self.step(rec, "cold", lambda: self.cold(path, n, max(30, n * pair_s * 3)))
                if self.a.suite == "bigmodel" and name in ("qwen3-30b-a3b", "deepseek-v2-lite"):
                    # the page cache warm, the whole file registered and copied first (the way before
                    # MoE files streamed from the page cache too): 2 cold starts, no peer
                    self.step(rec, "cold_register", lambda: self.cold(path, 2, max(30, 4 * pair_s), peer=False,
                                                                      env={"REFLEX_CUDA_UPLOAD": "register"}))
                if self.can_drop:
                    nd = 1 if self.a.suite == "bigmodel" else 2  # a dropped-cache pair of a 20 GB model: ~35 s
                    self.step(rec, "cold_dropped_cache",
                              lambda: self.cold(path, nd, max(30, 3 * nd * pair_s + 60), extra=["--drop-caches"]))
            if self.a.suite == "cold19":
                self.cold19_extras(rec, path, pair_s or 2.0, left)
            self.step(rec, "llama_bench", lambda: self.llama_bench(path, max(60, left())))
            self.step(rec, "decode", lambda: self.bench("decode", path, max(60, left()), "--tokens", 128))
            self.step(rec, "prefill", lambda: self.bench("prefill", path, max(60, left()), "--runs", 3,
                                                         "--prompt-tokens", 512))
            if self.a.suite == "cold19":
                self.mma_ab(rec, path, left)
            if self.a.suite == "bigmodel" and name in BIGMODEL_SWITCH:
                self.mma_ab(rec, path, left, BIGMODEL_SWITCH[name])
            self.step(rec, "warm", lambda: self.bench("warm", path, max(60, left()), "--runs", 3,
                                                      "--prompt", PROMPT))
            if self.a.suite == "cold19" and self.gpu.nv and pair_s is not None:
                self.step(rec, "energy", lambda: self.energy(rec, path, pair_s, left))  # what time is left
            if self.a.suite == "bigmodel":
                rec["ratios"] = ratios(rec)
                miss = bigmodel_misses(name, rec["ratios"])
                if miss:
                    self.step(rec, "breakdown", lambda: self.breakdown(path, miss, left))
        finally:
            if not self.a.keep_models and os.path.exists(path):
                os.unlink(path)
        rec["ratios"] = ratios(rec)
        rec["seconds"] = round(time.monotonic() - t_model, 1)
        self.save(rec)
        return rec

    def energy(self, rec, path, pair_s, left):
        """More pairs, 10 at a time, until the spread (sd / mean) of both engines' energy per
        start is under 20%, or this model's share of the time is spent (target_met false)."""
        pooled = {"reflex": [], "peer": [], "reflex_first": [], "peer_first": []}
        _pool(pooled, rec["steps"].get("cold") or {})
        batches = 0
        while True:
            cv = {k: (spread(v) or {}).get("cv") for k, v in pooled.items()}
            ok = all(c is not None and c < 0.2 for k, c in cv.items() if k.startswith("reflex") or self.simple)
            if ok or left() < 12 * pair_s + 5 or batches >= 6:
                return {"spread": {k: spread(v) for k, v in pooled.items()}, "target_met": ok,
                        "extra_batches": batches, "idle_power_w": self.idle_w,
                        "method": "NVML total energy counter read at its steps: the spawn follows a step within "
                                  "a millisecond, the window closes at the first step 0.25 s or more after exit "
                                  "(work a process leaves behind, such as reflex's detached driver teardown, "
                                  "counts); minus idle power (the counter between two steps 2 s apart before the "
                                  "cold runs) times the window; energy to the first stdout byte is a plain read "
                                  "(within one counter step); spread = sample sd / mean over all pairs"}
            r = self.cold(path, 10, max(60, 30 * pair_s))
            if "error" in r:
                return {"error": r["error"], "spread": {k: spread(v) for k, v in pooled.items()}}
            rec["steps"].setdefault("energy_batches", []).append(r)
            _pool(pooled, r)
            batches += 1

    def cold19_extras(self, rec, path, pair_s, left):
        self.step(rec, "back_to_back_20", lambda: self.cold(path, 20, max(60, 20 * pair_s * 2), peer=False))
        # the same with the exiting process's driver teardown at once (REFLEX_TEARDOWN=now) instead of
        # held back while another start-up is in cuInit (the default; results at d960b5d have the
        # reverse pair: back_to_back_20 was the immediate teardown, back_to_back_20_after_init the wait)
        self.step(rec, "back_to_back_20_teardown_now", lambda: self.cold(path, 20, max(60, 20 * pair_s * 2), peer=False,
                                                                         env={"REFLEX_TEARDOWN": "now"}))
        n_iso = max(3, min(8, int(0.1 * left() / (pair_s / 2 + 2))))
        self.step(rec, "isolated_pause_2s", lambda: self.cold(path, n_iso, max(60, n_iso * (pair_s + 2.5) * 2),
                                                              peer=False, extra=["--pause", 2]))
        long_prompt = prefill_prompt(500, 7)
        n500 = max(3, min(8, int(0.1 * left() / pair_s)))
        self.step(rec, "cold_prompt_500", lambda: self.cold(path, n500, max(60, n500 * pair_s * 4), prompt=long_prompt))

    def mma_ab(self, rec, path, left, var="REFLEX_MMA"):
        """Prefill with var=0 and =1, alternating twice (issue 19: REFLEX_MMA; issue 27, once: the
        grouped MoE GEMMs, the MLA flash form)."""
        def ab():
            rows = {"0": [], "1": []}
            for _ in range(1 if self.a.suite == "bigmodel" else 2):
                for v in ("0", "1"):
                    r = self.bench("prefill", path, max(60, left()), "--runs", 3, "--prompt-tokens", 512,
                                   env={var: v})
                    rows[v].append(r)
            p50 = {v: stats([x for r in rs if "error" not in r for x in
                             [row.get("tokens_per_s") for row in r.get("per_run", [])]]) for v, rs in rows.items()}
            return {var: rows, "variable": var, "tokens_per_s": p50,
                    "mma_speedup_p50": _div((p50["1"] or {}).get("p50"), (p50["0"] or {}).get("p50"))}

        self.step(rec, "prefill_mma_ab" if var == "REFLEX_MMA" else f"prefill_ab_{var}", ab)

    def breakdown(self, path, miss, left):
        """Per-kernel figures of what was missed: reflex_ipc.testing.breakdown's prefill (a
        512-token prompt_logits) and decode parts, each a child with REFLEX_PROFILE=1."""
        from reflex_ipc.testing import breakdown

        out = {"missed": miss}
        parts = [p for p in ("prefill", "decode") if any(m.startswith(p) for m in miss)]
        for part in parts:
            if left() < 20:
                out[part] = {"skipped": "budget spent"}
                continue
            out[part] = breakdown.run_child(part, path, 3, {"REFLEX_BREAKDOWN_DEVICE": self.a.device},
                                            timeout=self.cap(min(180, left())))
        return out

    # -- the suite -------------------------------------------------------------------
    def run(self, models, weights, sizes_gb):
        for i, name in enumerate(models):
            rest = sum(weights[i:])
            share = max(20.0, (self.budget.left() - 5) * weights[i] / rest)
            if self.budget.left() < 30 + 3 * sizes_gb[i]:  # generation, page cache, one probe pair
                self.summary["models"][name] = {"model": name, "skipped": "budget spent"}
                continue
            try:
                self.run_model(name, share)
            except Exception as e:
                self.summary["models"][name] = {"model": name, "error": f"{type(e).__name__}: {e}"}
            self.summary["budget_used_s"] = self.budget.used()
            self.write_summary()
        self.write_summary()
        print(table(self.summary))

    def write_summary(self):
        s = dict(self.summary, models={k: {kk: v.get(kk) for kk in ("model", "file_bytes", "ratios", "seconds",
                                                                         "error", "skipped")}
                                           for k, v in self.summary["models"].items()})
        with open(os.path.join(self.out, "summary.json.tmp"), "w") as fh:
            json.dump(s, fh, indent=1)
        os.replace(os.path.join(self.out, "summary.json.tmp"), os.path.join(self.out, "summary.json"))


def _pool(pooled, cold):
    for r in cold.get("per_run") or []:
        if r.get("rc") == 0:
            pooled["reflex"].append(r.get("energy_net_j"))
            pooled["reflex_first"].append(r.get("energy_first_net_j"))
    for r in (cold.get("vs") or {}).get("per_run") or []:
        if r.get("rc") == 0:
            pooled["peer"].append(r.get("energy_net_j"))
            pooled["peer_first"].append(r.get("energy_first_net_j"))
    for k in pooled:
        pooled[k] = [x for x in pooled[k] if x is not None]


def _div(a, b):
    return round(a / b, 3) if a and b else None


def _p50(d, *keys):
    for k in keys:
        d = (d or {}).get(k) if isinstance(d, dict) else None
    return d


def ratios(rec):
    """The headline ratios of one model's record (None where a side is missing)."""
    s = rec["steps"]
    cold = s.get("cold") or {}
    vs = cold.get("vs") or {}
    lb = (s.get("llama_bench") or {}).get("figures") or {}
    dec = _p50(s, "decode", "best_of_3", "tokens_per_s")
    pre = _p50(s, "prefill", "tokens_per_s", "p50")
    out = {
        "cold_reflex_p50_ms": _p50(cold, "wall_ms", "p50"), "cold_reflex_p95_ms": _p50(cold, "wall_ms", "p95"),
        "cold_reflex_first_byte_p50_ms": _p50(cold, "first_byte_ms", "p50"),
        "cold_llama_simple_p50_ms": _p50(vs, "wall_ms", "p50"),
        "cold_llama_simple_first_byte_p50_ms": _p50(vs, "first_byte_ms", "p50"),
        "cold_speedup_pairwise_p50": _p50(vs, "speedup_pairwise", "p50"),
        "upload_GB_per_s_p50": _p50(cold, "upload_GB_per_s", "p50"),
        "upload_modes": cold.get("upload_modes"),
        "page_cache_read_GB_per_s": _p50(s, "page_cache", "GB_per_s"),
        "energy_reflex_net_j_mean": cold.get("energy_net_j_mean"),
        "energy_llama_simple_net_j_mean": vs.get("energy_net_j_mean"),
        "decode_reflex_tps": dec, "decode_llama_bench_tps": _p50(lb, "tg", "avg_ts"),
        "decode_ratio": _div(dec, _p50(lb, "tg", "avg_ts")),
        "prefill_reflex_tps": pre, "prefill_llama_bench_tps": _p50(lb, "pp", "avg_ts"),
        "prefill_ratio": _div(pre, _p50(lb, "pp", "avg_ts")),
        "warm_system1x3_p50_ms": _p50(s, "warm", "system1_3_candidates_ms", "p50"),
        "warm_generate1_p50_ms": _p50(s, "warm", "generate_1_token_ms", "p50"),
        "vram_reflex_mib": _p50(s, "decode", "vram_process_mib") or _p50(s, "warm", "vram_process_mib"),
    }
    if s.get("cold_register"):
        out["cold_register_reflex_p50_ms"] = _p50(s, "cold_register", "wall_ms", "p50")
    if s.get("cold_dropped_cache"):
        d = s["cold_dropped_cache"]
        out["cold_dropped_reflex_p50_ms"] = _p50(d, "wall_ms", "p50")
        out["cold_dropped_llama_simple_p50_ms"] = _p50(d, "vs", "wall_ms", "p50")
        out["cold_dropped_upload_GB_per_s_p50"] = _p50(d, "upload_GB_per_s", "p50")
        out["cold_dropped_upload_modes"] = d.get("upload_modes")
    if s.get("back_to_back_20"):
        b2b, iso = _p50(s, "back_to_back_20", "wall_ms", "p50"), _p50(s, "isolated_pause_2s", "wall_ms", "p50")
        out.update(back_to_back_p50_ms=b2b, isolated_p50_ms=iso, back_to_back_over_isolated=_div(b2b, iso))
        if s.get("back_to_back_20_teardown_now"):
            b2 = _p50(s, "back_to_back_20_teardown_now", "wall_ms", "p50")
            out.update(back_to_back_teardown_now_p50_ms=b2, back_to_back_teardown_now_over_isolated=_div(b2, iso))
    if s.get("cold_prompt_500"):
        c5 = s["cold_prompt_500"]
        out.update(cold500_reflex_p50_ms=_p50(c5, "wall_ms", "p50"),
                   cold500_llama_simple_p50_ms=_p50(c5, "vs", "wall_ms", "p50"),
                   cold500_speedup_pairwise_p50=_p50(c5, "vs", "speedup_pairwise", "p50"))
    if s.get("energy"):
        e = s["energy"]
        out["energy_spread_target_met"] = e.get("target_met")
        for k, v in (e.get("spread") or {}).items():
            out[f"energy_{k}_net_j_mean"] = (v or {}).get("mean")
            out[f"energy_{k}_cv"] = (v or {}).get("cv")
    if s.get("prefill_mma_ab"):
        out["prefill_mma_speedup_p50"] = s["prefill_mma_ab"].get("mma_speedup_p50")
    for k, v in s.items():
        if k.startswith("prefill_ab_") and isinstance(v, dict):
            out[f"{k}_speedup_p50"] = v.get("mma_speedup_p50")
    return out


def bigmodel_misses(name, r):
    """The issue-27 targets a model's ratios miss: ["prefill_ratio", ...] (None ratios count
    as misses: a side that did not run)."""
    miss = [k for k, t in BIGMODEL_TARGETS.items() if not (r.get(k) or 0) >= t]
    t = BIGMODEL_COLD_DROPPED.get(name)
    if t:
        a, b = r.get("cold_dropped_reflex_p50_ms"), r.get("cold_dropped_llama_simple_p50_ms")
        if not (a and b and b / a >= t):
            miss.append("cold_dropped")
    return miss


def table(summary):
    cols = [("cold_reflex_p50_ms", "cold ms"), ("cold_llama_simple_p50_ms", "l-simple"),
            ("cold_speedup_pairwise_p50", "x"), ("decode_reflex_tps", "dec t/s"),
            ("decode_llama_bench_tps", "l-bench"), ("decode_ratio", "x"), ("prefill_reflex_tps", "pp t/s"),
            ("prefill_llama_bench_tps", "l-bench"), ("prefill_ratio", "x"), ("warm_system1x3_p50_ms", "sys1"),
            ("upload_GB_per_s_p50", "up GB/s"), ("vram_reflex_mib", "VRAM")]
    lines = [f"{'model':18} {'GB':>6} " + " ".join(f"{h:>8}" for _, h in cols)]
    for name, rec in summary["models"].items():
        r = rec.get("ratios") or {}
        gb = (rec.get("file_bytes") or 0) / 1e9
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append(f"{v:>8.4g}" if isinstance(v, (int, float)) else f"{'-':>8}")
        lines.append(f"{name:18} {gb:6.2f} " + " ".join(cells)
                     + (f"  {rec.get('error') or rec.get('skipped')}" if rec.get("error") or rec.get("skipped") else ""))
        extra = {k: v for k, v in r.items() if v is not None and k.startswith(("back_to_back", "isolated", "cold500", "energy_",
                                                              "prefill_mma", "cold_dropped", "prefill_ab_",
                                                              "cold_register"))}
        if extra:
            lines.append("    " + ", ".join(f"{k} {v}" for k, v in extra.items()))
    lines.append(f"drop_caches: {summary.get('drop_caches')}; budget used {summary.get('budget_used_s')} s "
                 f"of {summary.get('budget_s')}")
    return "\n".join(lines)


def source_digest():
    """sha1 over reflex_ipc's files (sources and the fatbin): whether a venv is of this checkout."""
    import hashlib

    h = hashlib.sha1()
    base = os.path.join(ROOT, "reflex_ipc")
    for d, dirs, files in sorted(os.walk(base)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".pyc", ".so")):
                continue
            h.update(os.path.relpath(os.path.join(d, f), base).encode())
            with open(os.path.join(d, f), "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def ensure_venv(a):
    """The byte-compiled user venv (and the fatbin it copies) unless --python was given."""
    if a.python:
        a.python_isolated = False
        return
    venv = a.venv
    fatbin = os.path.join(ROOT, "reflex_ipc/kernels/reflex_kernels.fatbin")
    if not os.path.exists(fatbin):
        subprocess.run([sys.executable, "kernels/build.py", "reflex_ipc/kernels"], cwd=ROOT, check=True,
                       env=dict(os.environ, REFLEX_CUDA_ARCHS=os.environ.get("REFLEX_CUDA_ARCHS", "90")))
    stamp = os.path.join(venv, "reflex-src.sha1")
    digest = source_digest()
    fresh = os.path.exists(os.path.join(venv, "bin", "python")) and os.path.exists(stamp) \
        and open(stamp).read() == digest
    if not fresh:  # none yet, or one of other sources (a warm machine, a new checkout)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([os.path.join(HERE, "make-user-venv"), venv], cwd=ROOT, check=True)
        with open(stamp, "w") as fh:
            fh.write(digest)
    a.python = os.path.join(venv, "bin", "python")
    a.python_isolated = True


def load_points(path):
    """[(model, GB, {series: (p50, p95)})] sorted by size, from a scale results dir."""
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    with open(os.path.join(d, "summary.json")) as fh:
        summary = json.load(fh)
    points = []
    for name in summary["models"]:
        f = os.path.join(d, name + ".json")
        if not os.path.exists(f):
            continue
        with open(f) as fh:
            rec = json.load(fh)
        if not rec.get("file_bytes"):
            continue
        steps = rec.get("steps") or {}
        series = {}
        for step, tag in (("cold", ""), ("cold_dropped_cache", ", page cache dropped")):
            c = steps.get(step) or {}
            for side, r in (("reflex", c), ("llama-simple", c.get("vs") or {})):
                w = r.get("wall_ms") or {}
                if w.get("p50") is not None:
                    series[side + tag] = (w["p50"], w.get("p95", w["p50"]))
        if series:
            points.append((name, rec["file_bytes"] / 1e9, series))
    points.sort(key=lambda p: p[1])
    return summary, points


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=["scale", "families", "cold19", "bigmodel"])
    ap.add_argument("out", help="results directory (one JSON per model, summary.json)")
    ap.add_argument("--budget-s", type=float, default=None, help="default: 540 (cold19: 300)")
    ap.add_argument("--models", nargs="*", help="a subset, in this order")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--python", help="run reflex with this interpreter (keeps $PYTHONPATH); default: the user venv")
    ap.add_argument("--venv", default="/tmp/reflex-venv")
    ap.add_argument("--models-dir", default="/tmp/models")
    ap.add_argument("--keep-models", action="store_true", help="do not delete each model after its run")
    ap.add_argument("--tiny", action="store_true", help="tiny models of the same layouts (dry runs)")
    ap.add_argument("--max-pairs", type=int, default=None, help="cold pairs at most (default 10; cold19: 20)")
    ap.add_argument("--drop-caches", dest="drop_caches", action="store_true", default=None,
                    help="also cold starts from a dropped page cache (default: scale only; where root may)")
    ap.add_argument("--no-drop-caches", dest="drop_caches", action="store_false")
    ap.add_argument("--llama-simple")
    ap.add_argument("--llama-bench")
    a = ap.parse_args(argv)
    if a.budget_s is None:
        a.budget_s = {"cold19": 300.0, "bigmodel": 360.0}.get(a.suite, 540.0)
    if a.drop_caches is None:
        a.drop_caches = a.suite in ("scale", "bigmodel")
    if a.max_pairs is None:
        a.max_pairs = {"cold19": 20, "bigmodel": 3}.get(a.suite, 10)
    models = a.models or {"scale": SCALE, "families": FAMILIES, "cold19": COLD19, "bigmodel": BIGMODEL}[a.suite]
    t0 = time.monotonic()
    ensure_venv(a)
    a.budget_s -= time.monotonic() - t0  # the venv's setup counts
    r = Runner(a)
    r.idle_w = None
    r.summary["setup_s"] = round(time.monotonic() - t0, 1)
    from reflex_ipc.testing.shaped import SHAPES, config, nbytes, tensor_plan

    def gb(m):
        m = "qwen3-0.6b" if a.suite == "cold19" else m
        return sum(nbytes(s, f) for _, s, f, _, _ in tensor_plan(config(m, a.tiny), 151936)) / 1e9 if m in SHAPES else 1

    sizes = [gb(m) for m in models]
    # cold19: equal shares; else a fixed part plus one growing with the file size (GB)
    weights = [1.0 for _ in models] if a.suite == "cold19" else [20 + 6 * g for g in sizes]
    r.run(models, weights, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
