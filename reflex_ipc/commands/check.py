"""reflex check: greedy generation checked against a reference, for CI pipelines.

For every PROMPT it runs greedy generation and records, per step, the chosen token,
the K largest logits (ids and values), max|logit| and the gap between the two best.
`--write-reference FILE` writes that record (protocol/CHECK.md documents the format);
`--reference FILE` compares against one: token ids must match, except where the
reference's own top-2 gap at the first differing step is under the tolerance (a near
tie: reported, and the rest of that prompt is not compared); the logits of matching
steps must agree within the tolerance relative to the reference's max|logit|. A reference
that disagrees with itself (its token_ids not its steps' tokens, a step's token not the
best of its own logits, a gap that is not top-1 minus top-2) is refused (exit 2).

Exit status: 0 pass, 1 mismatch (the report names prompt, step, ids, gap), 2 usage or
input error (bad arguments, an unreadable reference, a reference of another model).
"""

import sys

FORMAT = "reflex-check"
FORMAT_VERSION = 1
TOP_K = 8


EXAMPLES = """\
  reflex check --device numpy --write-reference ref.json "The capital of France is"
  reflex check --device cpu --reference ref.json     (the same prompts; exit 1 on a mismatch)"""


def add_arguments(p):
    p.add_argument("--model", metavar="MODEL", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    from ..ops import DEVICES

    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="backend (default: %(default)s)")
    p.add_argument("--n-ctx", type=int, default=None, metavar="N", help="context size (default: min(train, 4096))")
    p.add_argument("--max-tokens", type=int, default=16, metavar="N", help="greedy tokens per prompt (default: %(default)s)")
    p.add_argument("--reference", metavar="FILE", help="compare against this reference")
    p.add_argument("--write-reference", metavar="FILE", help="write this run's record as a reference")
    p.add_argument("--tolerance", type=float, default=1e-2, metavar="X",
                   help="logit tolerance relative to max|logit|, and the near-tie gap (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON summary on stdout")
    p.add_argument("prompt", nargs="*", metavar="PROMPT",
                   help="prompts (none, or '-': one prompt read from stdin)")


class InputError(Exception):
    """Exit status 2."""


def record(runner, prompts, max_tokens):
    """The run's record: what a reference file holds."""
    import numpy as np

    from .. import __version__

    out = []
    for text in prompts:
        steps = []

        digest = []

        def on_logits(step, row):
            if step == 0:
                import hashlib

                digest.append(hashlib.blake2b(np.ascontiguousarray(row, np.float32).tobytes(),
                                              digest_size=8).hexdigest())
            top = np.argsort(-row, kind="stable")[:TOP_K]
            # the backend that computed this step: with device auto on a CUDA host the first
            # steps may be the cpu backend's and the rest CUDA's (engine: start on the CPU)
            steps.append({"backend": runner.ops.name,
                          "top_ids": [int(i) for i in top], "top_logits": [float(row[i]) for i in top],
                          "max_abs_logit": float(np.abs(row).max()),
                          "gap": float(row[top[0]] - row[top[1]]) if len(top) > 1 else None})

        res = runner.generate(text, max_tokens=max_tokens, temperature=0.0, on_logits=on_logits,
                              cache_prompt=False)
        ids = res["token_ids"]
        for st, tid in zip(steps, ids + [None] * len(steps)):
            st["token_id"] = tid if tid is not None else st["top_ids"][0]
            st["text"] = runner.tok.token_bytes(st["token_id"]).decode("utf-8", "replace")
        out.append({"prompt": text, "prompt_tokens": res["prompt_tokens"], "token_ids": ids,
                    "backends": _runs(st["backend"] for st in steps),
                    "text": res["text"], "finish_reason": res["finish_reason"],
                    "first_logits_digest": digest[0] if digest else None, "steps": steps})
    info = runner.info()
    return {"format": FORMAT, "version": FORMAT_VERSION, "engine": f"reflex-ipc {__version__}",
            "model": {"identity": runner.f.identity(), "name": info.get("model"),
                      "architecture": info.get("architecture"), "path": info.get("path")},
            "backend": info.get("backend"), "device": info.get("device"), "max_tokens": max_tokens,
            "top_k": TOP_K, "prompts": out}


def _runs(names):
    """[{"backend", "steps"}]: consecutive steps of one backend, in order."""
    out = []
    for n in names:
        if out and out[-1]["backend"] == n:
            out[-1]["steps"] += 1
        else:
            out.append({"backend": n, "steps": 1})
    return out


