#!/usr/bin/env python3
"""What the state file checksums cost next to the import (issue 32, item 1): a SmolLM2
state of N tokens (float16, cpu backend) is saved once, then imported R times into a
fresh state (`Runner.load_state`: open, header, pread into private memory, CRC-32 of
every array, write into the state); separately, R times, the CRC-32 pass alone over the
same arrays (statefile.crc32_many: on up to 4 threads from 8 MiB on) and single-threaded.
Alternating, so load on the shared machine hits both alike. Writes one JSON.

    python3 bench/statefile_crc.py --out bench/results/statefile-crc-MACHINE-COMMIT.json [--tokens 2000]
"""

import argparse
import json
import os
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reflex_ipc.commands.bench import GPU, machine_info, stats  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ["REFLEX_PREFIX_CACHE"] = "0"
    from reflex_ipc.engine import load_runner
    from reflex_ipc.runtime import statefile

    r = load_runner(a.model, device=a.device, n_ctx=4096)
    ids = [(i * 7919) % 40000 + 100 for i in range(a.tokens)]
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s.state")
    r.generate(ids, max_tokens=1, kv_export=path)
    size = os.path.getsize(path)
    with statefile.StateFile(path) as sf:
        entries = [e for _, arr in sf.layers for e in arr]
        views = sf.read(entries)
        bufs = [memoryview(views[id(e)]).cast("B") for e in entries]
    load, crc, crc1, loadavg = [], [], [], []
    for _ in range(a.runs):
        r.exec.forget()
        t0 = time.perf_counter()
        r.load_state(path)
        load.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        statefile.crc32_many(bufs)
        crc.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        for b in bufs:
            zlib.crc32(b)
        crc1.append((time.perf_counter() - t0) * 1e3)
        loadavg.append(os.getloadavg()[0])
    r.close()
    os.unlink(path)
    out = {"bench": "statefile_crc", "machine": machine_info(GPU()), "args": vars(a), "state_bytes": size,
           "load_ms": stats(load), "crc_ms": stats(crc), "crc_one_thread_ms": stats(crc1),
           "crc_share_of_import_p50": round(stats(crc)["p50"] / stats(load)["p50"], 4),
           "loadavg_1min": loadavg, "samples": {"load_ms": load, "crc_ms": crc, "crc_one_thread_ms": crc1}}
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps({k: out[k] for k in ("state_bytes", "load_ms", "crc_ms", "crc_one_thread_ms",
                                          "crc_share_of_import_p50")}, indent=1))


if __name__ == "__main__":
    main()
