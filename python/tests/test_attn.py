"""The Python module, used as a PyTorch or NumPy user would: attn.sdpa and attn.check on arrays and tensors, and
attn.properties on Python functions, a correct one passing and a buggy one failing with the property that names
the bug. Run: PYTHONPATH=build/release/python /usr/bin/python3 -m pytest python/tests"""
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn


def inputs(dtype=np.float32, B=2, H=3, Tq=5, Tk=6, Dk=4, Dv=2, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((B, H, Tq, Dk), (B, H, Tk, Dk), (B, H, Tk, Dv)))


def attention(q, k, v, mask, causal, scale, multiply_by_mask=False):
    """Plain NumPy attention in float64, rounded once. With multiply_by_mask, blocked keys get weight 0 by a
    multiplication over every key: the classic bug that lets a NaN in a padded value reach every output."""
    repeat = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, repeat, axis=1).astype(np.float64), np.repeat(v, repeat, axis=1).astype(np.float64)
    with np.errstate(over="ignore"):
        s = scale * np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k)
    Tq, Tk = s.shape[-2:]
    allowed = np.ones(s.shape, dtype=bool) if mask is None else np.broadcast_to(mask, s.shape).copy()
    i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
    if causal == "top-left":
        allowed &= j <= i
    elif causal == "bottom-right":
        allowed &= j <= i + Tk - Tq
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
        p = e / np.sum(e, axis=-1, keepdims=True)
    if multiply_by_mask:
        out = np.einsum("bhij,bhjd->bhid", p * allowed, v)
    else:  # each query sums over the keys it may read, and nothing else enters (a NaN stays where it is)
        with np.errstate(invalid="ignore"):
            out = np.where(allowed[..., None], p[..., None] * v[:, :, None], 0.0).sum(axis=3)
    return out.astype(q.dtype)


def test_sdpa_agrees_with_the_oracle_and_with_torch():
    q, k, v = inputs()
    out = attn.sdpa(q, k, v, causal="bottom-right")
    assert out.shape == (2, 3, 5, 2) and out.dtype == np.float32
    assert attn.check(q, k, v, out, causal="bottom-right").passed
    torch_out, _ = F._scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), None, 0.0, False, False)
    result = attn.check(q, k, v, torch_out)  # a torch tensor is taken as it is
    assert result.passed and result.violations == 0 and 0 < result.tightness <= 1
    assert len(result.worst_index) == 4 and result.max_ulp >= 0


def test_window_and_softcap_reach_the_library_and_the_oracle():
    q, k, v = inputs(np.float64, Tq=6, Tk=6)
    # A window (1, 0) is a band of two keys: it equals the explicit mask j in [i - 1, i].
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    band = (j >= i - 1) & (j <= i)
    windowed = attn.sdpa(q, k, v, window=(1, 0))
    assert np.array_equal(windowed, attn.sdpa(q, k, v, band))
    assert attn.check(q, k, v, windowed, window=(1, 0)).passed
    assert not attn.check(q, k, v, windowed).passed
    # A cap of 0.05 levels the weights (any two within e^0.1 of each other, so each within (e^0.1 - 1) / Tk of 1/Tk):
    # the output is within (e^0.1 - 1) max|v| of the mean of v, and only the capped check passes.
    capped = attn.sdpa(q, k, v, softcap=0.05, backend="tiled")
    assert attn.check(q, k, v, capped, softcap=0.05, model="tiled", key_block=256).passed
    assert not attn.check(q, k, v, capped).passed
    assert np.max(np.abs(capped - v.mean(axis=2, keepdims=True))) <= np.expm1(0.1) * np.max(np.abs(v)) + 1e-12
    exact = attn.oracle(q, k, v, softcap=0.05, window=(1, 0))["output"]
    assert attn.check(q, k, v, exact, softcap=0.05, window=(1, 0)).passed
    with pytest.raises(attn.ConfigError, match="softcap must be 0"):
        attn.sdpa(q, k, v, softcap=-1.0)
    with pytest.raises(attn.ConfigError, match="window"):
        attn.sdpa(q, k, v, window=(-2, 0))


