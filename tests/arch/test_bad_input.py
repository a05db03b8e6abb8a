"""Bad input per architecture: files with inconsistent keys or tensors (the architectures'
examples, changed) give gguf_error or unsupported_architecture naming the key or tensor, at
load and over the protocol (a `load` request), never another error. (The loader's checks of
every REQUIRED key and planned tensor of every architecture: test_matrix.py's plan rule.)"""

import json
import os
import subprocess
import sys

import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.models import load_model
from reflex_ipc.testing.synthetic import example_gguf

pytestmark = pytest.mark.usefixtures("smollm2")  # the examples borrow its tokenizer

# (example, example_gguf's changes, error kind, what the message names); override: metadata only,
# the tensors still follow the example's keys
LOAD_ERRORS = [
    ("qwen3moe", dict(override={"expert_count": 6}), "gguf_error", "blk.0.ffn_gate_inp.weight"),
    ("qwen3moe", dict(drop=("blk.1.ffn_down_exps.weight",)), "gguf_error", "blk.1.ffn_down_exps.weight"),
    ("qwen3moe", dict(shapes={"blk.0.ffn_up_exps.weight": (8, 20, 32)}), "gguf_error", "blk.0.ffn_up_exps.weight"),
    ("qwen3moe", dict(override={"expert_used_count": 9}), "gguf_error", "qwen3moe.expert_used_count"),
    # llama.cpp 0.3.36 reads expert_used_count per layer but routes every qwen3moe layer with layer
    # 0's count; reflex refuses differing counts rather than answer differently
    ("qwen3moe", dict(override={"expert_used_count": [2, 3]}), "unsupported_architecture",
     "qwen3moe.expert_used_count"),
    ("qwen3moe", dict(override={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}),
     "unsupported_architecture", "yarn"),  # YaRN refused where it is not read
    ("phi3_fused_long", dict(shapes={"blk.0.attn_qkv.weight": (60, 32)}), "gguf_error", "blk.0.attn_qkv.weight"),
    ("phi3_fused_long", dict(shapes={"rope_factors_long.weight": (5,)}), "gguf_error", "rope_factors_long.weight"),
    # key_length/value_length follow the rank, as a converter would write them
    ("deepseek2_v2", dict(override={"attention.kv_lora_rank": 12, "attention.key_length": 20,
                                    "attention.value_length": 12}), "gguf_error", "blk.0.attn_kv_a_mqa.weight"),
    ("deepseek2_v2", dict(override={"attention.key_length": 20}), "gguf_error", "deepseek2.attention.key_length"),
    ("deepseek2_v3", dict(override={"expert_count": 16}), "gguf_error", "blk.1.ffn_gate_inp.weight"),
    ("deepseek2_v3", dict(drop=("blk.2.ffn_up_exps.weight",)), "gguf_error", "blk.2.ffn_up_exps.weight"),
    ("deepseek2_v2", dict(drop=("blk.1.ffn_down_shexp.weight",)), "gguf_error", "blk.1.ffn_down_shexp.weight"),
    ("deepseek2_v2", dict(override={"expert_gating_func": 3}), "unsupported_architecture",
     "deepseek2.expert_gating_func"),
    ("deepseek2_v2", dict(override={"expert_gating_func": 4}), "unsupported_architecture",
     "deepseek2.expert_gating_func"),
    ("deepseek2_v2", dict(override={"expert_gating_func": 9}), "gguf_error", "deepseek2.expert_gating_func"),
    ("deepseek2_v3", dict(override={"expert_group_count": 3}), "gguf_error", "deepseek2.expert_group_count"),
    ("deepseek2_v2", dict(override={"attention.key_length_mla": None, "attention.value_length_mla": None}),
     "unsupported_architecture", "key_length_mla"),  # a legacy file with a fused attn_kv_b
    ("gemma4_e2b", dict(drop=("per_layer_model_proj.weight",)), "gguf_error", "per_layer_model_proj.weight"),
    ("gemma4_e2b", dict(drop=("blk.3.inp_gate.weight",)), "gguf_error", "blk.3.inp_gate.weight"),
    ("gemma4_e2b", dict(shapes={"per_layer_token_embd.weight": (49152, 32)}), "gguf_error",
     "per_layer_token_embd.weight"),
    ("gemma4_e2b", dict(override={"attention.shared_kv_layers": 4}), "gguf_error", "gemma4.attention.shared_kv_layers"),
    ("gemma4_e2b", dict(override={"attention.shared_kv_layers": 3}), "gguf_error", "gemma4.attention.shared_kv_layers"),
    ("gemma4", dict(drop=("rope_freqs.weight",)), "gguf_error", "rope_freqs.weight"),
    ("gemma4", dict(override={"attention.key_length_swa": 8, "attention.value_length_swa": 8,
                              "rope.dimension_count_swa": 8}), "gguf_error", "blk.0.attn_q.weight"),
    ("gemma4", dict(override={"attention.sliding_window_pattern": None}), "gguf_error",
     "gemma4.attention.sliding_window_pattern"),
    ("gemma4", dict(override={"embedding_length_per_layer_input": None}), "gguf_error",
     "gemma4.embedding_length_per_layer_input"),
    ("gemma4", dict(has=("attn_qkv.weight",), shapes={"blk.1.attn_qkv.weight": (120, 32)}), "gguf_error",
     "blk.1.attn_qkv.weight"),
    ("gemma4_moe", dict(override={"expert_count": 6}), "gguf_error", "blk.0.ffn_gate_inp.weight"),
    ("gemma4_moe", dict(drop=("blk.2.ffn_gate_inp.scale",)), "gguf_error", "blk.2.ffn_gate_inp.scale"),
    ("gemma4_moe", dict(drop=("blk.0.ffn_up_exps.weight",)), "gguf_error", "blk.0.ffn_up_exps.weight"),
    ("gemma4_moe", dict(override={"expert_feed_forward_length": 16}), "gguf_error", "blk.0.ffn_gate_exps.weight"),
    ("gemma4_moe", dict(override={"expert_used_count": None}), "gguf_error", "gemma4.expert_used_count"),
    ("qwen35", dict(override={"attention.recurrent_layers": [True, False, True], "full_attention_interval": None}),
     "gguf_error", "qwen35.attention.recurrent_layers"),
    ("qwen35", dict(override={"ssm.inner_size": 60}), "gguf_error", "qwen35.ssm.inner_size"),
    ("qwen35", dict(override={"ssm.group_count": 3}), "gguf_error", "qwen35.ssm.group_count"),
    ("qwen35", dict(override={"rope.dimension_sections": [0, 0, 0, 0]}), "gguf_error",
     "qwen35.rope.dimension_sections"),
    ("qwen35", dict(override={"rope.dimension_sections": [4, 4, 4, 0]}), "gguf_error",
     "qwen35.rope.dimension_sections"),
    ("qwen35", dict(drop=("blk.0.ssm_a",)), "gguf_error", "blk.0.ssm_a"),
    ("qwen35", dict(override={"ssm.conv_kernel": 1}), "gguf_error", "qwen35.ssm.conv_kernel"),
    ("granitehybrid", dict(override={"ssm.inner_size": 96}), "gguf_error", "granitehybrid.ssm.inner_size"),
    ("granitehybrid", dict(override={"ssm.group_count": 3}), "gguf_error", "granitehybrid.ssm.group_count"),
    ("granitehybrid", dict(override={"attention.head_count_kv": [0, 3, 0, 2]}), "gguf_error",
     "granitehybrid.attention.head_count_kv"),
    ("granitehybrid", dict(override={"attention.head_count_kv": [0, 2, 0]}), "gguf_error",
     "granitehybrid.attention.head_count_kv"),
    ("granitehybrid", dict(drop=("blk.0.ssm_d",)), "gguf_error", "blk.0.ssm_d"),
    ("granitehybrid", dict(override={"expert_count": 4, "expert_used_count": 0}), "gguf_error",
     "granitehybrid.expert_used_count"),
]


