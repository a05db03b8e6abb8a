#!/usr/bin/env python3
"""The prefix store's import alone (issue 29, target 3's bound): the pipelined import
(runtime/stateimport.py: jobs of whole arrays read, checked and copied on several threads)
against the file-by-file one it replaced (StateFile.restore per segment, still the way
when dtypes differ), in one process, alternating, on one backend. A fresh runner per
sample (as a fresh process has), the store written once by an earlier request; each
sample is one `generate` of 1 token whose prompt's segments are all saved. Reports the
import's ms (`prefix_cache_import`) and the request's wall time. Writes one JSON.

    python3 bench/prefix_import.py --out bench/results/prefix-import-MACHINE-COMMIT.json
        [--model smollm2] [--device cpu] [--rounds 8] [--tokens 2000]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reflex_ipc.commands.bench import GPU, machine_info, stats  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench"))
from prefix_cold import QUESTION, system_prompt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="reflex-prefix-import-")
    os.environ["REFLEX_PREFIX_CACHE_DIR"] = work
    os.environ.pop("REFLEX_PREFIX_CACHE", None)
    from reflex_ipc import settings

    settings.reset()
    from reflex_ipc.engine import load_runner
    from reflex_ipc.runtime import prefixstore, stateimport

    prompt = f"{system_prompt(args.tokens)}\n\n{QUESTION}"
    samples = {"pipelined": [], "file_by_file": []}
    compatible = stateimport.compatible

    def one(way):
        stateimport.compatible = compatible if way == "pipelined" else (lambda state, files: False)
        try:
            r = load_runner(args.model, device=args.device)
            try:
                t = time.perf_counter()
                out = r.generate(prompt, max_tokens=1)
                wall = (time.perf_counter() - t) * 1e3
            finally:
                prefixstore.PENDING.clear()
                r.close()
        finally:
            stateimport.compatible = compatible
        tm = out["timings"]
        return {"import_ms": tm.get("prefix_cache_import"), "tokens": tm.get("prefix_cache_tokens"),
                "request_ms": round(wall, 2),
                "detail": {k[len("prefix_cache_import_"):]: v for k, v in tm.items() if k.startswith("prefix_cache_import_")},
                "prompt_tokens": out["prompt_tokens"], "token_ids": out["token_ids"]}

    try:
        r = load_runner(args.model, device=args.device)
        try:
            ref = r.generate(prompt, max_tokens=1, prefix_cache=True)  # evaluates and queues the segments
            prefixstore.flush()
        finally:
            r.close()
        for i in range(args.rounds):
            for way in (("pipelined", "file_by_file") if i % 2 == 0 else ("file_by_file", "pipelined")):
                s = one(way)
                assert s["token_ids"] == ref["token_ids"] and s["tokens"] == s["prompt_tokens"] - 1, s
                samples[way].append(s)
                print(way, s["import_ms"], s["request_ms"], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {w: {"import_ms": stats([s["import_ms"] for s in v]), "request_ms": stats([s["request_ms"] for s in v])}
               for w, v in samples.items()}
    summary["import_ratio_p50"] = round(summary["file_by_file"]["import_ms"]["p50"]
                                        / summary["pipelined"]["import_ms"]["p50"], 2)
    summary["detail"] = samples["pipelined"][0]["detail"]
    summary["prompt_tokens"] = samples["pipelined"][0]["prompt_tokens"]
    doc = {"bench": "prefix_import", "machine": machine_info(GPU()),
           "args": vars(args), "loadavg": os.getloadavg(), "summary": summary,
           "samples": {w: [{k: v for k, v in s.items() if k != "token_ids"} for s in v] for w, v in samples.items()}}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