def load_reference(path):
    import json

    try:
        with open(path, "rb") as fh:
            ref = json.loads(fh.read())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the reference {path}: {e}") from None
    if not isinstance(ref, dict) or ref.get("format") != FORMAT or not isinstance(ref.get("prompts"), list):
        raise InputError(f"{path} is not a reflex check reference (format {FORMAT!r})")
    if ref.get("version") != FORMAT_VERSION:
        raise InputError(f"{path}: reference format version {ref.get('version')!r}, this reflex reads "
                         f"{FORMAT_VERSION}")
    return ref


def _num(x):
    import math

    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_reference(ref, path="the reference"):
    """InputError unless every prompt of the reference agrees with itself: each step's
    token is the best of its own top logits (sorted, finite, gap = top-1 - top-2), its
    token_ids are its steps' tokens (one step more when generation stopped at an
    end-of-generation token), max_abs_logit covers the top logits."""
    if not isinstance(ref.get("model"), dict):
        raise InputError(f"{path}: `model` is missing")
    for i, p in enumerate(ref["prompts"]):
        where = f"{path}: prompt {i}"
        if not isinstance(p, dict) or not isinstance(p.get("prompt"), str):
            raise InputError(f"{where} is not an object with a `prompt`")
        ids, steps = p.get("token_ids"), p.get("steps")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise InputError(f"{where}: token_ids is not a list of token ids")
        if not isinstance(steps, list) or len(steps) not in (len(ids), len(ids) + 1):
            raise InputError(f"{where}: {len(steps) if isinstance(steps, list) else 'no'} steps for "
                             f"{len(ids)} token_ids (the reference disagrees with itself)")
        for k, st in enumerate(steps):
            w = f"{where}, step {k}"
            top, lg = st.get("top_ids") if isinstance(st, dict) else None, st.get("top_logits")                 if isinstance(st, dict) else None
            if not (isinstance(top, list) and isinstance(lg, list) and len(top) == len(lg) >= 2
                    and all(isinstance(t, int) for t in top) and all(_num(x) for x in lg)
                    and len(set(top)) == len(top)):
                raise InputError(f"{w}: top_ids/top_logits are not two or more ids and finite logits")
            if any(a < b for a, b in zip(lg, lg[1:])):
                raise InputError(f"{w}: top_logits are not in descending order")
            tid = st.get("token_id")
            if tid not in top or lg[top.index(tid)] != lg[0]:
                raise InputError(f"{w}: token_id {tid!r} is not the best of its top logits "
                                 f"(top {top[:2]}) (the reference disagrees with itself)")
            if k < len(ids) and ids[k] != tid:
                raise InputError(f"{where}: token_ids[{k}] is {ids[k]} but step {k} chose {tid} "
                                 f"(the reference disagrees with itself)")
            gap, mx = st.get("gap"), st.get("max_abs_logit")
            if not (_num(gap) and abs(gap - (lg[0] - lg[1])) <= 1e-6 * max(1.0, abs(lg[0]))):
                raise InputError(f"{w}: gap {gap!r} is not top-1 minus top-2 ({lg[0] - lg[1]})")
            if not (_num(mx) and mx > 0 and mx >= max(abs(lg[0]), abs(lg[-1])) * (1 - 1e-6)):
                raise InputError(f"{w}: max_abs_logit {mx!r} does not cover its top logits")


