"""system1: candidate continuations of a prompt scored in one forward pass (the
protocol's system1 and the in-process API's `decide` run this on a Runner)."""

from __future__ import annotations

import time

from .errors import ReflexError

SEQ_GROUP = 16  # recurrent models: candidates per batch (each holds a copy of the state)


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def system1(runner, prompt, candidates, *, temperature=1.0, should_cancel=None, cache_prompt=True,
            kv_import=None, kv_export=None, prefix_cache=True) -> dict:
    """Score candidate continuations of `prompt` in one forward pass over all of them.

    Every candidate's tokens are stored after the prompt, each attending to the prompt and
    to its own earlier tokens only, at positions continuing from the prompt's end. When
    the prompt tokens not already held (prefix reuse) and the candidates fit one batch
    they run as one forward pass (timed as prompt_eval; candidates_eval is then 0);
    otherwise the prompt is prefilled first and the candidates follow in batches. logprob
    is the sum over a candidate's tokens of the full-vocabulary log-softmax (float64);
    probability is the softmax of logprob / temperature over the candidates; entropy is
    theirs, in bits. The state then holds the prompt.

    kv_import / kv_export: as for generate (the prompt is then the text after the saved
    tokens; each candidate is tokenized with it, without BOS); the export holds the
    prompt.

    On a model with recurrent layers (per-sequence state) the prompt is prefilled first,
    its state copied to one sequence per candidate, and the candidates run as one batch
    (SEQ_GROUP candidates at a time, which bounds the copies held), each from its own copy.
    """
    import numpy as np

    t0 = time.perf_counter()
    if isinstance(candidates, str) or not len(candidates):
        raise ReflexError("invalid_request", "candidates must be a non-empty list of strings")
    if not temperature > 0.0:
        raise ReflexError("invalid_request", f"temperature must be > 0, not {temperature}")
    check = runner._checker(should_cancel)
    extra_out, extra_t = {}, {}
    from .runtime import prefixstore

    prefixstore.begin(runner, prefix_cache)  # the prefix cache (runtime/prefixstore.py)
    sf = runner._open_state(kv_import) if kv_import is not None else None
    try:
        return _system1(runner, prompt, candidates, temperature, check, cache_prompt, sf, kv_export,
                             extra_out, extra_t, t0)
    finally:
        if sf is not None:
            sf.close()

