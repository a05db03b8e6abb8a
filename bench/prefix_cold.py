#!/usr/bin/env python3
"""The prefix cache across processes (issue 29, targets 1, 2 and 4): fresh `reflex
generate --chat` / `reflex system1 --chat` processes whose prompt is a long system prompt
SYS (~2,000 tokens) plus a short question, on one backend, run as rounds of

  off     REFLEX_PREFIX_CACHE=0                        (the cold start without the cache)
  first   an empty cache folder (nothing matches): the prompt is evaluated, and its state
          written after the answer (by the detached child, off the caller's clock)
  second  the next process, same prompt, same folder (once the first one's write is done)

and, for the cache's cost on a plain cold start, a short prompt with the cache off / on
(`short_off`, `short_on`: nothing is looked up or saved for it, the process only detaches).
Variants alternate within a round (load on the shared machine cancels out). Timed from
just before spawn: the first token (the process's own launch-relative mark, generate), the
answer (first byte of stdout, the JSON), and exit. Writes one JSON: machine, commit, load
averages per round, every sample, and the ratios of the targets: first / second to the
first token (>= 5x), identical tokens, first / off (overhead, <= 2%).

    python3 bench/prefix_cold.py --out bench/results/prefix-cold-MACHINE-COMMIT.json
        [--model smollm2] [--device cpu] [--rounds 3] [--tokens 2000] [--reflex "CMD"]
"""

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reflex_ipc.commands.bench import GPU, machine_info, stats, timed_process  # noqa: E402

SENTENCES = [
    "You are the support assistant of a small hardware shop in a market town.",
    "The shop sells hand tools, garden tools, paint, screws, nails, hinges and locks.",
    "Opening hours are eight to six on weekdays and nine to one on Saturdays.",
    "Deliveries within the town are free for orders above forty euros.",
    "Returns are accepted within thirty days with the receipt, unused and in the box.",
    "Paint is mixed to order at the counter and cannot be returned once mixed.",
    "Keys are cut while the customer waits, for three euros a key.",
    "The shop does not repair power tools but sends them to the maker's service centre.",
    "Answer in one or two short sentences, politely, and never invent a product.",
    "When you do not know, say so and give the shop's phone number, 0123 456 789.",
]
QUESTION = "Can I return a tin of mixed paint?"
CANDIDATES = ["Yes", "No", "Maybe"]


def system_prompt(n_tokens):
    """About n_tokens of SmolLM2 tokens: the sentences, numbered, repeated."""
    out, i = [], 0
    while len(" ".join(out)) < n_tokens * 4.4:  # ~4.4 characters a token in this text
        out.append(f"Rule {i + 1}: {SENTENCES[i % len(SENTENCES)]}")
        i += 1
    return " ".join(out)


def segment_files(folder):
    n = tmp = 0
    for dirpath, _, names in os.walk(folder):
        n += sum(1 for x in names if x.endswith(".rxs"))
        tmp += sum(1 for x in names if x.endswith(".tmp"))
    return n, tmp