@pytest.mark.parametrize("name,changes,kind,named", LOAD_ERRORS)
def test_bad_file_is_refused_naming_the_key_or_tensor(tmp_path, smollm2, name, changes, kind, named):
    path = example_gguf(name, tmp_path / "bad.gguf", tokenizer=smollm2, **changes)
    with GGUFFile(path) as f, pytest.raises(ReflexError) as e:
        load_model(NumpyOps(), f)
    assert e.value.kind == kind and named in e.value.message, (e.value.kind, e.value.message)


# over the protocol: the quantized examples (written F32: the errors come before any weight),
# (example, changes, names of which the error must mention one)
BAD = [
    ("qwen3moe@q", dict(override={"expert_count": 6}), ["blk.0.ffn_gate_inp.weight"]),
    ("qwen3moe@q", dict(override={"expert_used_count": 9}), ["qwen3moe.expert_used_count"]),
    ("qwen3moe@q", dict(override={"expert_feed_forward_length": 128}), ["blk.0.ffn_gate_exps.weight"]),
    ("qwen3moe@q", dict(override={"attention.head_count_kv": [2, 0]}), ["qwen3moe.attention.head_count_kv"]),
    ("qwen3moe@q", dict(override={"attention.head_count_kv": [2, 2, 2]}), ["qwen3moe.attention.head_count_kv"]),
    ("phi3@q", dict(override={"block_count": 3}), ["blk.2."]),
    ("phi3@q", dict(override={"rope.dimension_count": 16}), ["phi3.rope.dimension_count"]),
    ("deepseek2@q", dict(override={"attention.kv_lora_rank": 12, "attention.key_length": 20,
                             "attention.value_length": 12}), ["blk.0.attn_kv_a_mqa.weight"]),
    ("deepseek2@q", dict(override={"expert_gating_func": 9}), ["deepseek2.expert_gating_func"]),
    ("deepseek2@q", dict(override={"expert_group_count": 3}), ["deepseek2.expert_group_count"]),
    ("deepseek2@q", dict(override={"expert_group_used_count": 5}), ["deepseek2.expert_group"]),
    ("deepseek2@q", dict(override={"expert_used_count": 9}), ["deepseek2.expert_used_count"]),
    ("deepseek2@q", dict(override={"leading_dense_block_count": 5}), ["deepseek2.leading_dense_block_count"]),
    ("deepseek2@q", dict(override={"expert_shared_count": 0}), ["blk.1.ffn_gate_shexp.weight"]),
    ("gemma4@q", dict(override={"expert_used_count": 9}), ["gemma4.expert_used_count"]),
    ("gemma4@q", dict(override={"attention.sliding_window_pattern": [True, False]}),
     ["gemma4.attention.sliding_window_pattern"]),
    ("gemma4@q", dict(override={"attention.head_count_kv": [2, 0, 2]}), ["gemma4.attention.head_count_kv"]),
    ("gemma4@q", dict(override={"attention.sliding_window": 0}), ["gemma4.attention.sliding_window"]),
    ("deepseek2@q", dict(override={"rope.scaling.type": "foo"}), ["deepseek2.rope.scaling.type"]),
    ("deepseek2@q", dict(shapes={"blk.1.attn_k_b.weight": (4 * 16, 8)}), ["blk.1.attn_k_b.weight"]),
    ("qwen3moe@q", dict(shapes={"blk.0.ffn_up_exps.weight": (8 * 256, 32)}), ["blk.0.ffn_up_exps.weight"]),
    ("qwen35@q", dict(override={"ssm.state_size": 8, "ssm.inner_size": 32}), ["blk.0.attn_qkv.weight"]),
    ("qwen35@q", dict(override={"ssm.time_step_rank": 8, "ssm.inner_size": 128}), ["blk.0.attn_qkv.weight"]),
    ("qwen35@q", dict(override={"ssm.group_count": 4}), ["blk.0.attn_qkv.weight"]),
    ("qwen35@q", dict(override={"attention.recurrent_layers": [True, True, True, True]}), ["blk.1.attn_qkv.weight"]),
    ("qwen35@q", dict(override={"ssm.time_step_rank": 8}), ["qwen35.ssm.inner_size"]),
    ("qwen35@q", dict(override={"ssm.conv_kernel": 3}), ["blk.0.ssm_conv1d.weight"]),
    ("qwen35@q", dict(override={"attention.head_count_kv": [0, 0, 0, 2]}), ["qwen35.attention.head_count_kv"]),
    ("qwen35moe@q", dict(override={"expert_used_count": 5}), ["qwen35moe.expert_used_count"]),
    ("qwen35moe@q", dict(override={"expert_count": 3}), ["blk.0.ffn_gate_inp.weight"]),
    ("granitehybrid@q", dict(override={"ssm.state_size": 8}), ["blk.1.ssm_in.weight"]),
    ("granitehybrid@q", dict(override={"ssm.time_step_rank": 3}), ["granitehybrid.ssm."]),
    ("granitehybrid@q", dict(override={"expert_used_count": 5}), ["granitehybrid.expert_used_count"]),
    ("granitehybrid@q", dict(override={"attention.head_count_kv": [2, 0, 0, 3]}), ["granitehybrid.attention.head_count_kv"]),
    ("granitehybrid@q", dict(override={"attention.head_count_kv": [2, 0, 0, 0]}), ["blk.3.ssm_in.weight"]),
    ("granitehybrid@q", dict(override={"attention.head_count_kv": [2, 0, 0]}), ["granitehybrid.attention.head_count_kv"]),
    ("granitehybrid@q", dict(override={"ssm.group_count": 4}), ["blk.1.ssm_in.weight"]),
]


