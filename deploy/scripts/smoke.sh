#!/usr/bin/env bash
# The image's run step, as CI runs it (tests/test_deploy.py) and as a container check:
# starts `reflex http` from VENV on PORT, waits for /health, asks one completion, stops it.
#   deploy/scripts/smoke.sh VENV [PORT] [extra reflex http args...]
set -euo pipefail
venv=${1:?usage: smoke.sh VENV [PORT] [ARGS...]}
port=${2:-8080}
shift $(( $# < 2 ? $# : 2 ))
"$venv/bin/reflex" http --port "$port" "$@" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
"$venv/bin/python" - "$port" <<'PY'
import json, sys, time, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.time() + 300
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            health = json.load(r)
            break
    except (urllib.error.URLError, OSError):
        if time.time() > deadline:
            sys.exit("smoke: /health never answered 200")
        time.sleep(0.2)
req = urllib.request.Request(base + "/v1/completions", method="POST",
                             data=json.dumps({"prompt": "The capital of France is", "max_tokens": 4,
                                              "temperature": 0}).encode(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=300) as r:
    out = json.load(r)
assert out["choices"][0]["finish_reason"] in ("length", "stop"), out
print(f"smoke: ok ({health['engine']['backend']}, {health['engine']['model']}): "
      f"{out['choices'][0]['text']!r}")
PY
