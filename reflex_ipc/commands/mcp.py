"""reflex mcp: a Model Context Protocol server over stdio (generate, decide, embed and infill
as tools) on the in-process engine (reflex_ipc.Model). Needs the `mcp` extra (the official
mcp package), imported only here."""

import sys

EXAMPLES = """\
  reflex mcp --model smollm2                         (an MCP client spawns it; it speaks on stdin/stdout)
  an agent's configuration: {"mcpServers": {"reflex": {"command": "reflex", "args": ["mcp", "--model", "smollm2"]}}}
Needs the mcp extra: pip install 'reflex-ipc[mcp]'."""


def add_arguments(p):
    from ..ops import DEVICES

    p.add_argument("--model", metavar="MODEL", help="GGUF path or alias to load (default: $REFLEX_MODEL, else SmolLM2)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="the engine's device (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=256, metavar="N",
                   help="the generate tool's default max_tokens (default 256)")


def run(args) -> int:
    if args.max_tokens < 1:
        sys.stderr.write("reflex mcp: --max-tokens must be at least 1\n")
        return 2
    try:
        import mcp  # noqa: F401
        import pydantic  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"reflex mcp: {e.name} is missing: pip install 'reflex-ipc[mcp]'\n")
        return 1
    from ..front import mcp_server

    return mcp_server.run(args.model, args.device, args.max_tokens)
