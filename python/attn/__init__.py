"""attn for Python: the library's attention, the oracle's verdict on any output, and attn's property suite run
against a Python function (NumPy or PyTorch).

From a checkout, after any ./attn command has built it:  PYTHONPATH=build/release/python /usr/bin/python3

    import attn
    out = attn.sdpa(q, k, v, causal="top-left")                  # q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv)
    r = attn.check(q, k, v, my_out, causal="top-left")           # r.passed, r.max_ulp, r.tightness, r.worst_index
    result = attn.properties(my_attention, masks=("bool",))      # the suite on my_attention(q, k, v, mask, causal, scale)

Masks are *allowed* masks, as everywhere in attn: True = the query may read the key (PyTorch's bool attn_mask of
scaled_dot_product_attention means the same; nn.MultiheadAttention's means the opposite).
"""
import json
import os
import re
import tempfile

import numpy as np

from . import _attn
from ._attn import ConfigError, Error, MaskError, ShapeError, ValueError  # noqa: F401  (attn's errors)

__all__ = ["sdpa", "sdpa_backward", "oracle", "check", "properties", "CheckResult", "PropertiesResult", "Unsupported",
           "Error", "ShapeError", "MaskError", "ValueError", "ConfigError"]


class Unsupported(Exception):
    """Raised by a function under attn.properties for a case it does not handle: the case is skipped and counted
    under the message, like a kernel library's ATTN_KERNEL_UNSUPPORTED."""


def _is_tensor(x):
    return hasattr(x, "detach") and hasattr(x, "numpy")


def _is_bfloat16_tensor(x):
    return _is_tensor(x) and str(x.dtype) == "torch.bfloat16"


