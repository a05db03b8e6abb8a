"""The rules the llama.cpp parity tests judge by (tests/arch: test_goldens.py, test_matrix.py):
the logit error, the bounds scaled by llama.cpp's own rounding noise, and the greedy verdicts
with their near-tie rules."""

import numpy as np

LOGIT_REL_TOL = 1e-2   # vs quantized llama.cpp: the floor of the logit bound,
NOISE_FACTOR = 1.5     # ... which is at least this times llama.cpp's rounding noise
EXACT_REL_TOL = 1e-3   # vs exact llama.cpp
TIE_REL = 0.005        # near-tie threshold (a fraction of max|logit|), the floor vs quantized
CPU_NOISE_FACTOR = 2.0  # the cpu backend vs quantized llama.cpp: two roundings of that noise


def logit_error(ours, ref):
    """max |ours - ref| / max |ref|."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        raise AssertionError(f"logits shape {ours.shape} != llama.cpp's {ref.shape}")
    if not np.isfinite(ours).all():
        return float("inf")
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def greedy_verdict(steps, got_ids, got_finish, eog_ids, tie=TIE_REL, our_logits=None, noise=None):
    """Compare our greedy continuation with llama.cpp's recorded `steps`.

    Returns (ok, message). llama.cpp's sequence ends at its first end-of-generation token
    (we stop there with finish_reason "stop", not emitting it). The first differing step
    is a pass only when llama.cpp's top-2 gap there was < tie * max|logit| and our
    choice (a token, or end of generation) was within tie * max|logit| of llama.cpp's best
    (among its top 5, or anywhere in its row when the step records it as "row").

    With `our_logits` (per step, {token: our logit} for llama.cpp's top 5 there) and
    `noise` (a fraction of max|logit|), a divergence also passes when it is explained by
    rounding of that size: our token is in llama.cpp's top 5, and our logits of llama.cpp's
    best token and of ours are each within noise * max|logit| of llama.cpp's. (A gap is the
    difference of two logits, so per-logit noise e flips gaps up to 2e: an engine that
    rounds activations as llama.cpp does, held to llama.cpp's own distance from exact
    arithmetic, may flip where that distance allows; this checks the distance itself.)"""
    expected = []
    for s in steps:
        if s["eog"]:
            break
        expected.append(s["token"])
    ends_eog = len(expected) < len(steps)

    def diverge(k, ours):
        s = steps[k]
        is_tie = s["gap"] < tie * s["max_abs"]
        best = s["top5"][0][1]
        near = {t for t, v in s["top5"] if best - v <= tie * s["max_abs"]}
        if "row" in s:  # the whole row recorded (tests/arch/test_matrix.py): any token within the tie
            near = {int(t) for t in np.flatnonzero(best - np.asarray(s["row"]) <= tie * s["max_abs"])}
        cand = set(eog_ids) if ours == "eog" else {ours}
        where = (f"step {k}: llama.cpp {s['token']} (gap {s['gap']:.4g}, max|logit| "
                 f"{s['max_abs']:.4g}, top5 {s['top5']}), ours {ours}")
        if is_tie and cand & near:
            return True, "near-tie divergence at " + where
        if our_logits is not None and noise is not None and ours != "eog" and k < len(our_logits):
            mine = our_logits[k] or {}
            top = {int(t): v for t, v in s["top5"]}
            pair = (int(s["token"]), int(ours))
            if pair[1] in top and all(t in mine and abs(mine[t] - top[t]) <= noise * s["max_abs"] for t in pair):
                dev = max(abs(mine[t] - top[t]) for t in pair) / s["max_abs"]
                return True, f"within-noise divergence (ours {dev:.4g} of max|logit| from llama.cpp's) at " + where
        return False, "divergence at " + where

    for k, tok in enumerate(expected):
        if k >= len(got_ids):
            if got_finish == "stop":
                return diverge(k, "eog")
            return False, f"we stopped ({got_finish}) after {len(got_ids)} tokens, llama.cpp went on"
        if got_ids[k] != tok:
            return diverge(k, got_ids[k])
    if ends_eog:
        if len(got_ids) > len(expected):
            return diverge(len(expected), got_ids[len(expected)])
        if got_finish != "stop":
            return False, f"llama.cpp ended generation, we finished with {got_finish!r}"
        return True, "identical (ended at end-of-generation)"
    if len(got_ids) != len(expected):
        return False, f"{len(got_ids)} tokens, llama.cpp {len(expected)}"
    return True, "identical"


def noisy_verdict(ref, got, finish, eog_ids, factor=NOISE_FACTOR):
    """Our greedy tokens against quantized llama.cpp's, (ok, message). Its rounding noise on
    these models varies from step to step (8% of max|logit| after qwen35moe's prompt, 19% one
    step later), so a divergence at step k is judged by the noise at that step: where
    llama.cpp's quantized and exact runs still share the context, max|quantized row - exact
    row| / max|logit| there (else the prompt's noise). It passes when our token (or, where we
    ended generation, an end-of-generation token) is within max(0.5%, 1.5 x that noise) of
    max|logit| below llama.cpp's best (2 x for the cpu backend); the rest of the sequence is then not compared."""
    q, x = ref["quant"][1], ref["exact"][1]
    for k, st in enumerate(q):
        if k < len(got) and got[k] == st["token"] and not st["eog"]:
            continue
        if k == len(got) and st["eog"] and finish == "stop":
            return True, "identical (ended at end-of-generation)"
        if k >= len(got) and finish != "stop":
            return False, f"we stopped ({finish}) after {len(got)} tokens, llama.cpp went on"
        z = st["row"]
        same = all(a["token"] == b["token"] for a, b in zip(q[:k], x[:k]))
        noise = float(np.abs(z - x[k]["row"]).max() / np.abs(z).max()) if same else ref["noise"]
        ours = [got[k]] if k < len(got) else sorted(eog_ids)
        deficit = float(z.max() - max(z[t] for t in ours))
        bound = max(TIE_REL, factor * noise) * st["max_abs"]
        return deficit <= bound, (f"step {k}: llama.cpp {st['token']}, ours {ours[:3]}, {deficit:.4g} below "
                                  f"its best (bound {bound:.4g}: its noise there {noise:.3g} of max|logit| "
                                  f"{st['max_abs']:.4g})")
    return True, "identical"
