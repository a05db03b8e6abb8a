"""Fill-in-the-middle prompts: the token layout of llama.cpp's server `/infill`.

The FIM token ids come from the tokenizer (`tok.fim_ids`: the GGUF's
`tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id`, the older
`tokenizer.ggml.{prefix,suffix,middle}_token_id`, else the token texts
llama.cpp recognises, such as `<|fim_prefix|>`, `<fim_prefix>`, `<PRE>`).
A model without prefix, suffix and middle tokens cannot infill.

Layout (repo-level FIM, as Qwen2.5-Coder was trained and llama.cpp lays it out):

    [REP]myproject\\n                       when the vocabulary has a repo token
    [SEP]{filename}\\n{text}  per input_extra chunk, when it has a file separator
      (else "\\n\\n--- snippet ---\\n\\n{text}")
    [SEP]filename\\n                         when it has a file separator
    [BOS]                                    when the vocabulary adds BOS
    [PRE]{prefix}{prompt}[SUF]{suffix}[MID]

Texts are tokenized without BOS and without parsing special tokens. The prefix
keeps its last 3/4 * N_BATCH tokens, the suffix its first N_BATCH/4 - 2 -
len(prompt) tokens, and the extra context its last n_ctx - N_BATCH - 2 *
max_tokens tokens (llama.cpp's budget with its default batch of 2048).

One difference, with `align` (the prefix cache's block size, when the request uses
the cache): a prefix longer than its budget is cut at a multiple of `align` tokens from
its start (keeping between budget - align + 1 and budget tokens) instead of exactly
`budget` tokens from its end. llama.cpp's cut moves with every token typed before the
cursor, so nothing of the prompt after the cut point would ever repeat; this one moves
only once per `align` tokens, so the saved state of the unchanged text before an edit
stays usable (prefix store, runtime/prefixstore.py).
"""

from __future__ import annotations

from .errors import ReflexError

N_BATCH = 2048
PROJECT = "myproject\n"
CURRENT_FILE = "filename\n"
SNIPPET_SEP = "\n\n--- snippet ---\n\n"


def has_fim(tok) -> bool:
    fim = getattr(tok, "fim_ids", None) or {}
    return all(fim.get(k) is not None for k in ("pre", "suf", "mid"))


def infill_prompt(tok, prefix: str, suffix: str, *, input_extra=None, prompt: str = "",
                  n_ctx: int = 4096, max_tokens: int = 64, n_batch: int = N_BATCH, align: int = 0) -> list:
    """The prompt token ids for prefix/suffix (and extra files), llama.cpp's layout (with
    align > 0: a long prefix cut at a multiple of align tokens, see the module's doc)."""
    if not has_fim(tok):
        raise ReflexError("invalid_request", "`infill`: this model has no fill-in-the-middle "
                                             "tokens (FIM prefix, suffix and middle)")
    fim = tok.fim_ids

    def enc(text):
        return tok.encode(text, add_bos=False, parse_special=False)

    extra = []
    if fim.get("rep") is not None:
        extra.append(fim["rep"])
        extra += enc(PROJECT)
    for i, chunk in enumerate(input_extra or ()):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise ReflexError("invalid_request", f"`input_extra[{i}]`: must be "
                                                 '{"filename": string, "text": string}')
        text = chunk.get("text", "")
        filename = chunk.get("filename", "tmp")
        if fim.get("sep") is not None:
            extra.append(fim["sep"])
            extra += enc(filename + "\n")
        else:
            extra += enc(SNIPPET_SEP)
        extra += enc(text)
    if fim.get("sep") is not None:
        extra.append(fim["sep"])
        extra += enc(CURRENT_FILE)

    p_ids = enc(prefix)
    s_ids = enc(suffix)
    extra_prompt = tok.encode(prompt, add_bos=False, parse_special=True) if prompt else []
    n_pre = min(len(p_ids), 3 * (n_batch // 4))
    if align > 0 and n_pre < len(p_ids):
        cut = -(-(len(p_ids) - n_pre) // align) * align  # the first multiple of align that fits
        n_pre = len(p_ids) - cut
    n_suf = min(len(s_ids), max(0, n_batch // 4 - (2 + len(extra_prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * max_tokens), len(extra))
    p_ids = p_ids[len(p_ids) - n_pre:]
    s_ids = s_ids[:n_suf]

    out = extra[len(extra) - n_extra:] if n_extra else []
    if getattr(tok, "add_bos", False) and tok.bos_id is not None:
        out.append(tok.bos_id)
    out.append(fim["pre"])
    out += p_ids
    out += extra_prompt
    out.append(fim["suf"])
    out += s_ids
    out.append(fim["mid"])
    return out
