"""reflex http: an OpenAI-compatible HTTP front over the engine's Unix socket.

A separate process: it spawns `reflex uds` (or, with --connect, uses a running one) and
speaks the JSON-lines protocol to it; the engine keeps no network socket. Needs the `http`
extra (Starlette, Uvicorn), imported only here.
"""

import sys


def _port(text):
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return n


def _count(text, least=0):
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < least:
        raise argparse.ArgumentTypeError(f"not an integer >= {least}: {text!r}")
    return n


EXAMPLES = """\
  reflex http --port 8080                            (then http://127.0.0.1:8080/v1 with any OpenAI client)
  curl -s 127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"messages": [{"role": "user", "content": "Name the three primary colors."}]}'
  reflex http --connect /tmp/reflex.sock --api-key "$KEY"
Needs the http extra: pip install 'reflex-ipc[http]'."""


def add_arguments(p):
    from ..ops import DEVICES

    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8080, metavar="PORT", help="TCP port (default 8080)")
    p.add_argument("--model", metavar="MODEL", help="GGUF path or alias the spawned engine loads (default: its default)")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="the spawned engine's device (default: %(default)s)")
    p.add_argument("--connect", metavar="PATH",
                   help="use the `reflex uds` engine listening on PATH instead of spawning one")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` (default: $REFLEX_API_KEY; none when unset)")
    p.add_argument("--queue", type=_count, default=16, metavar="N",
                   help="requests that may wait for the engine; beyond, 503 + Retry-After (default 16)")
    p.add_argument("--max-body-bytes", type=lambda t: _count(t, 1), default=8 << 20, metavar="BYTES",
                   help="largest request body (default 8 MiB; larger: 413)")
    p.add_argument("--chat-max-tokens", type=lambda t: _count(t, 1), default=512, metavar="N",
                   help="max_tokens of a chat completion that gives none (default 512)")
    p.add_argument("--log-level", default="warning", metavar="LEVEL", help="uvicorn's log level (default warning)")


def run(args) -> int:
    if args.connect and args.model:
        sys.stderr.write("reflex http: --model applies to a spawned engine; with --connect, "
                         "the running engine's model is used\n")
        return 2
    from .. import settings

    api_key = args.api_key if args.api_key is not None else settings.get().api_key
    # The engine starts first, so its start-up overlaps the import of the HTTP stack.
    from ..front import process

    sock_dir = started = None
    if not args.connect:
        sock_dir = process.new_dir()
        started = process.spawn(sock_dir, model=args.model, device=args.device)
    from ..front import engine as front_engine

    engine = front_engine.Engine(connect=args.connect, model=args.model, device=args.device,
                                 max_queue=args.queue, sock_dir=sock_dir)
    engine.spawn(started)
    try:
        try:
            import uvicorn

            from ..front.app import Front, build_app, uvicorn_config
        except ImportError as e:
            sys.stderr.write(f"reflex http: {e.name} is missing: pip install 'reflex-ipc[http]'\n")
            return 1
        app = build_app(Front(engine, api_key=api_key, max_body_bytes=args.max_body_bytes,
                              chat_max_tokens=args.chat_max_tokens))
        server = uvicorn.Server(uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level))
        host = f"[{args.host}]" if ":" in args.host else args.host
        sys.stderr.write(f"reflex http: serving http://{host}:{args.port}/v1 "
                         f"({'engine at ' + args.connect if args.connect else 'engine spawned'}"
                         f"{', bearer token required' if api_key else ''})\n")
        server.run()
        return 0 if server.started else 1
    finally:
        proc = engine.proc
        if proc is not None and proc.poll() is None:  # lifespan did not get to close it
            proc.terminate()
            try:
                proc.wait(5)
            except Exception:
                proc.kill()
        if sock_dir is not None:
            import shutil

            shutil.rmtree(sock_dir, ignore_errors=True)