def test_a_float_mask_is_torchs_attn_mask_and_alibi_its_written_bias():
    q, k, v = inputs(np.float64, Tq=5, Tk=7)
    rng = np.random.default_rng(3)
    bias = rng.standard_normal((5, 7))
    bias[:, 2] = -np.inf  # key 2 blocked for every query
    ours = attn.sdpa(q, k, v, bias=bias)
    # PyTorch's float attn_mask is added to the scaled logits: its output passes the check of the same bias, and
    # fails the check without it.
    theirs, _ = F._scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), torch.from_numpy(bias), 0.0, False,
                                                False)
    assert attn.check(q, k, v, theirs, bias=bias).passed
    assert not attn.check(q, k, v, theirs).passed
    assert attn.check(q, k, v, ours, bias=bias, model="reference").passed
    assert np.array_equal(ours, attn.sdpa(q, k, v, np.isfinite(bias), bias=np.where(np.isfinite(bias), bias, 0.0)))
    # ALiBi with the standard slopes of 3 heads equals its bias written out, -m |i + Tk - Tq - j|.
    slopes = np.array([2.0 ** (-8 * h / 3) for h in (1, 2, 3)])
    i, j = np.arange(5)[:, None], np.arange(7)[None, :]
    written = -slopes[:, None, None] * np.abs(i + 7 - 5 - j)
    assert np.array_equal(attn.sdpa(q, k, v, alibi_slopes=slopes), attn.sdpa(q, k, v, bias=written))
    assert attn.check(q, k, v, attn.sdpa(q, k, v, bias=written), alibi_slopes=slopes).passed
    with pytest.raises(attn.ConfigError, match="bias is float32"):
        attn.sdpa(q, k, v, bias=bias.astype(np.float32))
    with pytest.raises(attn.ShapeError, match="alibi_slopes"):
        attn.sdpa(q, k, v, alibi_slopes=np.ones(4))


def test_check_names_the_worst_element_of_a_wrong_output():
    q, k, v = inputs(np.float64)
    out = attn.sdpa(q, k, v)  # not causal
    result = attn.check(q, k, v, out, causal="top-left")
    assert not result.passed and result.violations > 0 and result.tightness > 1
    assert "over the bound" in result.summary


def test_bad_input_is_refused_naming_the_function_and_tensors():
    q, k, v = inputs()
    with pytest.raises(attn.ConfigError, match="attn.sdpa: k is float64, expected float32 like q"):
        attn.sdpa(q, k.astype(np.float64), v)
    with pytest.raises(attn.ShapeError, match=r"q has Dk=4 but k has Dk=3"):
        attn.sdpa(q, k[..., :3], v)
    with pytest.raises(attn.ConfigError, match="causal must be top-left or bottom-right"):
        attn.sdpa(q, k, v, causal="upper")
    # The remedy is said in Python's terms, from the option table.
    with pytest.raises(attn.MaskError, match="pass empty_rows='zero' or empty_rows='nan' to allow empty rows"):
        attn.sdpa(q, k, v, np.zeros((5, 6), dtype=bool))
    bad = q.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(attn.ValueError, match="pass check_finite=False to allow it"):
        attn.sdpa(bad, k, v)
    assert np.isnan(attn.sdpa(bad, k, v, check_finite=False)[0, 0, 0]).all()
    with pytest.raises(attn.ConfigError, match="attn.sdpa: unknown option 'casual'"):
        attn.sdpa(q, k, v, casual="top-left")
    with pytest.raises(attn.ConfigError, match="attn.oracle: unknown option 'backend'"):
        attn.oracle(q, k, v, backend="tiled")


def test_sixteen_bit_inputs_from_torch_and_numpy():
    q, k, v = inputs(Tq=7, Tk=9, Dk=8, Dv=4)
    # torch.bfloat16 in, torch.bfloat16 out; the same bits through int16 arrays with dtype="bfloat16".
    qb, kb, vb = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    out = attn.sdpa(qb, kb, vb, causal="top-left")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 3, 7, 4)
    bits = attn.sdpa(*(x.view(torch.int16).numpy() for x in (qb, kb, vb)), causal="top-left", dtype="bfloat16")
    assert bits.dtype == np.int16 and np.array_equal(bits, out.view(torch.int16).numpy())
    result = attn.check(qb, kb, vb, out, causal="top-left")
    assert result.passed and result.dtype == "bfloat16" and 0 < result.tightness <= 1
    exact = attn.oracle(qb, kb, vb, causal="top-left")
    assert exact["dtype"] == "bfloat16" and exact["output"].dtype == torch.bfloat16
    assert np.all(np.abs(out.float().numpy() - exact["output"].float().numpy()) <= exact["bound"])
    # NumPy's float16 in and out, and torch.float16 tensors as the same arrays.
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    out16 = attn.sdpa(q16, k16, v16, window=(2, 0))
    assert out16.dtype == np.float16
    assert attn.check(*(torch.from_numpy(x) for x in (q16, k16, v16)), torch.from_numpy(out16), window=(2, 0)).passed
    # A wrong 16-bit output fails: the scale left out.
    assert not attn.check(qb, kb, vb, attn.sdpa(qb, kb, vb, causal="top-left", scale=1.0), causal="top-left").passed
    with pytest.raises(attn.ConfigError, match=r"attn.sdpa: q is int16: the bits of a 16-bit type\? Say which"):
        attn.sdpa(*(x.view(torch.int16).numpy() for x in (qb, kb, vb)))
    with pytest.raises(attn.ConfigError, match="attn.check: out is float32, expected bfloat16 like q"):
        attn.check(qb, kb, vb, out.float())
    with pytest.raises(attn.ConfigError, match="attn.sdpa: k is float32, expected float16 like q"):
        attn.sdpa(q16, k, v16)


