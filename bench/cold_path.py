"""What runs before the first token of a cold `reflex generate --max-tokens 1 --device cpu`:
`python -X importtime` (every module's self and cumulative import time) and the process's
phase marks, median over --runs fresh processes (bytecode compiled first, as an install has
it), grouped by what imports them (the interpreter's site, the CLI and its option structs,
numpy, reflex_ipc's load path). The machine's load average is recorded around the runs.

    python bench/cold_path.py [--model M] [--device cpu] [--runs 9] [--out bench/results/x.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The capital of France is"


def parse_importtime(text):
    """[(module, self us, cumulative us, depth)] in the order imports finished."""
    out = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, rest = line.split(":", 1)
        a, b, name = rest.split("|", 2)
        depth = (len(name) - len(name.lstrip(" "))) // 2
        out.append((name.strip(), int(a), int(b), depth))
    return out


def group(mod):
    top = mod.split(".")[0]
    if top in ("numpy",):
        return "numpy"
    if top in ("msgspec", "typing_extensions"):
        return "msgspec"
    if top == "reflex_ipc":
        return "reflex_ipc"
    if top.startswith("__editable__") or top in ("site", "sitecustomize", "_distutils_hack"):
        return "site"
    return "stdlib/other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out")
    a = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "reflex_ipc")],
                   stdout=subprocess.DEVNULL, check=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), REFLEX_DETACH="0")
    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    selfs, cums, phases, walls = {}, {}, {}, []
    for _ in range(a.runs):
        env["REFLEX_T_LAUNCH"] = str(time.time_ns())
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-X", "importtime", "-m", "reflex_ipc", "generate", "--max-tokens", "1",
                            "--device", a.device, "--model", a.model, "--json", PROMPT],
                           capture_output=True, text=True, env=env, cwd="/tmp")
        walls.append((time.perf_counter() - t0) * 1e3)
        if p.returncode:
            raise SystemExit(p.stderr[-2000:])
        for k, v in json.loads(p.stdout)["timings"]["phases"].items():
            phases.setdefault(k, []).append(v)
        for name, s, c, _ in parse_importtime(p.stderr):
            selfs.setdefault(name, []).append(s / 1e3)
            cums.setdefault(name, []).append(c / 1e3)
    uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    med = {k: round(statistics.median(v), 3) for k, v in selfs.items()}
    groups = {}
    for k, v in med.items():
        groups[group(k)] = round(groups.get(group(k), 0.0) + v, 2)
    ours = sorted(((k, v) for k, v in med.items() if k.startswith("reflex_ipc")), key=lambda x: -x[1])
    res = {"benchmark": "cold_path", "model": a.model, "device": a.device, "runs": a.runs,
           "uptime_before_after": uptime, "wall_ms_p50": round(statistics.median(walls), 2),
           "phases_ms_p50": {k: round(statistics.median(v), 2) for k, v in phases.items()},
           "import_self_ms_by_group": groups,
           "reflex_ipc_self_ms": dict(ours),
           "top_cumulative_ms": dict(sorted(((k, round(statistics.median(v), 2)) for k, v in cums.items()),
                                            key=lambda x: -x[1])[:40]),
           "modules": len(med)}
    print(json.dumps({k: res[k] for k in ("wall_ms_p50", "phases_ms_p50", "import_self_ms_by_group",
                                          "uptime_before_after")}, indent=1))
    print("reflex_ipc modules (self ms, p50):", ", ".join(f"{k} {v}" for k, v in ours[:20]))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
