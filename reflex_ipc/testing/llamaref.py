"""llama.cpp (llama-cpp-python) as the reference of the architecture tests (tests/arch): its logits,
greedy continuations and the rounding noise of its quantized runs, on the files
reflex_ipc.testing.synthetic writes. One Llama per (file, settings) is kept open per process
(`close_all` at the end of a session)."""

import numpy as np

F32_KV = dict(type_k=0, type_v=0)  # GGML_TYPE_F32: no rounding of the K/V cache
_LLMS = {}


def llm(llama_cpp, path, n_ctx=256, **kw):
    """A reset llama_cpp.Llama on path (every row's logits kept), shared per settings."""
    key = (str(path), n_ctx, tuple(sorted(kw.items())))
    if key not in _LLMS:
        _LLMS[key] = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                                     n_threads=1, n_threads_batch=1, verbose=False, **kw)
    m = _LLMS[key]
    m.reset()
    return m


def close_all():
    for m in _LLMS.values():
        m.close()
    _LLMS.clear()


def logits(llama_cpp, path, ids, n_ctx=256, **kw):
    """float64 logits of every row of ids (F32 K/V cache unless kw says otherwise)."""
    m = llm(llama_cpp, path, n_ctx, **{**F32_KV, **kw})
    m.eval(list(ids))
    return np.array(m.scores[:len(ids)], dtype=np.float64)


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def greedy_check(llama_cpp, path, prompt_ids, got, eog_ids, tie, n_ctx=256, **kw):
    """Our greedy tokens `got` after prompt_ids against llama.cpp's, one decode at a time: (ok,
    message, llama.cpp's tokens up to a divergence). A divergence passes only where llama.cpp's
    chosen token is within tie * max|logit| of ours (a near-tie either side may break); the rest
    is then not compared."""
    m = llm(llama_cpp, path, n_ctx, **{**F32_KV, **kw})
    m.eval(list(prompt_ids))
    theirs = []
    for step, tok in enumerate(got):
        z = np.array(m.scores[m.n_tokens - 1], dtype=np.float64)
        want = int(np.argmax(z))
        if tok != want:
            ok = z[want] - z[tok] < tie * np.abs(z).max()
            return ok, f"step {step}: {tok} != llama.cpp's {want} ({(z[want] - z[tok]) / np.abs(z).max():.3g} of " \
                       f"max|logit| apart, tie {tie})", theirs
        theirs.append(want)
        if want in eog_ids:
            break
        m.eval([want])
    return True, "identical", theirs


def steps(llama_cpp, m, ids, n):
    """llama.cpp's logits after ids and its greedy continuation of n tokens, one token per decode:
    per step the token, top-2 gap, max|logit|, end of generation, top 5 and the whole row (the
    format of scripts/fixtures/record_goldens.py, parity.greedy_verdict's)."""
    vocab, n_vocab = m._model.vocab, m.n_vocab()

    def last():
        ptr = llama_cpp.llama_get_logits_ith(m.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float64, copy=True)

    m.reset()
    m.eval(list(ids))
    z = first = last()
    out = []
    for _ in range(n):
        order = np.argsort(-z, kind="stable")[:5]
        tok = int(order[0])
        out.append({"token": tok, "gap": float(z[order[0]] - z[order[1]]), "max_abs": float(np.abs(z).max()),
                    "eog": bool(llama_cpp.llama_vocab_is_eog(vocab, tok)),
                    "top5": [[int(t), float(z[t])] for t in order], "row": z})
        m.eval([tok])
        z = last()
    return first, out


_QUANT = {}


def quantized_reference(llama_cpp, path, ids, n_steps, n_ctx=256):
    """llama.cpp on a quantized file (its default F16 K/V cache) and on its F32 twin
    (path + '.twin.gguf', F32 K/V cache): {"quant": (logits after ids, greedy steps), "exact": the
    same, "noise": max|quantized - exact| / max|logit| after ids, "noise_top": the same over the
    20 best tokens}."""
    key = (str(path), tuple(ids), n_steps)
    if key not in _QUANT:
        g = {}
        for name, p, kw in (("quant", str(path), {}), ("exact", f"{path}.twin.gguf", F32_KV)):
            m = llama_cpp.Llama(p, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1, n_threads_batch=1,
                                verbose=False, **kw)
            try:
                g[name] = steps(llama_cpp, m, ids, n_steps)
            finally:
                m.close()
        q, x = g["quant"][0], g["exact"][0]
        d = np.abs(q - x) / np.abs(q).max()
        _QUANT[key] = dict(g, noise=float(d.max()), noise_top=float(d[np.argsort(-q)[:20]].max()))
    return _QUANT[key]
