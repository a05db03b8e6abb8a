"""The server tests' stand-ins and clients: `FakeRunner` (the Runner API, one token per
prompt character, forced failures; imported by the fake server subprocesses too), its
loader and model resolver, and `Proc` / `UdsClient`, clients of a server subprocess
speaking JSON lines over stdio or a unix socket."""

import json
import os
import pathlib
import select
import signal
import socket
import subprocess
import tempfile
import time

from reflex_ipc.errors import ReflexError

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout (protocol/schema.json)
_SCHEMA = None


class FakeRunner:
    """Runner API stand-in. One token per prompt character (cycled), `delay`
    seconds apart. Prompt "boom" raises RuntimeError, "oom" MemoryError."""

    n_ctx = 8192

    def __init__(self, path, device, delay=0.0):
        self.path, self.device, self.delay = path, device, delay
        self.calls = []

    def info(self):
        return {"model": "fake-" + os.path.basename(self.path), "path": self.path,
                "architecture": "fake", "backend": "numpy", "n_vocab": 1000,
                "n_ctx": self.n_ctx, "device": self.device}

    def tokenize(self, text, *, add_bos=False, parse_special=True):
        return ([1] if add_bos else []) + [ord(c) % 1000 for c in text]

    def detokenize(self, ids, *, special=False):
        return "".join(chr(i) for i in ids)

    def generate(self, prompt, params=None, *, on_token=None, **kw):
        return self.stream(prompt, params, **kw).run(on_token)

    def stream(self, prompt, params=None, *, should_cancel=None, cache_prompt=True, prefix_cache=True, **kw):
        from reflex_ipc.generation import Params

        p = (params or Params()).replace(**kw) if kw else (params or Params())
        self.calls.append(dict(prompt=prompt, max_tokens=p.max_tokens, temperature=p.temperature,
                               top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, seed=p.seed,
                               repeat_penalty=p.repeat_penalty, repeat_last_n=p.repeat_last_n,
                               stop=list(p.stop), cache_prompt=cache_prompt))
        if prompt == "boom":
            raise RuntimeError("boom")
        if prompt == "oom":
            raise MemoryError()
        if len(prompt) + p.max_tokens > self.n_ctx:
            raise ReflexError("context_overflow", f"{len(prompt)} + {p.max_tokens} > {self.n_ctx}")
        return _FakeGeneration(self, prompt, p, should_cancel)

    def system1(self, prompt, candidates, *, temperature=1.0, should_cancel=None,
                cache_prompt=True, prefix_cache=True):
        if should_cancel and should_cancel():
            raise ReflexError("cancelled", "cancelled")
        c = [{"text": t, "token_ids": self.tokenize(t), "logprob": -float(len(t)),
              "mean_logprob": -1.0, "probability": 1.0 / len(candidates)} for t in candidates]
        return {"candidates": c, "best_idx": 0, "entropy": 0.5, "prompt_tokens": len(prompt),
                "candidate_tokens": sum(len(x["token_ids"]) for x in c), "cached_tokens": 0,
                "timings": {"prompt_eval": 1.0, "total": 1.0}}

    def embed(self, texts, *, pooling="mean", normalize=False, should_cancel=None, prefix_cache=True):
        import numpy as np

        e = np.ones((len(texts), 4), dtype=np.float32)
        if normalize:
            e /= 2.0
        return {"embeddings": e, "dim": 4, "n_tokens": [len(t) for t in texts],
                "timings": {"prompt_eval": 0.2, "total": 0.2}}