def _array(x, name):
    """A NumPy array of x without a copy where possible (CPU PyTorch tensors share their memory); a torch.bfloat16
    tensor, which NumPy has no dtype for, as its int16 bits."""
    if x is None:
        return None
    if _is_tensor(x):
        x = x.detach().cpu()
        if _is_bfloat16_tensor(x):
            import torch
            x = x.view(torch.int16)
        x = x.numpy()
    a = np.asarray(x)
    bits = a.dtype.kind in "iu" and a.itemsize == 2
    if (a.dtype.kind == "f" or bits) and any(s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    if a.dtype.kind not in "fb" and not bits:
        raise ConfigError(f"attn: {name} must be a float32, float64 or float16 array, a torch.bfloat16 tensor, the "
                          f"int16 bits of a 16-bit type (with dtype=) or a bool mask, got {a.dtype}")
    return a


def _dtype(q, dtype):
    """The dtype the compiled half reads 16-bit integers as: the one named, or bfloat16 for a torch.bfloat16 q."""
    if dtype is not None:
        return str(dtype).replace("torch.", "")
    return "bfloat16" if _is_bfloat16_tensor(q) else ""


def _result(a, q):
    """An output of the compiled half for the caller: a torch.bfloat16 tensor where q was one (the compiled half
    gives bfloat16 as int16 bits), else the NumPy array."""
    if a is not None and _is_bfloat16_tensor(q):
        import torch
        return torch.from_numpy(a).view(torch.bfloat16)
    return a


# The options every call takes as keywords, from the library's option table (attn/options.hpp): names, defaults
# and help are written there once.
_OPTION_ROWS = _attn.option_table()
_LIBRARY_ONLY = ("backend", "num_threads")


def _options(options):
    """The keywords for the compiled half: arrays for bias and alibi_slopes, the rest as given (it checks them)."""
    return {k: (_array(v, k) if k in ("bias", "alibi_slopes") else v) for k, v in options.items()}


def _options_doc(library_call):
    rows = [r for r in _OPTION_ROWS if library_call or r["python"] not in _LIBRARY_ONLY]
    rows = [r for r in rows if r["python"] not in ("return_weights", "return_lse")]  # sdpa's own keywords
    return "\n\n    Options (keywords; a name not listed is an attn.ConfigError):\n" + "\n".join(
        f"      {r['python']} (default {r['default']}): {r['help']}" for r in rows)


_DTYPES_DOC = """
    Inputs: float32, float64 or float16 (NumPy arrays or torch tensors), or torch.bfloat16 tensors; k, v, the bias
    and the slopes of q's dtype. A bfloat16 result is a torch.bfloat16 tensor (NumPy has no bfloat16); dtype=
    "bfloat16" or "float16" reads int16/uint16 arrays as the bits of that type (tensor.view(torch.int16).numpy(),
    as `attn check --dtype` does) and gives a bfloat16 result as such bits. 16-bit inputs compute in float32 and
    round once to their dtype."""

_MODEL_DOC = """
    model: the error model of the kernel the bound is for: "generic" (any kernel), "reference" or "tiled" (online
    softmax with key_block keys per block). A 16-bit kernel that rounds to its storage type inside the computation
    says where: logit_storage_roundings (1: q k^T stored in 16 bits; 2: then scaled in 16 bits too, as an unfused
    16-bit matmul and multiplication do), probabilities_in_storage (the exps or weights rounded to 16 bits before
    the P V product, as FlashAttention's forward and a 16-bit softmax do)."""


def sdpa(q, k, v, mask=None, *, return_weights=False, return_lse=False, dtype=None, **options):
    """softmax(scale q k^T, masked) v with attn's library: a NumPy array, or with return_weights / return_lse a
    tuple (output, weights if asked, lse if asked); lse (..., Tq) is in the compute type (float32 for 16-bit
    inputs), what sdpa_backward reads.

    mask: bool, broadcastable to (..., Tq, Tk), True = may attend. causal: None, "top-left" or "bottom-right".
    window: (left, right), FlashAttention's window_size (-1 = unbounded). bias: broadcastable to (..., Tq, Tk).
    alibi_slopes: broadcastable to the batch dims ((H) or (B, H))."""
    r = _attn.sdpa(_array(q, "q"), _array(k, "k"), _array(v, "v"), _array(mask, "mask"), return_weights,
                   return_lse, _options(options), _dtype(q, dtype))
    if not (return_weights or return_lse):
        return _result(r, q)
    parts = [_result(r[0], q)] + ([_result(r[1], q)] if return_weights else [])
    return tuple(parts + ([r[-1]] if return_lse else []))


def sdpa_backward(q, k, v, out, lse, dout, mask=None, *, dtype=None, **options):
    """The gradients (dq, dk, dv) of sum(dout * output) with attn's library (attn/backward.hpp): q, k, v, mask and
    the options as in the forward call that gave out and lse (sdpa(..., return_lse=True)); dout of out's shape and
    dtype. The backend option picks the reference backward or the tiled one (FlashAttention-2's)."""
    r = _attn.sdpa_backward(_array(q, "q"), _array(k, "k"), _array(v, "v"), _array(out, "out"), _array(lse, "lse"),
                            _array(dout, "dout"), _array(mask, "mask"), _options(options), _dtype(q, dtype))
    return tuple(_result(x, q) for x in r)


def oracle(q, k, v, mask=None, *, model="generic", key_block=64, logit_storage_roundings=0,
           probabilities_in_storage=False, dtype=None, **options):
    """The exact attention of these inputs (correctly rounded to their dtype) and, per element, the rigorous bound
    on the error of a kernel following `model`: a dict with output, bound, weights, weights_bound, model, bits
    and dtype."""
    r = _attn.oracle(_array(q, "q"), _array(k, "k"), _array(v, "v"), _array(mask, "mask"), model, key_block,
                     int(logit_storage_roundings), bool(probabilities_in_storage), _options(options),
                     _dtype(q, dtype))
    r["output"], r["weights"] = _result(r["output"], q), _result(r["weights"], q)
    return r


sdpa.__doc__ += _DTYPES_DOC + _options_doc(True)
sdpa_backward.__doc__ += _DTYPES_DOC + _options_doc(True)
oracle.__doc__ += _DTYPES_DOC + _MODEL_DOC + _options_doc(False)


class CheckResult:
    """attn's verdict on one output: passed (every element within its rigorous bound), max_ulp, max_rel,
    tightness (max error/bound; <= 1 passes), violations of elements, the worst element (worst_index,
    worst_computed, worst_exact, worst_bound), suspicious (the statistical verdict) and summary. With gradients:
    gradients, a dict of dq, dk, dv (those given), each with the same fields and its own passed; passed is then
    every verdict's, and summary has one line per gradient."""

    def __init__(self, fields):
        self.__dict__.update(fields)

    def __bool__(self):
        return bool(self.passed)

    def __repr__(self):
        return f"CheckResult({self.summary})"  # the summary opens with the verdict (pass or FAIL)


def check(q, k, v, out=None, mask=None, *, dout=None, dq=None, dk=None, dv=None, model="generic", key_block=64,
          logit_storage_roundings=0, probabilities_in_storage=False, dtype=None, **options):
    """Checks `out` (your kernel's output for q, k, v, of q's dtype) against the oracle, and with dout the gradients
    dq, dk, dv (any of them; e.g. from torch autograd with out.backward(dout)) of sum(dout * output) against the
    exact ones and the bound for a backward of `model` (oracle/BOUNDS.md section 12): what `attn check` and
    `attn check --dout` do with .npy files (the options as in oracle)."""
    grads = {"dq": dq, "dk": dk, "dv": dv}
    given = {name: g for name, g in grads.items() if g is not None}
    if (dout is None) != (not given):
        raise ConfigError("attn.check: dout and at least one of dq, dk, dv go together (the gradients of "
                          "sum(dout * output))")
    if out is None and dout is None:
        raise ConfigError("attn.check: give out (the output), or dout with dq, dk or dv (gradients)")
    arrays = (_array(q, "q"), _array(k, "k"), _array(v, "v"))
    model_args = (model, key_block, int(logit_storage_roundings), bool(probabilities_in_storage))
    common = (_options(options), _dtype(q, dtype))
    fields = {}
    if out is not None:
        fields = _attn.check(*arrays, _array(out, "out"), _array(mask, "mask"), *model_args, *common)
    if dout is not None:
        g = _attn.check_gradients(*arrays, _array(dout, "dout"), *(_array(grads[n], n) for n in ("dq", "dk", "dv")),
                                  _array(mask, "mask"), *model_args, *common)
        gradients = {name: g[name] for name in given}
        lines = [f"{name}: {r['summary']}" for name, r in gradients.items()]
        if out is None:
            fields = {"passed": g["passed"], "summary": "\n".join(lines), "model": g["model"], "dtype": g["dtype"],
                      "oracle_bits": g["oracle_bits"]}
        else:
            fields["passed"] = fields["passed"] and g["passed"]
            fields["summary"] = "\n".join([f"output: {fields['summary']}"] + lines)
        fields["gradients"] = gradients
    return CheckResult(fields)


check.__doc__ += _DTYPES_DOC + _MODEL_DOC + _options_doc(False)


class PropertiesResult:
    """What attn.properties found: passed (no run failed), runs (one dict per property and dtype: property,
    dtype, status passed/failed/skipped/n/a, cases, message, skipped reasons, reproduce, case_file), failures
    (the failed runs), seed (RapidCheck's, to rerun the same cases) and exit_code (attn's)."""

    def __init__(self, report, exit_code):
        self.seed = report.get("seed")
        self.runs = report.get("runs", [])
        self.failures = [r for r in self.runs if r.get("status") == "failed"]
        self.exit_code = exit_code
        self.passed = exit_code == 0

    def __bool__(self):
        return self.passed

    def __repr__(self):
        judged = [r for r in self.runs if r.get("status") in ("passed", "failed")]
        return (f"PropertiesResult({len(judged) - len(self.failures)} of {len(judged)} runs passed, "
                f"failed: {sorted({r['property'] for r in self.failures}) or 'none'})")


_MASKS = {"bool": 1, "causal-top-left": 2, "causal-bottom-right": 4}
_EMPTY = {"zero": 1, "nan": 2}
_DTYPES = {"float32": 1, "float64": 2}


def _flags(names, table, what):
    bits = 0
    for n in names:
        if n not in table:
            raise ConfigError(f"attn.properties: {what} must be among {sorted(table)}, got {n!r}")
        bits |= table[n]
    return bits


def properties(fn, *, name=None, dtypes=("float32", "float64"), masks=("bool", "causal-top-left",
               "causal-bottom-right"), empty_rows=(), gqa=False, strided=False, max_dk=0, max_dv=0,
               error_model="generic", key_block=0, exp_ulps=0.0, framework="numpy", property=None, seed=None,
               cases=None, thorough=False, replay=None, cases_dir="attn-cases", program=None):
    """Runs attn's property suite against fn(q, k, v, mask, causal, scale) -> out, as `attn properties --kernel`
    does against a kernel library: RapidCheck draws the cases, shrinks failures, saves them under
    cases_dir/<name>/ and prints the line that replays each (attn.properties(fn, replay=...)).

    fn gets q (B, H, Tq, Dk), k (B, G, Tk, Dk), v (B, G, Tk, Dv), mask (B, H, Tq, Tk) bool or None (True = may
    attend), causal None/"top-left"/"bottom-right", scale (float), and when empty_rows declares both policies
    also empty_rows="zero"/"nan"; it returns out (B, H, Tq, Dv) in q's dtype. The arrays are views of memory attn
    owns, valid during the call. framework="torch" passes torch tensors (sharing that memory) instead.

    What fn declares decides what it gets; the rest is skipped and listed: dtypes, masks (any of bool,
    causal-top-left, causal-bottom-right), empty_rows (zero, nan: what a query with no allowed key gives), gqa
    (G < H allowed), strided (inputs in (B, T, H, D) memory order, broadcast masks with stride 0), max_dk,
    max_dv. error_model (generic, reference, tiled with key_block) and exp_ulps say how the oracle bounds it.
    Raise attn.Unsupported for a case fn does not handle. Returns a PropertiesResult."""
    if name is None:
        name = re.sub(r"\W", "_", getattr(fn, "__name__", "python_kernel"))
        name = "python_kernel" if name in ("", "_lambda_") or not name[0].isalpha() else name
    if framework not in ("numpy", "torch"):
        raise ConfigError(f"attn.properties: framework must be numpy or torch, got {framework!r}")
    call = fn
    if framework == "torch":
        import torch

        def call(q, k, v, mask, causal, scale, **kw):
            t = [torch.from_numpy(x) if x is not None else None for x in (q, k, v, mask)]
            return fn(*t, causal, scale, **kw)

    declaration = dict(name=name, version="", description=f"the Python function {getattr(fn, '__qualname__', name)}",
                       dtypes=_flags(dtypes, _DTYPES, "dtypes"), masks=_flags(masks, _MASKS, "masks"),
                       empty_rows=_flags(empty_rows, _EMPTY, "empty_rows"), gqa=bool(gqa), strided=bool(strided),
                       max_dk=int(max_dk), max_dv=int(max_dv), error_model=error_model, key_block=int(key_block),
                       exp_ulps=float(exp_ulps), unsupported=Unsupported)
    with tempfile.TemporaryDirectory(prefix="attn-properties-") as tmp:
        report_path = os.path.join(tmp, "runs.json")
        args = ["properties", "--json", report_path, "--cases-dir", os.path.abspath(cases_dir)]
        if property:
            args += ["--property", property]
        if thorough:
            args.append("--thorough")
        if replay:
            args += ["--replay", replay]
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        params = [f"seed={int(seed)}"] if seed is not None else []
        params += [f"max_success={int(cases)}"] if cases is not None else []
        if params:
            env["RC_PARAMS"] = " ".join(params)
        code = _attn.serve(call, declaration, program or _attn.ATTN_PROGRAM, args,
                           [f"{k}={v}" for k, v in env.items()])
        report = {}
        if os.path.exists(report_path):
            with open(report_path) as f:
                report = json.load(f)
    if code == 2:
        raise ConfigError("attn.properties: attn refused the run (exit 2); its message is above")
    return PropertiesResult(report, code)
