"""gpu-check's `engine` section: the Runner on a device backend (CUDA) against the numpy
backend on the same GGUFs (the parity fixtures of tests/data and every synthetic.TINY_CONFIGS
model), and its captured graphs against its own eager path. Moved here from the pytest suite,
where it could only be skipped (no GPU in CI): it runs where the GPU is.

    PYTHONPATH=. python3 scripts/gpu/gpu_check_engine.py [--device cuda]   (PASS/FAIL per check)

Checks: logits / greedy / system1 / embeddings against numpy (greedy may part only at a
near-tie of numpy's top two); decode graphs (greedy, sampled, penalized) = eager steps; forward
graph replays (system1 and prefill, candidates permuted) = the eager first call; bucketed
graphs serve prompts of other lengths with numpy's answers."""

import glob
import os
import sys
import tempfile
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
PROMPTS = ["The capital of France is",
           "Hello world, this is a somewhat longer prompt that passes a small sliding window"]
CANDS = [" Paris", " London is big", " a city"]


def model_paths(folder):
    """The parity fixtures and the tiny models (written into folder, SmolLM2's tokenizer from
    the llama fixture)."""
    from reflex_ipc.testing.synthetic import TINY_CONFIGS, tiny_gguf

    paths = sorted(glob.glob(os.path.join(DATA, "synthetic-*.gguf")))
    tok = os.path.join(DATA, "synthetic-llama.gguf")
    for name, cfg in TINY_CONFIGS.items():
        p = os.path.join(folder, f"{name}.gguf")
        tiny_gguf(p, tokenizer=tok, **cfg)
        paths.append(p)
    return paths


def _near_tie_or_same(ref, text, ga, gb, name):
    if ga != gb:  # allowed only where the reference's top two were within the logit error
        ids = ref.tokenize(text, add_bos=None)
        k = next(i for i, (x, y) in enumerate(zip(ga, gb)) if x != y)
        z = np.sort(np.asarray(ref.prompt_logits(ids + ga[:k]), np.float64).reshape(-1))
        assert z[-1] - z[-2] < 2e-2 * np.abs(z).max(), (name, text, k, ga, gb)


def check_matches_numpy(pairs):
    for name, (ref, dev) in pairs.items():
        for text in PROMPTS:
            ids = ref.tokenize(text, add_bos=None)
            a, b = ref.prompt_logits(ids), dev.prompt_logits(ids)
            err = float(np.abs(a - b).max() / np.abs(a).max())
            assert err < 1e-2, (name, text, err)
            _near_tie_or_same(ref, text, ref.generate(text, max_tokens=12)["token_ids"],
                              dev.generate(text, max_tokens=12)["token_ids"], name)
            sa = [c["logprob"] for c in ref.system1(text, CANDS)["candidates"]]
            sb = [c["logprob"] for c in dev.system1(text, CANDS)["candidates"]]
            np.testing.assert_allclose(sb, sa, atol=5e-2 + 1e-2 * np.abs(sa).max())
            ea = np.array(ref.embed([text])["embeddings"][0])
            eb = np.array(dev.embed([text])["embeddings"][0])
            np.testing.assert_allclose(eb, ea, atol=1e-2 * np.abs(ea).max())


def check_graph_decoder_equals_eager_steps(pairs):
    """Decode steps replayed from the captured graph give the eager path's tokens."""
    for name, (_, dev) in pairs.items():
        ex = dev.exec
        if not ex.use_graphs:
            continue
        for kw in (dict(max_tokens=16), dict(max_tokens=16, temperature=0.9, seed=3, top_k=40),
                   dict(max_tokens=16, repeat_penalty=1.3)):
            a = dev.generate(PROMPTS[0], cache_prompt=False, **kw)["token_ids"]
            ex._drop_graphs()
            ex.use_graphs = False
            try:
                b = dev.generate(PROMPTS[0], cache_prompt=False, **kw)["token_ids"]
            finally:
                ex.use_graphs = True
            assert a == b, (name, kw, a, b)