class _FakeGeneration:
    """FakeRunner.stream: token events as the engine's Generation yields them, then .result."""

    def __init__(self, runner, prompt, p, should_cancel):
        self.r, self.prompt, self.p, self.should_cancel = runner, prompt, p, should_cancel
        self.result = None

    def __iter__(self):
        prompt, p = self.prompt, self.p
        if prompt == "unencodable":
            self.result = {"text": object(), "timings": {}}
            return
        text, ids, finish = "", [], "length"
        src = prompt or "x"
        for k in range(p.max_tokens):
            if self.should_cancel and self.should_cancel():
                raise ReflexError("cancelled", "cancelled")
            if self.r.delay:
                time.sleep(self.r.delay)
            ch = src[k % len(src)]
            ids.append(ord(ch) % 1000)
            if any((text + ch).endswith(s) for s in p.stop):
                finish = "stop_string"
                break
            text += ch
            yield {"token_id": ord(ch) % 1000, "text": ch}
        self.result = {"token_ids": ids, "text": text, "finish_reason": finish,
                       "prompt_tokens": len(prompt), "completion_tokens": len(ids), "cached_tokens": 0,
                       "timings": {"tokenize": 0.01, "prompt_eval": 0.5, "decode": 1.5, "total": 2.0}}

    def run(self, on_token=None):
        for ev in self:
            if on_token is not None:
                on_token(ev["token_id"], ev["text"])
        return self.result


def fake_loader(delay=0.0, loads=None):
    def load(path, device):
        if loads is not None:
            loads.append((path, device))
        if path.endswith(".bad"):
            raise ReflexError("gguf_error", "not a GGUF file")
        return FakeRunner(path, device, delay)
    return load


def fake_resolve(name):
    if name is None or name == "smollm2":
        return "/models/default.gguf"
    if name.startswith("/models/"):
        return name
    raise ReflexError("model_not_found", f"no such model {name!r}")


def lines_of(*reqs) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in reqs)


def check_schema(obj):
    """Validate a response line against protocol/schema.json (of the checkout)."""
    import jsonschema

    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = json.loads((ROOT / "protocol" / "schema.json").read_text())
    sub = {"$ref": "#/$defs/response", "$defs": _SCHEMA["$defs"]}
    jsonschema.validate(obj, sub)


class Proc:
    """A server subprocess speaking JSON lines on its stdin/stdout."""

    def __init__(self, argv, env=None, ready=True, stdin=subprocess.PIPE, cwd=None):
        self.stderr = tempfile.TemporaryFile()
        self.p = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=self.stderr,
                                  env=env, cwd=str(cwd or ROOT))
        self.buf = b""
        self.ready = self.read(timeout=120) if ready else None
        if ready:
            assert self.ready["event"] == "ready", self.ready

    def send(self, *reqs):
        self.p.stdin.write(lines_of(*reqs))
        self.p.stdin.flush()

    def read_line(self, timeout=60):
        fd = self.p.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no line in {timeout}s; stderr: {self.err()[-2000:]}")
            data = os.read(fd, 1 << 16)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def read(self, timeout=60):
        line = self.read_line(timeout)
        return None if line is None else json.loads(line)

    def response(self, timeout=120):
        """(token events, result) of the next request."""
        tokens = []
        while True:
            obj = self.read(timeout)
            assert obj is not None, "EOF before the result; stderr: " + self.err()[-2000:]
            if obj["event"] == "result":
                return tokens, obj
            assert obj["event"] == "token", obj
            tokens.append(obj)

    def request(self, req, timeout=120):
        self.send(req)
        return self.response(timeout)

    def err(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def wait(self, timeout=30):
        return self.p.wait(timeout)

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for f in (self.p.stdin, self.p.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self.stderr.close()


class UdsClient:
    def __init__(self, path, timeout=120):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        end = time.monotonic() + timeout
        while True:
            try:
                self.s.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > end:
                    raise
                time.sleep(0.02)
        self.buf = b""
        self.ready = self.read(timeout)
        assert self.ready["event"] == "ready"

    def send(self, *reqs):
        self.s.sendall(lines_of(*reqs))

    def read(self, timeout=60):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.s], [], [], left)[0]:
                raise TimeoutError(f"no line in {timeout}s")
            data = self.s.recv(1 << 16)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def response(self, timeout=120):
        tokens = []
        while True:
            obj = self.read(timeout)
            assert obj is not None
            if obj["event"] == "result":
                return tokens, obj
            tokens.append(obj)

    def request(self, req, timeout=120):
        self.send(req)
        return self.response(timeout)

    def close(self):
        self.s.close()


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    rc = p.wait(20)
    out = p.stdout.read()
    p.stdout.close()
    p.stderr.close()
    return rc, out
