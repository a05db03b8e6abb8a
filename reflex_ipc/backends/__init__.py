"""Compute backends: base.py is the contract, numpy_ops.py the oracle, cuda_ops.py the GPU."""
