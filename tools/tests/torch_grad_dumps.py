#!/usr/bin/python3
"""attn check --dout on PyTorch autograd gradients (ctest label `cli`; needs Debian's python3-torch).

For float64 and float32, q, k, v and dout are random; PyTorch 1.13's CPU math path (softmax(q k^T * scale + mask) v,
with a causal mask given as a float -inf bias) computes the output, and autograd its gradients dq, dk, dv. They must
pass `attn check --dout` (exit 0) under the generic model, and a dq from a backward that forgets the scale must fail
(exit 1), as must a dk and dv swapped between two heads.
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch

from cli_run import run


def main():
    attn = sys.argv[1]
    failures = []
    torch.manual_seed(20261204)
    for dtype in (torch.float64, torch.float32):
        B, H, Tq, Tk, D = 2, 3, 20, 24, 16
        q, k, v = (torch.randn(B, H, n, D, dtype=dtype, requires_grad=True) for n in (Tq, Tk, Tk))
        dout = torch.randn(B, H, Tq, D, dtype=dtype)
        scale = D ** -0.5
        # Bottom-right causal: query i reads keys j <= i + Tk - Tq.
        allowed = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        bias = torch.zeros(Tq, Tk, dtype=dtype).masked_fill(~allowed, float("-inf"))
        out = torch.softmax(q @ k.transpose(-1, -2) * scale + bias, -1) @ v
        out.backward(dout)
        work = tempfile.mkdtemp(prefix="attn-torch-grad-" + str(dtype).split(".")[-1] + "-")
        tensors = dict(q=q.detach(), k=k.detach(), v=v.detach(), dout=dout, dq=q.grad, dk=k.grad, dv=v.grad,
                       dq_unscaled=q.grad / scale, dk_swapped=k.grad.flip(1), allowed=allowed)
        for n, t in tensors.items():
            np.save(os.path.join(work, n + ".npy"), t.numpy())
        base = ["check", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--allowed-mask", "allowed.npy",
                "--dout", "dout.npy"]
        code, text = run(attn, base + ["--candidate-dq", "dq.npy", "--candidate-dk", "dk.npy",
                                       "--candidate-dv", "dv.npy", "--json", "grads.json"], work)
        print(text)
        if code != 0:
            failures.append(f"{dtype}: PyTorch's autograd gradients should pass, exit {code}")
        else:
            report = json.load(open(os.path.join(work, "grads.json")))["gradients"]
            for name in ("dq", "dk", "dv"):
                t = report[name]["max_error_over_bound"]
                print(f"{dtype} {name}: max error / bound {t}")
                if not report[name]["pass"] or report[name]["elements"] != tensors[name].numel():
                    failures.append(f"{dtype} {name}: report {report[name]}")
        for wrong, flag in (("dq_unscaled", "--candidate-dq"), ("dk_swapped", "--candidate-dk")):
            code, text = run(attn, base + [flag, wrong + ".npy"], work)
            if code != 1:
                failures.append(f"{dtype}: {wrong} should fail (exit 1), got {code}: {text}")
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("attn check --dout: PyTorch autograd gradients pass; the broken ones fail")


if __name__ == "__main__":
    main()