def check_forward_graph_replays_equal_eager(pairs):
    """system1 and the prefill replayed from captured graphs (the second and later calls of a
    shape) give what the eager first call gives, with each call's own data: the same shape
    with the candidates permuted must permute the answers."""
    perm = [2, 0, 1]
    for name, (_, dev) in pairs.items():
        if not dev.exec.use_forward_graphs:
            continue
        dev.exec._drop_graphs()
        for text in PROMPTS:
            eager = [c["logprob"] for c in dev.system1(text, CANDS)["candidates"]]
            for _ in range(3):
                got = [c["logprob"] for c in dev.system1(text, CANDS)["candidates"]]
                np.testing.assert_allclose(got, eager, rtol=0, atol=1e-4 * max(1.0, np.abs(eager).max()))
                swapped = [c["logprob"] for c in dev.system1(text, [CANDS[i] for i in perm])["candidates"]]
                np.testing.assert_allclose(swapped, [eager[i] for i in perm], rtol=0,
                                           atol=1e-3 * max(1.0, np.abs(eager).max()))
            first = dev.generate(text, max_tokens=4)["token_ids"]
            for _ in range(3):
                assert dev.generate(text, max_tokens=4)["token_ids"] == first, name
        fg = dev.exec._graphs
        assert fg is not None and fg.captures >= 2 and fg.replays >= 10, (name, fg and fg.captures, fg and fg.replays)


def check_bucketed_graphs_serve_prompts_of_other_lengths(pairs):
    """Prompts of different lengths share a bucket's graph (padding tokens first, stored
    after the real ones): each answer still matches numpy's."""
    prompts = ["The capital of France is", "So the capital of France is", "Tell me: the capital of France is",
               "Well, so tell me: the capital of France is"]
    for name, (ref, dev) in pairs.items():
        if not dev.exec.use_forward_graphs:
            continue
        dev.exec._drop_graphs()
        for _ in range(2):
            for text in prompts:
                sa = [c["logprob"] for c in ref.system1(text, CANDS)["candidates"]]
                sb = [c["logprob"] for c in dev.system1(text, CANDS)["candidates"]]
                np.testing.assert_allclose(sb, sa, atol=5e-2 + 1e-2 * np.abs(sa).max())
                _near_tie_or_same(ref, text, ref.generate(text, max_tokens=3)["token_ids"],
                                  dev.generate(text, max_tokens=3)["token_ids"], name)
        fg = dev.exec._graphs
        # 4 prompts of nearby lengths fall in one or two buckets: far fewer captures than calls
        assert fg.captures <= 4 and fg.replays >= 8, (name, fg.captures, fg.replays, list(fg.entries))


CHECKS = [check_matches_numpy, check_graph_decoder_equals_eager_steps, check_forward_graph_replays_equal_eager,
          check_bucketed_graphs_serve_prompts_of_other_lengths]


def run(device="cuda"):
    """{"ok", "checks": [{name, ok, error?}], "models"}: every check on every model."""
    from reflex_ipc.engine import load_runner

    out = []
    with tempfile.TemporaryDirectory() as d:
        paths = model_paths(d)
        pairs = {}
        try:
            for p in paths:
                pairs[os.path.basename(p)] = (load_runner(p, device="numpy", n_ctx=256),
                                              load_runner(p, device=device, n_ctx=256))
                assert pairs[os.path.basename(p)][1].ops.name == device
            for fn in CHECKS:
                try:
                    fn(pairs)
                    out.append({"name": fn.__name__, "ok": True})
                except Exception as e:
                    out.append({"name": fn.__name__, "ok": False,
                                "error": "".join(traceback.format_exception(e))[-2500:]})
        finally:
            for a, b in pairs.values():
                a.close()
                b.close()
    return {"ok": bool(out) and all(c["ok"] for c in out), "checks": out, "models": sorted(pairs)}


if __name__ == "__main__":
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    rep = run(dev)
    for c in rep["checks"]:
        print(("PASS " if c["ok"] else "FAIL ") + c["name"] + ("" if c["ok"] else "\n" + c["error"]), flush=True)
    sys.exit(0 if rep["ok"] else 1)