def wait_written(folder, want, timeout=300):
    """Until the first process's detached child has written its segments (want files)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        n, tmp = segment_files(folder)
        if n >= want and not tmp:
            return round((time.perf_counter() - t0) * 1e3, 1)
        time.sleep(0.02)
    raise SystemExit(f"the cache folder {folder} did not get its {want} segments in {timeout} s")


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--ops", default="generate,system1")
    ap.add_argument("--short-pairs", type=int, default=4)
    ap.add_argument("--no-chat", dest="chat", action="store_false",
                    help="plain prompts (for a model without a chat template)")
    ap.add_argument("--reflex", default=f"{shlex.quote(sys.executable)} -m reflex_ipc")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys_text = system_prompt(args.tokens)
    base = shlex.split(args.reflex)
    common = ["--device", args.device, "--model", args.model, "--json"]
    # with --chat the system prompt is a system message; without (a model with no chat
    # template), the prompt is the system text, a blank line and the question
    text = ["--chat", "--system", sys_text, QUESTION] if args.chat else [f"{sys_text}\n\n{QUESTION}"]
    argvs = {
        "generate": base + ["generate", *common, "--max-tokens", str(args.max_tokens), *text],
        "system1": base + ["system1", *common, *[x for c in CANDIDATES for x in ("--candidate", " " + c)],
                           *text],
        "short": base + ["generate", *common, "--max-tokens", "1", "Hi"],
    }
    ops = [o for o in args.ops.split(",") if o]
    work = tempfile.mkdtemp(prefix="reflex-prefix-bench-")
    samples = {f"{op}_{v}": [] for op in ops for v in ("off", "first", "second")}
    samples.update({"short_off": [], "short_on": []})
    rounds = []

    def run(name, argv, env_extra, folder):
        old = {k: os.environ.get(k) for k in env_extra}
        os.environ.update(env_extra)
        os.environ["REFLEX_PREFIX_CACHE_DIR"] = folder
        try:
            rec, out, err = timed_process(argv)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if rec["rc"] != 0:
            raise SystemExit(f"{name}: exit {rec['rc']}: {err[-2000:]}")
        res = json.loads(out)
        t = res["timings"]
        rec.update(first_token_ms=t.get("phases", {}).get("first_token"),
                   prompt_tokens=res.get("prompt_tokens"), cached_tokens=res.get("cached_tokens"),
                   prefix_cache_tokens=t.get("prefix_cache_tokens"),
                   prefix_cache_import_ms=t.get("prefix_cache_import"), prompt_eval_ms=t.get("prompt_eval"),
                   import_detail={k[len("prefix_cache_import_"):]: v for k, v in t.items()
                                  if k.startswith("prefix_cache_import_")} or None, phases=t.get("phases"),
                   cuda=t.get("cuda"),
                   tokens=res.get("token_ids") or [c["logprob"] for c in res.get("candidates", [])])
        samples[name].append(rec)
        return rec, res

    try:
        for r in range(args.rounds):
            info = {"round": r, "load_before": loadavg()}
            for op in ops:
                folder = os.path.join(work, f"{op}-{r}")
                os.makedirs(folder)
                run(f"{op}_off", argvs[op], {"REFLEX_PREFIX_CACHE": "0"}, folder)
                first, res = run(f"{op}_first", argvs[op], {}, folder)
                from reflex_ipc.runtime.prefixstore import block_size, bounds_of

                want = len(bounds_of(res["prompt_tokens"], block_size()))
                info[f"{op}_write_wait_ms"] = wait_written(folder, want)
                run(f"{op}_second", argvs[op], {}, folder)
                shutil.rmtree(folder, ignore_errors=True)
            folder = os.path.join(work, f"short-{r}")
            os.makedirs(folder)
            for _ in range(args.short_pairs):
                run("short_off", argvs["short"], {"REFLEX_PREFIX_CACHE": "0"}, folder)
                run("short_on", argvs["short"], {}, folder)
            info["load_after"] = loadavg()
            rounds.append(info)
            print(json.dumps(info), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(name, key):
        xs = [s[key] for s in samples[name] if s.get(key) is not None]
        return stats(xs)["p50"] if xs else None

    summary = {}
    for op in ops:
        key = "first_token_ms" if op == "generate" else "first_byte_ms"
        pairs = list(zip(samples[f"{op}_first"], samples[f"{op}_second"]))
        summary[op] = {
            "answer_key": key,
            "off_ms": med(f"{op}_off", key), "first_ms": med(f"{op}_first", key),
            "second_ms": med(f"{op}_second", key),
            "speedup_pairs": [round(a[key] / b[key], 2) for a, b in pairs],
            "identical_tokens": all(a["tokens"] == b["tokens"] == o["tokens"] for (a, b), o in
                                    zip(pairs, samples[f"{op}_off"])),
            "overhead_first_vs_off_to_answer": [round(a[key] / o[key] - 1, 4) for a, o in
                                                zip(samples[f"{op}_first"], samples[f"{op}_off"])],
            "overhead_first_vs_off_to_exit": [round(a["wall_ms"] / o["wall_ms"] - 1, 4) for a, o in
                                              zip(samples[f"{op}_first"], samples[f"{op}_off"])],
            "second_prefix_cache_tokens": [b["prefix_cache_tokens"] for _, b in pairs],
            "second_import_ms": [b["prefix_cache_import_ms"] for _, b in pairs],
            "prompt_tokens": samples[f"{op}_first"][0]["prompt_tokens"],
        }
    summary["short"] = {
        "off_exit_ms": med("short_off", "wall_ms"), "on_exit_ms": med("short_on", "wall_ms"),
        "overhead_to_exit": [round(a["wall_ms"] / o["wall_ms"] - 1, 4)
                             for a, o in zip(samples["short_on"], samples["short_off"])],
        "overhead_to_first_token": [round(a["first_token_ms"] / o["first_token_ms"] - 1, 4)
                                    for a, o in zip(samples["short_on"], samples["short_off"])],
    }
    doc = {"bench": "prefix_cold", "machine": machine_info(GPU()), "args": vars(args), "rounds": rounds,
           "summary": summary, "samples": {k: [{kk: vv for kk, vv in s.items() if kk != "tokens"} for s in v]
                                           for k, v in samples.items()}}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
