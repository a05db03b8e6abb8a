"""embed: pooled final hidden states of texts (the protocol's embed, on a Runner)."""

from __future__ import annotations

import time

from .errors import ReflexError


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def embed(runner, texts, *, pooling="mean", normalize=False, should_cancel=None, prefix_cache=True) -> dict:
    """Pooled final hidden states (after the final norm) of each text: the mean over its
    tokens, the last token's, or the first token's ("cls"); L2-normalized on request.
    With "last" pooling only the last token's hidden state counts, so the prefix cache
    (prefix_cache) and the state the previous request left give the leading tokens'."""
    import numpy as np

    t0 = time.perf_counter()
    if pooling not in ("mean", "last", "cls"):
        raise ReflexError("invalid_request", f"pooling must be mean, last or cls, not {pooling!r}")
    if isinstance(texts, str):
        texts = [texts]
    if not len(texts):
        raise ReflexError("invalid_request", "no texts to embed")
    check = runner._checker(should_cancel)
    vectors, n_tokens = [], []
    all_ids = []
    tail_only = pooling == "last"
    from .runtime import prefixstore

    prefixstore.begin(runner, prefix_cache and tail_only)  # the last text's prompt is saved
    timings = {}
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ReflexError("invalid_request", f"text {i} is not a string")
        ids = runner.tok.encode(text)
        if not ids:
            raise ReflexError("invalid_request", f"text {i} is empty (no tokens)")
        if len(ids) > runner.n_ctx:
            raise ReflexError("context_overflow", f"text {i}: {len(ids)} tokens exceed the "
                              f"context of {runner.n_ctx}")
        all_ids.append(ids)
    start = runner.start_request("embed", sum(len(x) for x in all_ids), 0, one_pass=True)
    for ids in all_ids:
        acc = first = last = None
        for h in runner.exec.hidden(ids, check=check, reuse=tail_only):
            h = runner.ops.to_numpy(h).astype(np.float64)
            acc = h.sum(axis=0) if acc is None else acc + h.sum(axis=0)
            first = h[0] if first is None else first
            last = h[-1]
        v = {"mean": acc / len(ids), "last": last, "cls": first}[pooling]
        if normalize:
            norm = np.linalg.norm(v)
            v = v / norm if norm > 0 else v
        vectors.append(v.astype(np.float32).tolist())
        n_tokens.append(len(ids))
    t_end = time.perf_counter()
    prefixstore.end(runner, timings)
    out = {"embeddings": vectors, "dim": len(vectors[0]), "n_tokens": n_tokens,
           "timings": {"total": _ms(t0, t_end), **timings}}
    if start is not None:
        start = {**start, "steps": [{"backend": runner.ops.name, "tokens": len(all_ids)}]}
        for k, v in (start.get("est_ms") or {}).items():
            out["timings"][f"start_est_{k}"] = v
        out["start"] = start
    return out