def _system1(runner, prompt, candidates, temperature, check, cache_prompt, sf, kv_export, extra_out,
             extra_t, t0):
    import numpy as np

    if sf is not None:
        if not isinstance(prompt, str):
            raise ReflexError("invalid_request", "the prompt must be a string")
        prefix = sf.tokens

        def encode(text):
            return prefix + runner._continuation_ids(text)

        p_ids = encode(prompt)
    else:
        encode = runner.tok.encode
        p_ids = runner._prompt_ids(prompt)
    cand_ids = []
    for i, c in enumerate(candidates):
        if not isinstance(c, str):
            raise ReflexError("invalid_request", f"candidate {i} is not a string")
        full = encode(prompt + c)
        if full[:len(p_ids)] != p_ids:
            raise ReflexError("invalid_request",
                              f"candidate {i} ({c[:40]!r}) changes the tokenization of the prompt: "
                              f"the prompt's tokens are not a prefix of prompt+candidate")
        if len(full) == len(p_ids):
            raise ReflexError("invalid_request", f"candidate {i} ({c[:40]!r}) adds no tokens")
        cand_ids.append(full[len(p_ids):])
    t_tok = time.perf_counter()
    P, M = len(p_ids), sum(len(t) for t in cand_ids)
    if P + M > runner.n_ctx:
        raise ReflexError("context_overflow", f"{P} prompt tokens + {M} candidate tokens exceed "
                          f"the context of {runner.n_ctx}")
    ex = runner.exec
    start = None
    if runner.pending is not None or runner.want_gpu is not None:
        from .runtime.executor import common_prefix

        held0 = 0 if sf is not None or not cache_prompt else min(common_prefix(ex.tokens, p_ids), P - 1)
        start = runner.start_request("system1", P - (sf.n_tokens if sf is not None else held0) + M, 0,
                                     one_pass=True)
        ex = runner.exec
    if sf is not None:
        t_imp = time.perf_counter()
        runner._restore(sf, room=P - sf.n_tokens + M)
        cache_prompt = True
        extra_out["kv_import"] = {"path": sf.path, "n_tokens": sf.n_tokens}
        extra_t["state_load"] = _ms(t_imp)
    # candidate c's token t is stored at slot P + offset_c + t, rotated at position P + t,
    # and sees the prompt and its own tokens up to itself; token t is predicted by the
    # prompt's last logits (t = 0), else by the row of its candidate's token t - 1
    owner = np.concatenate([np.full(len(t), c) for c, t in enumerate(cand_ids)])
    within = np.concatenate([np.arange(len(t)) for t in cand_ids])
    flat = np.concatenate([np.asarray(t, np.int64) for t in cand_ids])
    starts = within == 0
    key_pos = np.concatenate([np.arange(P), P + within])  # the position of every slot
    mine = (owner[:, None] == owner[None, :]) & (within[None, :] <= within[:, None])
    recurrent = ex.recurrent
    runner.f.release_metadata()  # what the request's set-up read of the vocabulary: not held
    held = ex.begin(p_ids, room=M, reuse=cache_prompt) if not recurrent else 0
    if not recurrent and P - held + M <= ex.chunk:
        # one pass over the prompt tokens not held and the candidates: the prompt causal,
        # candidates masked
        N = P - held + M
        allowed = np.zeros((N, P + M), dtype=bool)
        allowed[:P - held, :P] = np.arange(P)[None, :] <= np.arange(held, P)[:, None]
        allowed[P - held:, :P] = True
        allowed[P - held:, P:] = mine
        logits = ex.forward(np.concatenate([np.asarray(p_ids[held:], np.int64), flat]),
                            np.concatenate([np.arange(held, P), P + within]),
                            slots=np.arange(held, P + M), allowed=allowed, key_pos=key_pos,
                            rows=slice(P - held - 1, N), check=check)
        ex.state.tokens[:] = p_ids
        # row 0 is the prompt's last token, row r + 1 candidate token r
        lp_tok = runner.ops.logprobs(logits, np.where(starts, 0, np.arange(M)), flat, n=runner.n_vocab)
        t_prompt = time.perf_counter()
    else:
        # recurrent layers: the prompt's state computed once (sequence 0), then copied to
        # sequence j + 1 for the j-th candidate of a group of at most SEQ_GROUP (fork); a
        # group's candidates run as one batch, each from its own copy
        lp_tok = np.empty(M)
        C = len(cand_ids)
        group = min(C, SEQ_GROUP) if recurrent else C
        first, held = ex.prefill(p_ids, room=M, reuse=cache_prompt, check=check,
                                 n_seq=group + 1 if recurrent else 1)
        lp_tok[starts] = runner.ops.logprobs(first, np.zeros(int(starts.sum()), np.int64), flat[starts],
                                             n=runner.n_vocab)
        t_prompt = time.perf_counter()
        cstart = np.append(np.flatnonzero(starts), M)  # candidate c's tokens: cstart[c]..cstart[c+1]
        for c0 in range(0, C, group):
            c1 = min(C, c0 + group)
            seqs = None
            if recurrent:
                ex.state.fork(0, range(1, c1 - c0 + 1))
                seqs = owner - c0 + 1
            # batches of more than one chunk go in slot order, chunk by chunk: a token's keys
            # are all in its own or an earlier chunk
            for a in range(cstart[c0], cstart[c1], ex.chunk):
                e = min(cstart[c1], a + ex.chunk)
                allowed = np.zeros((e - a, P + e), dtype=bool)
                allowed[:, :P] = True
                allowed[:, P:] = mine[a:e, :e]
                rows = ex.forward(flat[a:e], key_pos[P + a:P + e], slots=P + np.arange(a, e),
                                  allowed=allowed, key_pos=key_pos[:P + e], check=check,
                                  seqs=None if seqs is None else seqs[a:e])
                r = np.arange(a, e)
                has_next = np.flatnonzero((r + 1 < M) & ~starts[np.minimum(r + 1, M - 1)])
                if has_next.size:
                    lp_tok[r[has_next] + 1] = runner.ops.logprobs(rows, has_next, flat[r[has_next] + 1],
                                                                  n=runner.n_vocab)
    t_eval = time.perf_counter()

    logprob = np.zeros(len(cand_ids))
    np.add.at(logprob, owner, lp_tok)
    # softmax of logprob / temperature, from differences to the best (<= 0): a tiny
    # temperature sends them to -inf, never to NaN
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        z = (logprob - logprob.max()) / temperature
    z = np.where(np.isnan(z), -np.inf, z)
    prob = np.exp(z)
    prob /= prob.sum()
    nz = prob[prob > 0]
    entropy = float(max(0.0, -(nz * np.log2(nz)).sum()))
    out = []
    for c, text in enumerate(candidates):
        n = len(cand_ids[c])
        out.append({"text": text, "token_ids": [int(x) for x in cand_ids[c]],
                    "logprob": float(logprob[c]), "mean_logprob": float(logprob[c] / n),
                    "probability": float(prob[c])})
    if kv_export is not None:
        saved = runner.save_state(kv_export)
        extra_t.update(saved.pop("timings"))
        extra_out["kv_export"] = saved
    t_end = time.perf_counter()
    from .runtime import prefixstore

    prefixstore.end(runner, extra_t)
    if start is not None:
        extra_out["start"] = {**start, "steps": [{"backend": runner.ops.name, "tokens": 1}]}
        extra_t.update({f"start_est_{k}": v for k, v in (start.get("est_ms") or {}).items()})
    return {
        **extra_out,
        "candidates": out,
        "best_idx": int(np.argmax(logprob)),
        "entropy": entropy,
        "prompt_tokens": P,
        "candidate_tokens": M,
        "cached_tokens": held,
        "timings": {"tokenize": _ms(t0, t_tok), "prompt_eval": _ms(t_tok, t_prompt),
                    "candidates_eval": _ms(t_prompt, t_eval), "total": _ms(t0, t_end), **extra_t},
    }
