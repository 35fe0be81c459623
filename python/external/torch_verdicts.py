#!/usr/bin/python3
"""The property suite on PyTorch's own attention (Debian's python3-torch, 1.13), through the Python module: the
verdict table of docs/external.md. From the checkout, after any ./attn command has built the module:

    PYTHONPATH=build/release/python /usr/bin/python3 python/external/torch_verdicts.py --write docs/external.md

saves each shrunk failure under regressions/external/torch/<kernel>/ and replays one with
    ... torch_verdicts.py --replay <kernel> <case file>

Each kernel below is a thin wrapper that hands attn's q, k, v (B, H, T, D) and allowed mask to PyTorch in
PyTorch's own conventions; what the wrapper cannot express it declines with attn.Unsupported (counted as skipped).
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import attn


def default_scale_only(q, scale):
    if abs(scale - 1.0 / math.sqrt(q.shape[-1])) > 1e-12 * scale:
        raise attn.Unsupported("a scale other than 1/sqrt(Dk) (PyTorch 1.13 takes none)")


def sdpa_mask(q, k, v, mask, causal, scale):
    """F._scaled_dot_product_attention with a bool attn_mask (True = take part); causal cases arrive folded into the mask."""
    default_scale_only(q, scale)
    return F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, False)[0]


def sdpa_is_causal(q, k, v, mask, causal, scale):
    """F._scaled_dot_product_attention(is_causal=True), declared as the top-left causal flag."""
    default_scale_only(q, scale)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal is not None)[0]


def mha(q, k, v, mask, causal, scale):
    """nn.MultiheadAttention (batch_first) with identity in- and out-projections, so that it computes exactly the
    heads' attention: embed_dim = H * Dk; its bool attn_mask is a *blocked* mask (True = may not attend)."""
    B, H, Tq, Dk = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    default_scale_only(q, scale)
    if Dv != Dk:
        raise attn.Unsupported("Dv != Dk (one embed_dim for queries and values)")
    if not all(torch.isfinite(t).all() for t in (q, k, v)):
        raise attn.Unsupported("non-finite inputs (the identity projections' 0 * NaN spreads them over all heads)")
    E = H * Dk
    m = torch.nn.MultiheadAttention(E, H, bias=False, batch_first=True, dtype=q.dtype)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.eye(E, dtype=q.dtype).repeat(3, 1))
        m.out_proj.weight.copy_(torch.eye(E, dtype=q.dtype))
        to_tokens = lambda x: x.permute(0, 2, 1, 3).reshape(B, x.shape[2], E)  # (B, H, T, D) -> (B, T, H D)
        blocked = None if mask is None else (~mask).reshape(B * H, Tq, Tk)
        out, _ = m(to_tokens(q), to_tokens(k), to_tokens(v), attn_mask=blocked, need_weights=False)
    return out.reshape(B, Tq, H, Dk).permute(0, 2, 1, 3).contiguous()


# name, function, declaration, what it is
KERNELS = [
    ("torch_sdpa_mask", sdpa_mask, dict(masks=("bool",), empty_rows=("nan",)),
     "`F._scaled_dot_product_attention(q, k, v, attn_mask)` with a bool mask (causal cases as masks)"),
    ("torch_sdpa_is_causal", sdpa_is_causal, dict(masks=("causal-top-left",), empty_rows=("nan",)),
     "`F._scaled_dot_product_attention(q, k, v, is_causal=True)`, declared top-left"),
    ("torch_sdpa_is_causal_as_br", sdpa_is_causal, dict(masks=("causal-bottom-right",), empty_rows=("nan",)),
     "the same `is_causal=True` declared bottom-right, as code ported from FlashAttention >= 2.1 would assume"),
    ("torch_mha", mha, dict(masks=("bool",), empty_rows=("nan",)),
     "`nn.MultiheadAttention` with identity projections and a blocked `attn_mask`"),
]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(ROOT, "regressions", "external", "torch")


def verdicts(seed, properties=None, cases_dir=CASES, kernels=None):
    """{kernel: {property: {dtype: run}}} for the kernels above (or those named)."""
    table = {}
    for name, fn, declared, _ in KERNELS:
        if kernels and name not in kernels:
            continue
        for prop in properties or [None]:
            result = attn.properties(fn, name=name, framework="torch", property=prop, seed=seed,
                                     cases_dir=cases_dir, **declared)
            for run in result.runs:
                table.setdefault(name, {}).setdefault(run["property"], {})[run.get("dtype", "")] = run
    return table


def status_of(runs):
    s = {r["status"] for r in runs.values()}
    return "fails" if "failed" in s else "passes" if "passed" in s else "skipped" if "skipped" in s else "n/a"


def markdown(table, seed):
    lines = ["| kernel | property | verdict | float | double | first failure (shrunk), or why cases were skipped |",
             "|---|---|---|---|---|---|"]
    for name, _, _, _ in KERNELS:
        for prop, runs in table[name].items():
            verdict = status_of(runs)
            if verdict == "n/a":
                continue
            cell = lambda d: runs.get(d, {}).get("status", "-")
            failed = [r for r in runs.values() if r["status"] == "failed"]
            if failed:
                case = os.path.relpath(failed[0]["case_file"], ROOT)
                detail = f"{failed[0]['message']}; replay: `--replay {name} '{case}'`"
            else:  # why cases were skipped, most frequent first
                reasons = {}
                for r in runs.values():
                    for reason, count in r.get("skipped", {}).items():
                        reasons[reason] = reasons.get(reason, 0) + count
                detail = "; ".join(f"skipped {n}: {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1])[:2])
            detail = detail.replace("|", "\\|")
            lines.append(f"| {name} | {prop} | {verdict} | {cell('float')} | {cell('double')} | {detail} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", help="write the table between the markers of this Markdown file")
    parser.add_argument("--cases-dir", default=CASES)
    parser.add_argument("--replay", nargs=2, metavar=("KERNEL", "CASE_FILE"), help="rerun one saved case")
    args = parser.parse_args()
    if args.replay:
        name, case = args.replay
        kernel = {k[0]: k for k in KERNELS}[name]
        result = attn.properties(kernel[1], name=name, framework="torch", replay=case, cases_dir=args.cases_dir,
                                 **kernel[2])
        return 0 if result.passed else 1
    table = markdown(verdicts(args.seed, cases_dir=args.cases_dir), args.seed)
    print(table)
    if args.write:
        text = open(args.write).read()
        begin, end = "<!-- verdicts: begin -->", "<!-- verdicts: end -->"
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        open(args.write, "w").write(f"{head}{begin}\n{table}\n{end}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