def test_bad_input_is_named_at_load_over_the_protocol(tmp_path, smollm2):
    """Every file of BAD, loaded over `reflex stdio` (numpy), is refused with gguf_error or
    unsupported_architecture naming the key or tensor; the server stays up (a good model
    loads after them)."""
    reqs = []
    for i, (name, changes, _) in enumerate(BAD):
        path = example_gguf(name, tmp_path / f"bad{i}.gguf", tokenizer=smollm2, quantize=False, **changes)
        reqs.append({"id": i, "op": "load", "model": path, "device": "numpy"})
    good = example_gguf("qwen35@q", tmp_path / "good.gguf", tokenizer=smollm2, quantize=False)
    reqs += [{"id": 100, "op": "generate", "model": good, "device": "numpy", "prompt": "The capital of France is",
              "max_tokens": 2},
             {"id": 101, "op": "shutdown"}]
    env = dict(os.environ)
    env.pop("REFLEX_MODEL", None)
    p = subprocess.run([sys.executable, "-m", "reflex_ipc", "stdio"], capture_output=True, text=True, timeout=600,
                       input="".join(json.dumps(r) + "\n" for r in reqs), env=env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    res = {m["id"]: m for m in map(json.loads, p.stdout.splitlines()) if m.get("event") == "result"}
    bad = []
    for i, (name, changes, names) in enumerate(BAD):
        e = res[i].get("error") or {}
        if res[i]["ok"] or e.get("kind") not in ("gguf_error", "unsupported_architecture") or not any(
                n in e.get("message", "") for n in names):
            bad.append((name, changes, res[i]))
    assert not bad, bad
    assert res[100]["ok"] and len(res[100]["token_ids"]) == 2
