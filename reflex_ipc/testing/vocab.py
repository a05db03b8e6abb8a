"""Vocabulary-only GGUFs for the chat-template, infill and feature tests (issue 14).

`vocab_gguf(path, extra=..., meta=...)` writes SmolLM2's gpt2 BPE vocabulary
(read with reflex's GGUFFile, written with gguf.GGUFWriter) plus `extra`
tokens appended at the end, a chat template and whatever tokenizer.* keys
`meta` sets, under architecture `llama` with the shape keys llama.cpp reads
before it loads a vocabulary (synthetic.write_shape). No tensors:
llama.cpp opens it with vocab_only=True, reflex with load_tokenizer.
"""

from __future__ import annotations

CONTROL, USER_DEFINED = 3, 4

# token sets of the chat formats under test (text, token type)
LLAMA3 = [(t, CONTROL) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                                 "<|python_tag|>")]
GEMMA = [(t, CONTROL) for t in ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>")]
QWEN3 = [(t, USER_DEFINED) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>",
                                     "<tool_response>", "</tool_response>")]
# o200k_harmony's (gpt-oss) special tokens that its chat format uses (<|endoftext|>: SmolLM2 has it);
# <|return|> and <|call|> end a reply
HARMONY = [(t, CONTROL) for t in ("<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                                  "<|start|>", "<|end|>", "<|message|>", "<|call|>")]
LLAMA4 = [(t, CONTROL) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>",
                                 "<|eot|>", "<|eom|>", "<|python_start|>", "<|python_end|>", "<|image|>")]
FIM_QWEN = [(t, CONTROL) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                                   "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")]


def smollm2_path():
    from reflex_ipc.modelpath import resolve_model

    return resolve_model("smollm2")


def vocab_gguf(path, extra=(), meta=None, drop=(), src=None):
    """Write the GGUF; returns {text: id} of the extra tokens. meta: {key: value}
    (bool/int/str) set or replaced; keys named in drop are left out. src: the GGUF whose
    gpt2 vocabulary is copied (default SmolLM2's)."""
    import gguf
    from gguf import GGUFValueType as VT

    from ..gguffile import GGUFFile
    from .synthetic import add_kv, write_shape

    src = GGUFFile(src or smollm2_path())
    md = src.metadata
    tokens = md["tokenizer.ggml.tokens"].raw_strings()
    types = [int(x) for x in md["tokenizer.ggml.token_type"].numpy()]
    merges = md["tokenizer.ggml.merges"].raw_strings()
    ids = {}
    for text, ttype in extra:
        ids[text] = len(tokens)
        tokens.append(text.encode("utf-8"))
        types.append(ttype)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("vocab-test")
    write_shape(w, n_layer=1, n_ctx=4096, n_embd=64, n_ff=128, n_head=2, n_head_kv=1,
                head_dim=32, eps=1e-5, rope_base=10000.0)
    w.add_uint32("llama.vocab_size", len(tokens))
    keys = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
            "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_space_prefix": False,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.padding_token_id": 2}
    keys.update(meta or {})
    for k in drop:
        keys.pop(k, None)
    for k, v in keys.items():
        add_kv(w, k, v)
    w.add_key_value("tokenizer.ggml.tokens", tokens, VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("tokenizer.ggml.token_type", types, VT.ARRAY, sub_type=VT.INT32)
    w.add_key_value("tokenizer.ggml.merges", merges, VT.ARRAY, sub_type=VT.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    src.close()
    return ids
