#!/usr/bin/python3
# The peer of `attn bench`'s backward rows: PyTorch's autograd through its CPU math path (PyTorch 1.13, Debian's
# python3-torch, has no fused CPU attention backward), on the bench's shape: B=1, H=8, D=64, self-attention, float,
# normal inputs and dout, one thread. Times o.backward(dout) alone (the forward, like the bench's, is untimed) and
# prints one JSON line; exit 3 when torch is not installed.
#   torch_backward.py T [causal]
import json
import sys
import time

try:
    import torch
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


def once():
    s = (q @ k.transpose(-1, -2)) * D ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ v
    for t in (q, k, v):
        t.grad = None
    start = time.perf_counter()
    o.backward(dout)
    return (time.perf_counter() - start) * 1000


once()  # untimed: the allocator's first touch of its pages
times = sorted(once() for _ in range(3))
print(json.dumps({"impl": "torch-autograd", "torch": torch.__version__, "T": T, "causal": causal, "threads": 1,
                  "ms": times[1], "ms_all": times}))
