"""Test-wide settings.

Triton reads TRITON_INTERPRET when it is first imported, so the interpreter is switched on here,
before anything imports triton; FJIT_TRITON_CPU=0 then keeps the Triton executor off CPU tensors
except in the tests that ask for it (tests/test_triton.py), so the rest of the suite runs at torch
speed.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FJIT_TRITON_CPU", "0")

