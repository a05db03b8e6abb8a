"""reflex_ipc.ggml_types is a copy of gguf.constants' type table: it must not drift."""

import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from reflex_ipc import ggml_types
from reflex_ipc.ggml_types import BY_ID, TYPES, tensor_nbytes, type_name


@pytest.mark.parametrize("name", sorted(TYPES))
def test_type_matches_gguf(name):
    tid, blk, size = TYPES[name]
    qt = GGMLQuantizationType[name]
    assert int(qt) == tid
    assert GGML_QUANT_SIZES[qt] == (blk, size)


def test_ids_are_unique_and_indexed():
    assert len(BY_ID) == len(TYPES)
    for name, (tid, blk, size) in TYPES.items():
        assert BY_ID[tid] == (name, blk, size)
        assert type_name(tid) == name


def test_named_constants():
    for const in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                  "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS"):
        assert getattr(ggml_types, const) == int(GGMLQuantizationType[const])


def test_helpers():
    assert type_name(12345) == "type12345"
    assert tensor_nbytes(TYPES["Q4_K"][0], 512) == 288
    with pytest.raises(ValueError):
        tensor_nbytes(TYPES["Q4_K"][0], 100)
    with pytest.raises(ValueError):
        tensor_nbytes(12345, 1)
