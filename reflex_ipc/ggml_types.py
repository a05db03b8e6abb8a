"""GGML tensor types: ids, block sizes and bytes per block.

A plain table so that the load path does not import the `gguf` package (about
0.1 s on its own beyond numpy). tests/test_ggml_types.py checks it against
`gguf.constants` so it cannot drift.
"""

# name: (type id, elements per block, bytes per block)
TYPES = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q8_1": (9, 32, 40),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "Q8_K": (15, 256, 292),
    "IQ2_XXS": (16, 256, 66),
    "IQ2_XS": (17, 256, 74),
    "IQ3_XXS": (18, 256, 98),
    "IQ1_S": (19, 256, 50),
    "IQ4_NL": (20, 32, 18),
    "IQ3_S": (21, 256, 110),
    "IQ2_S": (22, 256, 82),
    "IQ4_XS": (23, 256, 136),
    "I8": (24, 1, 1),
    "I16": (25, 1, 2),
    "I32": (26, 1, 4),
    "I64": (27, 1, 8),
    "F64": (28, 1, 8),
    "IQ1_M": (29, 256, 56),
    "BF16": (30, 1, 2),
    "TQ1_0": (34, 256, 54),
    "TQ2_0": (35, 256, 66),
    "MXFP4": (39, 32, 17),
}

BY_ID = {tid: (name, blk, size) for name, (tid, blk, size) in TYPES.items()}

F32, F16, BF16 = 0, 1, 30
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
IQ4_NL, IQ4_XS = 20, 23


def type_name(type_id: int) -> str:
    entry = BY_ID.get(type_id)
    return entry[0] if entry else f"type{type_id}"


def tensor_nbytes(type_id: int, n_elements: int) -> int:
    """Bytes that n_elements of this type occupy; ValueError when unknown or not whole blocks."""
    entry = BY_ID.get(type_id)
    if entry is None:
        raise ValueError(f"unknown ggml type {type_id}")
    _, blk, size = entry
    if n_elements % blk:
        raise ValueError(f"{entry[0]}: {n_elements} elements is not a whole number of {blk}-element blocks")
    return n_elements // blk * size
