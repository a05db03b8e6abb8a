#!/usr/bin/env python3
"""A tiny stand-in for `reflex stdio`, used ONLY for the clients' fault-injection
tests (a child that never becomes ready, prints garbage, dies mid-request,
answers slowly). Every other client test runs against the real server.

It speaks the wire format of protocol/PROTOCOL.md for a handful of ops:
ping, tokenize (one id per character), generate (one token per character of
the prompt, `FAKE_TOKEN_DELAY` seconds apart), and `die` (exits at once,
without answering). SIGINT cancels the current request, as the real server does.

FAKE_MODE: "" (normal), "no_ready" (never prints the ready line),
"bad_ready" (prints a line that is not the ready event), "exit_early"
(exits with status 3 before the ready line, after a line on stderr).
"""
import json
import os
import signal
import sys
import time

cancel = False


def on_sigint(signum, frame):
    global cancel
    cancel = True


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    global cancel
    signal.signal(signal.SIGINT, on_sigint)
    mode = os.environ.get("FAKE_MODE", "")
    delay = float(os.environ.get("FAKE_TOKEN_DELAY", "0.05"))
    if mode == "no_ready":
        time.sleep(3600)
        return 0
    if mode == "bad_ready":
        send({"event": "result", "id": None, "ok": True})
        time.sleep(3600)
        return 0
    if mode == "exit_early":
        sys.stderr.write("fake_server: cannot start\n")
        return 3
    send({"event": "ready", "id": None, "protocol": 1, "version": "0.0.0-fake",
          "pid": os.getpid(), "backend": "fake", "model": "fake"})
    for line in sys.stdin:
        cancel = False
        try:
            req = json.loads(line)
        except ValueError as e:
            send({"event": "result", "id": None, "ok": False,
                  "error": {"kind": "parse_error", "message": str(e)}})
            continue
        rid = req.get("id")
        op = req.get("op")
        if op == "die":
            os._exit(7)
        if op == "ping":
            send({"event": "result", "id": rid, "op": op, "ok": True})
        elif op == "tokenize":
            send({"event": "result", "id": rid, "op": op, "ok": True,
                  "token_ids": [ord(c) for c in req.get("text", "")]})
        elif op == "generate":
            text, ids = "", []
            limit = req.get("max_tokens", 16)
            for ch in req.get("prompt", "")[:limit]:
                time.sleep(delay)
                if cancel:
                    break
                text += ch
                ids.append(ord(ch))
                if req.get("stream"):
                    send({"event": "token", "id": rid, "token_id": ord(ch), "text": ch})
            if cancel:
                send({"event": "result", "id": rid, "op": op, "ok": False,
                      "error": {"kind": "cancelled", "message": "cancelled by SIGINT"}})
            else:
                send({"event": "result", "id": rid, "op": op, "ok": True, "text": text,
                      "token_ids": ids, "finish_reason": "length"})
        else:
            send({"event": "result", "id": rid, "op": op, "ok": False,
                  "error": {"kind": "unknown_op", "message": f"unknown op {op!r}"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
