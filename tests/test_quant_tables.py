"""The IQ / MXFP4 lookup tables (reflex_ipc/quant_tables.py, kernels/quant_tables.h) are ggml's:
regenerated from the llama-cpp-python 0.3.36 sdist's ggml-common.h, they come out identical."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    path = os.path.join(ROOT, "scripts", "fixtures", "make_quant_tables.py")
    spec = importlib.util.spec_from_file_location("make_quant_tables", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tables_are_ggmls():
    from reflex_ipc.testing.sdist import ggml_common_h

    gen = _generator()
    for path, text in gen.outputs(ggml_common_h()).items():
        with open(path) as fh:
            assert fh.read() == text, f"{os.path.relpath(path, ROOT)} is stale: run scripts/fixtures/make_quant_tables.py"


def test_sign_table_is_even_parity():
    """ksigns_iq2xs[i]: the 7 bits of i and an 8th making the count of negative signs even."""
    from reflex_ipc.quant_tables import KSIGNS_IQ2XS

    assert [b & 127 for b in KSIGNS_IQ2XS] == list(range(128))
    assert all(bin(b).count("1") % 2 == 0 for b in KSIGNS_IQ2XS)
