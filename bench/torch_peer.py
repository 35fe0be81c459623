#!/usr/bin/python3
# The peer of `attn bench`'s tiled rows: PyTorch on the CPU (1.13, Debian's python3-torch) on the bench's shape:
# B=1, H=8, D=64, self-attention, float, normal inputs and dout, one thread. Times, medians of three after one
# untimed call:
#   forward   its SDPA (torch.nn.functional._scaled_dot_product_attention, 1.13's name for what 2.x made public),
#             without autograd;
#   backward  o.backward(dout) of the math path (1.13 has no fused CPU attention backward), the forward untimed.
# Prints one JSON line; exit 3 when torch is not installed.
#   torch_peer.py T [causal]
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print(json.dumps({"error": "torch is not installed (Debian: python3-torch)"}))
    sys.exit(3)

T = int(sys.argv[1])
causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
B, H, D = 1, 8, 64
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, H, T, D, generator=g, requires_grad=True) for _ in range(3))
dout = torch.randn(B, H, T, D, generator=g)
mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else None


def forward():
    with torch.no_grad():
        start = time.perf_counter()
        F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)
        return (time.perf_counter() - start) * 1000


def backward():
    s = (q @ k.transpose(-1, -2)) * D ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ v
    for t in (q, k, v):
        t.grad = None
    start = time.perf_counter()
    o.backward(dout)
    return (time.perf_counter() - start) * 1000


def median_ms(f):
    f()  # untimed: the allocator's first touch of its pages
    times = sorted(f() for _ in range(3))
    return times[1], times


forward_ms, forward_all = median_ms(forward)
backward_ms, backward_all = median_ms(backward)
print(json.dumps({"impl": "torch", "torch": torch.__version__, "T": T, "causal": causal, "threads": 1,
                  "forward": "_scaled_dot_product_attention", "forward_ms": forward_ms, "forward_ms_all": forward_all,
                  "backward": "autograd", "backward_ms": backward_ms, "backward_ms_all": backward_all}))
