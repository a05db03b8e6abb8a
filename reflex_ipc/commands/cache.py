"""reflex cache: the prefix cache (runtime/prefixstore.py): `ls` what it holds per model,
`clear` it."""

import sys


EXAMPLES = """\
  reflex cache                      (the same as: reflex cache ls)
  reflex cache ls --json
  reflex cache clear
The prefix cache keeps the state of prompts' leading tokens so that a later process with
the same start skips evaluating them; on by default. REFLEX_PREFIX_CACHE=0 turns it off,
REFLEX_PREFIX_CACHE_DIR moves it (default: prefix/ in reflex's cache folder: $REFLEX_CACHE,
else $XDG_CACHE_HOME/reflex-ipc, else ~/.cache/reflex-ipc), REFLEX_PREFIX_CACHE_MAX caps
its size (default 4G, least recently used files go first); --no-prefix-cache (generate,
system1, infill, embed) and the requests' prefix_cache: false skip it for one request."""


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("ls", help="the folder, the size cap, and per model: files, bytes, last use")
    ls.add_argument("--json", action="store_true", help="one JSON object on stdout")
    clear = sub.add_parser("clear", help="delete every saved prefix state")
    clear.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(action="ls", json=False)


def listing():
    import time

    from ..runtime import prefixstore

    folder = prefixstore.root()
    models = []
    for ns, ent in sorted(prefixstore.scan(folder).items()):
        info = ent["info"]
        fs = ent["files"]
        models.append({"key": ns, "model": info.get("model"), "path": info.get("path"),
                       "architecture": info.get("architecture"), "backend": info.get("backend"),
                       "lora": info.get("lora", []), "files": len(fs),
                       "bytes": sum(s for _, s, _ in fs),
                       "last_used": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(max(m for _, _, m in fs)))
                       if fs else None})
    return {"folder": folder, "enabled": prefixstore.enabled(), "max_bytes": prefixstore.max_bytes(),
            "block": prefixstore.block_size(), "files": sum(m["files"] for m in models),
            "bytes": sum(m["bytes"] for m in models), "models": models}


def _mb(n):
    return f"{n / 1e6:.1f} MB"


def run(args):
    import json

    from ..runtime import prefixstore

    if args.action == "clear":
        n, size = prefixstore.clear()
        if args.json:
            print(json.dumps({"folder": prefixstore.root(), "files": n, "bytes": size}))
        else:
            print(f"deleted {n} files ({_mb(size)}) from {prefixstore.root()}")
        return 0
    out = listing()
    if args.json:
        print(json.dumps(out))
        return 0
    state = "on" if out["enabled"] else "off (REFLEX_PREFIX_CACHE=0)"
    print(f"prefix cache {state}: {out['folder']}")
    print(f"{out['files']} files, {_mb(out['bytes'])} of at most {_mb(out['max_bytes'])}; "
          f"blocks of {out['block']} tokens")
    for m in out["models"]:
        name = m["model"] or "?"
        print(f"  {name} ({m['architecture'] or '?'}, {m['backend'] or '?'}"
              + (f", {len(m['lora'])} LoRA" if m["lora"] else "") + f"): {m['files']} files, "
              f"{_mb(m['bytes'])}, last used {m['last_used'] or '-'}  {m['path'] or ''}")
    sys.stdout.flush()
    return 0
