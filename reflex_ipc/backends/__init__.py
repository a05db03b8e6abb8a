"""Compute backends: base.py is the contract, numpy_ops.py the oracle, cuda_ops.py the GPU."""

DEVICES = ("auto", "cpu", "cuda", "numpy")  # what a request or --device may name
BACKENDS = ("numpy", "cpu", "cuda")  # the backends' names (ops.name)
