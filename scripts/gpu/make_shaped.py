#!/usr/bin/env python3
"""Large model-shaped synthetic GGUFs for GPU timing (reflex_ipc.testing.shaped says what).
    PYTHONPATH=CHECKOUT scripts/gpu/make_shaped.py MODEL OUT.gguf [--tiny] [--vocab NPZ]
    PYTHONPATH=CHECKOUT scripts/gpu/make_shaped.py --list"""
import sys

from reflex_ipc.testing.shaped import main

if __name__ == "__main__":
    sys.exit(main())