def compare(ref, run, tol):
    """[(prompt index, verdict dict)] and whether everything passed."""
    validate_reference(ref)
    if ref["model"].get("identity") not in (None, run["model"]["identity"]):
        raise InputError(f"the reference is of another model (identity {ref['model'].get('identity')}, "
                         f"{ref['model'].get('name')!r}); this model is {run['model']['identity']} "
                         f"({run['model']['name']!r})")
    by_prompt = {p["prompt"]: p for p in ref["prompts"]}
    reports, ok = [], True
    for i, p in enumerate(run["prompts"]):
        rp = by_prompt.get(p["prompt"])
        if rp is None:
            raise InputError(f"prompt {i} ({p['prompt'][:40]!r}) is not in the reference")
        v = {"prompt": p["prompt"], "status": "pass", "steps_compared": 0, "max_logit_err": 0.0}
        for s, (a, b) in enumerate(zip(rp["steps"], p["steps"])):
            if not a.get("max_abs_logit", 0) > 0 or len(a.get("top_ids") or ()) < 2:
                raise InputError(f"the reference's step {s} of prompt {i} has no logits (all zero or missing)")
            scale = a["max_abs_logit"]
            ours = dict(zip(b["top_ids"], b["top_logits"]))
            if a["token_id"] != b["token_id"]:
                if a["gap"] is not None and a["gap"] < tol * scale:
                    v.update(status="near_tie", step=s, ref_token=a["token_id"], token=b["token_id"],
                             ref_gap=a["gap"])
                else:
                    v.update(status="token_mismatch", step=s, ref_token=a["token_id"], token=b["token_id"],
                             ref_gap=a["gap"])
                break
            # the logits of the reference's top-k that are also in ours (a top-k member of one
            # and not the other differs by at least the k-th gap, which the values show)
            err = max((abs(ours[t] - x) for t, x in zip(a["top_ids"], a["top_logits"]) if t in ours),
                      default=0.0)
            missing = [t for t in a["top_ids"][:2] if t not in ours]
            v["steps_compared"] = s + 1
            v["max_logit_err"] = max(v["max_logit_err"], err / scale)
            if err > tol * scale or missing:
                v.update(status="logit_mismatch", step=s, logit_err=err / scale, tolerance=tol)
                break
        else:
            if len(rp["steps"]) != len(p["steps"]) and v["status"] == "pass":
                v.update(status="length_mismatch", ref_steps=len(rp["steps"]), steps=len(p["steps"]))
        if v["status"] == "pass" and rp["token_ids"] != p["token_ids"]:  # the ids, not only the steps
            a, b = rp["token_ids"], p["token_ids"]
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            v.update(status="token_mismatch", step=k, ref_token=a[k] if k < len(a) else None,
                     token=b[k] if k < len(b) else None, ref_gap=None)
        v["backends"] = p.get("backends")
        if v["status"] not in ("pass", "near_tie"):
            ok = False
        reports.append(v)
    return reports, ok


def _prompts(args):
    if not args.prompt or args.prompt == ["-"]:
        text = sys.stdin.read()
        if not text:
            raise InputError("no prompt given (arguments or stdin)")
        return [text]
    return list(args.prompt)


def run(args) -> int:
    import json

    from ..errors import ReflexError

    def fail(kind, msg, code):
        if args.json:
            sys.stdout.write(json.dumps({"ok": False, "error": {"kind": kind, "message": msg}}) + "\n")
        else:
            sys.stderr.write(f"reflex check: {msg}\n")
        return code

    try:
        if args.max_tokens < 1:
            raise InputError(f"--max-tokens must be at least 1, not {args.max_tokens}")
        if not args.tolerance >= 0:
            raise InputError(f"--tolerance must be >= 0, not {args.tolerance}")
        prompts = _prompts(args)
        ref = load_reference(args.reference) if args.reference else None
        from ._model import load

        model, _ = load(args)
        rec = record(model.runner, prompts, args.max_tokens)
        reports, ok = compare(ref, rec, args.tolerance) if ref is not None else ([], True)
    except InputError as e:
        return fail("invalid_request", str(e), 2)
    except ReflexError as e:
        return fail(e.kind, e.message, 2 if e.kind in ("invalid_request", "model_not_found", "gguf_error",
                                                       "unsupported_architecture", "context_overflow") else 1)
    if args.write_reference:
        import os

        tmp = f"{args.write_reference}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(rec, fh, ensure_ascii=False, indent=1)
            fh.write("\n")
        os.replace(tmp, args.write_reference)
    summary = {"ok": ok, "model": rec["model"], "backend": rec["backend"], "device": rec["device"],
               "tolerance": args.tolerance, "compared": ref is not None,
               "prompts": reports or [{"prompt": p["prompt"], "token_ids": p["token_ids"]} for p in rec["prompts"]]}
    if args.json:
        sys.stdout.write(json.dumps(summary, ensure_ascii=False) + "\n")
    else:
        for p in rec["prompts"]:
            first = p["steps"][0] if p["steps"] else None
            sys.stdout.write(f"{p['prompt'][:60]!r}: {len(p['token_ids'])} tokens {p['token_ids']}\n"
                             f"  text {p['text']!r}\n  steps by backend: "
                             + ", ".join(f"{b['backend']} x{b['steps']}" for b in p["backends"]) + "\n")
            if first:
                sys.stdout.write(f"  first step: top {first['top_ids'][:4]} logits "
                                 f"{[round(x, 4) for x in first['top_logits'][:4]]} gap {first['gap']:.4f}; "
                                 f"logits digest {p['first_logits_digest']}\n")
        for v in reports:
            detail = {k: x for k, x in v.items() if k not in ("prompt", "status")}
            sys.stdout.write(f"{v['status'].upper()}: {v['prompt'][:60]!r} {detail}\n")
        if ref is not None:
            sys.stdout.write("check passed\n" if ok else "check FAILED\n")
    return 0 if ok else 1