def test_a_bfloat16_torch_attention_is_judged_where_it_rounds():
    # PyTorch's attention in bfloat16 rounds the logits to bfloat16 twice (the matmul, then the scaling) and the
    # weights once (softmax) before the P V matmul. Against the bound of a kernel that computes in float32 and
    # rounds once, its output is over the bound; declared where it rounds, it is within it.
    q, k, v = inputs(Tq=16, Tk=32, Dk=16, Dv=8, seed=3)
    qb, kb, vb = (torch.from_numpy(x).to(torch.bfloat16) for x in (3 * q, k, v))
    scale = 1.0 / np.sqrt(16)
    s = (qb @ kb.transpose(-1, -2)) * torch.tensor(scale, dtype=torch.bfloat16)
    out = torch.softmax(s, dim=-1) @ vb
    assert out.dtype == torch.bfloat16
    once = attn.check(qb, kb, vb, out)
    assert not once.passed and once.tightness > 1
    where = attn.check(qb, kb, vb, out, logit_storage_roundings=2, probabilities_in_storage=True)
    assert where.passed, where.summary


def test_check_judges_gradients_from_torch_autograd():
    q, k, v = inputs(np.float64, Tq=6, Tk=7, Dk=4, Dv=3, seed=4)
    dout = np.random.default_rng(9).standard_normal((2, 3, 6, 3))
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    out, _ = F._scaled_dot_product_attention(tq, tk, tv, None, 0.0, False, True)  # causal, top-left
    out.backward(torch.from_numpy(dout))
    r = attn.check(q, k, v, out, dout=dout, dq=tq.grad, dk=tk.grad, dv=tv.grad, causal="top-left")
    assert r.passed, r.summary
    assert set(r.gradients) == {"dq", "dk", "dv"} and all(g["passed"] for g in r.gradients.values())
    assert 0 < r.gradients["dq"]["tightness"] <= 1 and "dv: pass" in r.summary
    # Gradients alone, and a wrong one: dk of the mask the other way round (bottom-right) is another function's.
    only = attn.check(q, k, v, dout=dout, dk=tk.grad, causal="top-left")
    assert only.passed and set(only.gradients) == {"dk"}
    assert not attn.check(q, k, v, dout=dout, dk=tk.grad, causal="bottom-right").passed
    wrong = tq.grad.clone()
    wrong[0, 0, 3, 1] *= 1.001
    bad = attn.check(q, k, v, dout=dout, dq=wrong, causal="top-left")
    assert not bad.passed and bad.gradients["dq"]["worst_index"] == (0, 0, 3, 1)
    with pytest.raises(attn.ConfigError, match="dout and at least one of dq, dk, dv go together"):
        attn.check(q, k, v, out, dq=tq.grad)


def test_the_librarys_backward_from_python_agrees_with_torch_and_the_oracle():
    q, k, v = inputs(np.float64, Tq=40, Tk=40, Dk=8, Dv=4, seed=6)
    dout = np.random.default_rng(2).standard_normal((2, 3, 40, 4))
    for backend in ("reference", "tiled"):
        out, lse = attn.sdpa(q, k, v, causal="top-left", return_lse=True, backend=backend)
        assert lse.shape == (2, 3, 40) and lse.dtype == np.float64
        dq, dk, dv = attn.sdpa_backward(q, k, v, out, lse, dout, causal="top-left", backend=backend)
        model = "tiled" if backend == "tiled" else "reference"
        r = attn.check(q, k, v, out, dout=dout, dq=dq, dk=dk, dv=dv, causal="top-left", model=model, key_block=256)
        assert r.passed, r.summary
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        F._scaled_dot_product_attention(tq, tk, tv, None, 0.0, False, True)[0].backward(torch.from_numpy(dout))
        assert np.allclose(dq, tq.grad.numpy(), atol=1e-12) and np.allclose(dv, tv.grad.numpy(), atol=1e-12)
    out, weights, lse = attn.sdpa(q, k, v, return_weights=True, return_lse=True)
    assert weights.shape == (2, 3, 40, 40) and lse.shape == (2, 3, 40)
    # bfloat16 tensors in, bfloat16 gradients out; the lse is float32 (the compute type).
    qb, kb, vb, db = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v, dout))
    out_b, lse_b = attn.sdpa(qb, kb, vb, return_lse=True)
    assert lse_b.dtype == np.float32
    grads = attn.sdpa_backward(qb, kb, vb, out_b, lse_b, db)
    assert all(g.dtype == torch.bfloat16 for g in grads)
    assert attn.check(qb, kb, vb, dout=db, dq=grads[0], dk=grads[1], dv=grads[2]).passed


