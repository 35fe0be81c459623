"""The statistical verdict on correct kernels attn did not write (oracle/BOUNDS.md section 10, "Stagnation"): a NumPy
float32 loop and PyTorch's float32 softmax(q k^T s + bias) v, on data whose running sums drop terms below their last
bits (attention sinks with and without causal masks, one-hot-ish rows, values in [1, 2), bfloat16-representable and
small-integer data), judged under the generic and the reference model. None may be called suspicious, nor be over
its rigorous bound. ATTN_SWEEP_CASES=N runs N cases per kernel and class (default 2; Tk up to 16384 from 4 on).
Run: PYTHONPATH=build/release/python /usr/bin/python3 -m pytest python/tests/test_statistical_sweep.py"""
import os

import numpy as np
import pytest
import torch

import attn

CLASSES = ["sink", "sink-causal", "one-hot", "unit-values", "bf16", "integers"]
CASES = int(os.environ.get("ATTN_SWEEP_CASES", "2"))


def bf16_representable(x):
    """x (float32) rounded to the nearest bfloat16, as float32."""
    return torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()


def case(kind, seed):
    rng = np.random.default_rng(seed)
    lengths = [256, 1024, 4096] + ([16384] if CASES >= 4 else [])
    Tq, Tk, D = int(rng.integers(1, 9)), int(rng.choice(lengths)), int(rng.choice([32, 64, 128]))
    if kind == "integers":
        q, k, v = (rng.integers(-3, 4, s).astype(np.float32) for s in ((Tq, D), (Tk, D), (Tk, D)))
    else:
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((Tq, D), (Tk, D), (Tk, D)))
    if kind == "unit-values":
        v = rng.uniform(1, 2, (Tk, D)).astype(np.float32)
    if kind == "bf16":
        q, k, v = bf16_representable(q), bf16_representable(k), bf16_representable(v)
    bias = np.zeros((Tq, Tk), np.float32)
    height = np.float32(rng.uniform(10, 20))
    if kind == "one-hot":  # a different dominant key per row, visible under the causal rule
        for i in range(Tq):
            bias[i, rng.integers(0, i + 1)] = height
    elif kind != "bf16" or seed % 2 == 0:
        bias[:, 0] = height  # the BOS sink
    causal = "bottom-right" if kind == "sink-causal" else None
    return q, k, v, bias, causal


def visible(Tq, Tk, causal):
    if causal is None:
        return np.ones((Tq, Tk), bool)
    return np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + Tk - Tq


def numpy_loop(q, k, v, bias, causal):
    """Attention in float32 as a plain loop over keys: float32 logits, exp, one running sum per row."""
    s = (q @ k.T) * np.float32(1 / np.sqrt(q.shape[1])) + bias
    s = np.where(visible(*s.shape, causal), s, np.float32(-np.inf))
    e = np.exp(s - s.max(axis=1, keepdims=True)).astype(np.float32)
    total = np.zeros((q.shape[0], 1), np.float32)
    acc = np.zeros((q.shape[0], v.shape[1]), np.float32)
    for j in range(k.shape[0]):
        total += e[:, j:j + 1]
        acc += e[:, j:j + 1] * v[j]
    return acc / total


def torch_float32(q, k, v, bias, causal):
    Q, K, V, b = (torch.from_numpy(x) for x in (q, k, v, bias))
    s = Q @ K.T * (1 / np.sqrt(q.shape[1])) + b
    s = s.masked_fill(torch.from_numpy(~visible(*s.shape, causal)), float("-inf"))
    return (torch.softmax(s, dim=-1) @ V).numpy()


@pytest.mark.parametrize("kernel", [numpy_loop, torch_float32], ids=["numpy-loop", "torch-float32"])
@pytest.mark.parametrize("kind", CLASSES)
def test_correct_float32_kernels_are_never_suspicious_on_stagnating_sums(kernel, kind):
    for n in range(CASES):
        q, k, v, bias, causal = case(kind, 1000 * CLASSES.index(kind) + n)
        out = kernel(q, k, v, bias, causal)
        for model in ("generic", "reference"):
            r = attn.check(q, k, v, out, causal=causal, bias=bias, model=model)
            shape = f"{kind} case {n} (Tq={q.shape[0]}, Tk={k.shape[0]}, D={q.shape[1]}) under {model}"
            assert r.passed, f"{shape}: {r.summary}"
            assert not r.suspicious, f"{shape}: {r.summary}"
