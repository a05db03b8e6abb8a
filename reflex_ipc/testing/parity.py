"""The rules the llama.cpp parity tests judge by (tests/test_parity.py, tests/test_new_archs.py):
the logit error, the bounds scaled by llama.cpp's own rounding noise, and the greedy verdict
with its near-tie rule."""

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


def greedy_verdict(steps, got_ids, got_finish, eog_ids, tie=TIE_REL):
    """Compare our greedy continuation with llama.cpp's recorded `steps`.

    Returns (ok, message). llama.cpp's sequence ends at its first end-of-generation token
    (we stop there with finish_reason "stop", not emitting it). The first differing step
    is a pass only when llama.cpp's top-2 gap there was < tie * max|logit| and our
    choice (a token, or end of generation) was within tie * max|logit| of llama.cpp's best
    (among its top 5, or anywhere in its row when the step records it as "row")."""
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
        if "row" in s:  # the whole row recorded (test_new_archs): any token within the tie
            near = {int(t) for t in np.flatnonzero(best - np.asarray(s["row"]) <= tie * s["max_abs"])}
        cand = set(eog_ids) if ours == "eog" else {ours}
        where = (f"step {k}: llama.cpp {s['token']} (gap {s['gap']:.4g}, max|logit| "
                 f"{s['max_abs']:.4g}, top5 {s['top5']}), ours {ours}")
        if is_tie and cand & near:
            return True, "near-tie divergence at " + where
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