def test_every_keyword_is_a_row_of_the_option_table():
    rows = {r["python"]: r for r in attn._attn.option_table()}
    for name in ("causal", "scale", "empty_rows", "window", "window_alignment", "softcap", "bias", "alibi_slopes",
                 "check_finite", "backend", "num_threads"):
        assert name in rows and f"      {name} (default {rows[name]['default']})" in attn.sdpa.__doc__
    assert "      backend (default" not in attn.check.__doc__


def test_a_correct_function_passes_and_what_it_does_not_declare_is_listed(tmp_path):
    result = attn.properties(attention, name="numpy_attention", gqa=True, seed=1, cases_dir=str(tmp_path))
    assert result.passed, result.failures
    judged = {r["property"] for r in result.runs if r["status"] == "passed"}
    assert {"matches_oracle_within_bound", "padding_values_do_not_matter", "future_tokens_do_not_change_past_outputs",
            "gqa_equals_mha_with_repeated_kv_heads"} <= judged
    # It declares no empty-row policy: the cases with empty rows are skipped, counted, never passed silently.
    empty = [r for r in result.runs if r["property"] == "empty_rows_follow_the_policy"]
    assert empty and all(r["status"] == "skipped" for r in empty)
    assert any("no allowed key" in reason for r in result.runs for reason in r.get("skipped", {}))


def test_mask_by_multiplication_fails_the_padding_property_and_replays(tmp_path):
    def multiplied(q, k, v, mask, causal, scale):
        return attention(q, k, v, mask, causal, scale, multiply_by_mask=True)

    result = attn.properties(multiplied, property="padding_values_do_not_matter", seed=1, cases_dir=str(tmp_path))
    assert not result.passed
    failure = result.failures[0]
    assert failure["property"] == "padding_values_do_not_matter"
    assert failure["reproduce"].startswith("attn.properties(fn, replay=")
    assert os.path.exists(failure["case_file"])
    assert not attn.properties(multiplied, replay=failure["case_file"], cases_dir=str(tmp_path)).passed
    assert attn.properties(attention, name="multiplied", replay=failure["case_file"], cases_dir=str(tmp_path)).passed


def test_torch_functions_get_tensors_and_unsupported_cases_are_skipped(tmp_path):
    def torch_sdpa(q, k, v, mask, causal, scale):
        assert isinstance(q, torch.Tensor)
        if abs(scale - q.shape[-1] ** -0.5) > 1e-12 * scale:
            raise attn.Unsupported("a scale other than 1/sqrt(Dk) (PyTorch 1.13 takes none)")
        out, _ = F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, False)
        return out

    result = attn.properties(torch_sdpa, framework="torch", masks=("bool",), property="rows_sum_to_one", seed=1,
                             cases_dir=str(tmp_path))
    assert result.passed, result.failures
    reasons = {reason for r in result.runs for reason in r.get("skipped", {})}
    assert any("PyTorch 1.13 takes none" in reason for reason in reasons), reasons


def test_a_function_returning_the_wrong_shape_fails_with_both_shapes(tmp_path):
    def wrong(q, k, v, mask, causal, scale):
        return np.zeros(q.shape[:-1] + (v.shape[-1] + 1,), dtype=q.dtype)

    result = attn.properties(wrong, property="matches_oracle_within_bound", seed=1, cases_dir=str(tmp_path))
    assert not result.passed
    assert "returned float" in result.failures[0]["message"] and "expected float" in result.failures[0]["message"]


def test_the_pytorch_verdicts_of_docs_external_md_hold(tmp_path):
    """A part of docs/external.md's table, rerun with its seed: verdicts that follow from PyTorch's structure (a NaN
    in a padded value row, the causal flag's alignment), and one within the oracle's bound."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    sys.path.insert(0, os.path.join(root, "python", "external"))
    import torch_verdicts

    committed = {}
    for line in open(os.path.join(root, "docs", "external.md")):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("torch_"):
            committed[(cells[0], cells[1])] = cells[2]
    chosen = ["matches_oracle_within_bound", "padding_values_do_not_matter"]
    table = torch_verdicts.verdicts(1, properties=chosen, cases_dir=str(tmp_path), kernels=["torch_sdpa_mask",
                                                                                              "torch_sdpa_is_causal_as_br"])
    for kernel, runs in table.items():
        for prop in chosen:
            assert torch_verdicts.status_of(runs[prop]) == committed[(kernel, prop)], (kernel, prop)
    assert committed[("torch_sdpa_mask", "padding_values_do_not_matter")] == "fails"
    assert committed[("torch_sdpa_is_causal_as_br", "matches_oracle_within_bound")] == "fails"
