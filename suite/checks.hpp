// suite/checks.hpp: what the invariants share: running an implementation on a case, the oracle's answer
// for it, comparisons within the oracle's bound or bitwise, and the case transforms properties build on.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>

#include "attn/detail/splitmix64.hpp"
#include "attn/mha.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/suite/case.hpp"
#include "attn/suite/property.hpp"
#include "attn/suite/registry.hpp"
#include "generators.hpp"

namespace attn::suite {

// Calls f.template operator()<T>() with T the case's dtype.
template <class F>
Verdict with_dtype(Dtype dtype, F&& f) {
    switch (dtype) {
        case Dtype::Float: return f.template operator()<float>();
        case Dtype::Float16: return f.template operator()<float16>();
        case Dtype::BFloat16: return f.template operator()<bfloat16>();
        case Dtype::Double: break;
    }
    return f.template operator()<double>();
}

// The implementation's output for the case, as (B, H, Tq, Dv) whatever the layout. Throws what it throws.
template <class T>
Tensor<T> run_impl(const Implementation& impl, const SdpaCase& c, const SdpaOptions& options) {
    const CaseInputs<T> in = make_inputs<T>(c);
    SdpaResult<T> r = impl.run<T>(in.q_view, in.k_view, in.v_view, in.allowed_view, in.with_bias(options));
    const Shape expected{c.B, c.H, c.Tq, c.Dv};
    if (r.output.numel() != numel(expected))
        throw ShapeError(impl.name + ": output has shape " + to_string(r.output.shape()) + ", expected " +
                         to_string(expected));
    return std::move(r.output).reshaped(expected);
}
template <class T>
Tensor<T> run_impl(const Implementation& impl, const SdpaCase& c) {
    return run_impl<T>(impl, c, c.options);
}

// The oracle's answer for the case under the implementation's error model, reshaped like run_impl's output.
template <class T>
oracle::Result<T> oracle_for(const Implementation& impl, const SdpaCase& c) {
    const CaseInputs<T> in = make_inputs<T>(c);
    oracle::OracleOptions oo;
    oo.model = impl.error_model;
    oo.statistical = true;  // within_bound gives the statistical verdict too (oracle/BOUNDS.md section 10)
    oracle::Result<T> r = oracle::scaled_dot_product_attention<T>(in.q_view, in.k_view, in.v_view, in.allowed_view,
                                                                  in.with_bias(c.options), oo);
    const Shape out{c.B, c.H, c.Tq, c.Dv};
    r.output = std::move(r.output).reshaped(out);
    r.output_bound = std::move(r.output_bound).reshaped(out);
    r.output_stat_bound = std::move(r.output_stat_bound).reshaped(out);
    r.output_scale = std::move(r.output_scale).reshaped(out);
    r.output_exact = std::move(r.output_exact).reshaped(out);
    if (r.output_exact_lo.numel() == numel(out)) r.output_exact_lo = std::move(r.output_exact_lo).reshaped(out);
    return r;
}

// "[b,h,i,d]" of a flat index into (B, H, Tq, Dv).
inline std::string index_string(const SdpaCase& c, Index flat, Index last) {
    const Index d = flat % last, i = (flat / last) % c.Tq, h = (flat / last / c.Tq) % c.H, b = flat / last / c.Tq / c.H;
    std::ostringstream s;  // (a stream: g++ 12 -O3 warns -Wrestrict, falsely, on "literal" + std::string here)
    s << "[" << b << "," << h << "," << i << "," << d << "]";
    return s.str();
}

inline std::string num(double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
}

// Same bits (NaN payloads aside: any NaN equals any NaN; +0 and -0 differ).
template <class T>
bool same_bits(T a, T b) {
    if (std::isnan(a) && std::isnan(b)) return true;
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Bitwise equality of two outputs of the same shape; the first difference otherwise.
template <class T>
Verdict bitwise_equal(const SdpaCase& c, const Tensor<T>& a, const Tensor<T>& b, const std::string& what) {
    if (a.shape() != b.shape())
        return what + ": shapes differ, " + to_string(a.shape()) + " vs " + to_string(b.shape());
    for (Index x = 0; x < a.numel(); ++x)
        if (!same_bits(a[x], b[x]))
            return what + ": output" + index_string(c, x, a.dim(-1)) + " is " + num(a[x]) + " vs " + num(b[x]);
    return std::nullopt;
}

// Output within the oracle's bound, element by element (the metrics module's comparison); and, when the oracle
// computed it, not suspicious to the statistical verdict either: a correct kernel is flagged with probability at
// most statistical_false_alarm per call, so a flag on a library kernel means the statistical model is wrong.
template <class T>
Verdict within_bound(const Tensor<T>& out, const oracle::Result<T>& o, const std::string& what) {
    const oracle::Comparison cmp = oracle::compare_output<T>(out.view(), o);
    if (!cmp.pass()) return what + ": " + cmp.summary();
    if (!o.statistical) return std::nullopt;
    const oracle::Comparison stat = oracle::compare_output_statistical<T>(out.view(), o);
    if (!stat.pass()) return what + ": within the rigorous bound but over the statistical one: " + stat.summary();
    const oracle::RowStatistic rows = oracle::row_statistic<T>(out.view(), o);
    if (rows.suspicious())
        return what + ": within the rigorous bound but the row statistic is " + num(rows.sum_squares) +
               " over its threshold " + num(rows.threshold) + " (" + std::to_string(rows.rows) + " rows)";
    return std::nullopt;
}

// A tensor of the given shape filled with standard normal draws from rng, rounded to T.
template <class T>
Tensor<T> normal_tensor(const Shape& shape, Rng& rng) {
    Tensor<T> t(shape);
    for (Index f = 0; f < t.numel(); ++f) t[f] = static_cast<T>(rng.normal());
    return t;
}

// What `call` threw: its kind ("ShapeError", "ConfigError", "ValueError" or "another exception") and message, both
// empty when it returned (Unsupported passes: the case is skipped).
struct Thrown {
    std::string kind, message;
};
template <class Call>
Thrown thrown(Call&& call) {
    try {
        call();
    } catch (const ShapeError& e) {
        return {"ShapeError", e.what()};
    } catch (const ConfigError& e) {
        return {"ConfigError", e.what()};
    } catch (const ValueError& e) {
        return {"ValueError", e.what()};
    } catch (const Unsupported&) {
        throw;  // the case is skipped, not judged
    } catch (const std::exception& e) {
        return {"another exception", e.what()};
    }
    return {};
}

// The message of the exception `call` throws, "" when it throws none.
template <class Call>
std::string thrown_message(Call&& call) {
    return thrown(call).message;
}

// A call the contract refuses: it must throw `expected_kind` ("ShapeError", "ConfigError" or "ValueError") with a
// message that starts with the function's name ("name: ...", the library's convention) and contains `keyword`;
// `what` names the refusal in the verdict.
template <class Call>
Verdict refused_with(Call&& call, const std::string& what, const std::string& expected_kind, const std::string& keyword) {
    const auto [got_kind, message] = thrown(call);
    if (got_kind.empty()) return what + ": the call was accepted";
    if (got_kind != expected_kind) return what + ": expected a " + expected_kind + ", got " + got_kind + ": " + message;
    if (message.find(keyword) == std::string::npos) return what + ": the message does not name '" + keyword + "': " + message;
    const std::size_t colon = message.find(": ");
    const auto name_char = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == ':'; };
    if (colon == std::string::npos || colon == 0 || !std::all_of(message.begin(), message.begin() + static_cast<std::ptrdiff_t>(colon), name_char))
        return what + ": the message does not start with the function's name: " + message;
    return std::nullopt;
}

// |a - b| <= bound_a + bound_b element-wise: both are within their bounds of the same exact value.
template <class T>
Verdict within_two_bounds(const SdpaCase& c, const Tensor<T>& a, const Tensor<double>& bound_a, const Tensor<T>& b,
                          const Tensor<double>& bound_b, const std::string& what) {
    for (Index x = 0; x < a.numel(); ++x) {
        const double ax = static_cast<double>(a[x]), bx = static_cast<double>(b[x]);
        if (std::isnan(ax) || std::isnan(bx) || std::isinf(ax) || std::isinf(bx) ||
            std::abs(ax - bx) > bound_a[x] + bound_b[x])
            return what + ": output" + index_string(c, x, a.dim(-1)) + " is " + num(ax) + " vs " + num(bx) +
                   ", more apart than the two bounds " + num(bound_a[x]) + " + " + num(bound_b[x]);
    }
    return std::nullopt;
}

// The case with v replaced by the identity (Dv = Tk, v[j] = e_j): the output row is then the weights row, so
// weight properties apply to any implementation, including ones that cannot return weights.
inline SdpaCase with_identity_values(const SdpaCase& c) {
    SdpaCase r = c;
    r.Dv = c.Tk;
    r.v = Tensor<double>({c.B, c.kv_heads, c.Tk, c.Tk}, 0.0);
    for (Index bh = 0; bh < c.B * c.kv_heads; ++bh)
        for (Index j = 0; j < c.Tk; ++j) r.v[(bh * c.Tk + j) * c.Tk + j] = 1.0;
    return r;
}

// The explicit allowed mask of a case expanded to (B, H, Tq, Tk), causal option folded in (for properties that
// permute or perturb it). Independent of the library's problem description (lib/src/problem.cpp) on purpose, like
// the fuzzers' model: it is what the library's broadcasting and readability are checked against, so a bug there
// must not reach both sides. It shares only the causal rule (attn::causal_allows) and TensorView::broadcast_to; the
// window is window_allows below.
Tensor<bool> expanded_allowed(const SdpaCase& c);

// The case's explicit bias (SdpaCase::bias) broadcast to (B, H, Tq, Tk); zeros without one. ALiBi's term is not in it.
Tensor<double> expanded_bias(const SdpaCase& c);

// The sliding window's semantics as the suite states them, written out and independent of attn::PositionRule:
// FlashAttention's i + Tk - Tq - left <= j <= i + Tk - Tq + right (bottom-right), JAX's i - left <= j <= i + right
// (top-left), a side of -1 unbounded.
bool window_allows(const SlidingWindow& w, Index i, Index j, Index Tq, Index Tk);

// The case with its positional options (is_causal, window) dropped, for properties that fold them into a mask.
void drop_positional_options(SdpaCase& c);

// The case with every blocked (query, key) pair (expanded_allowed: mask, causal rule, window) written as -inf into
// its explicit bias, expanded to (B, H, Tq, Tk) (0 elsewhere without one), and no mask or positional option left.
SdpaCase with_blocking_as_bias(const SdpaCase& c);

// MhaConfig::dropout_seed's contract, written out from its documentation (not the library's function): weight f
// (flat over (B, H, Tq, Tk)) is kept at `step` when the hashed draw is at least p.
inline bool documented_dropout_keep(const MhaDropout& dropout, std::uint64_t step, Index f) {
    using detail::splitmix64_mix;
    const std::uint64_t bits =
        splitmix64_mix(splitmix64_mix(splitmix64_mix(dropout.seed) ^ step) ^ static_cast<std::uint64_t>(f));
    return static_cast<double>(bits >> 11) * 0x1.0p-53 >= dropout.p;
}

// A copy of view `t` laid out as `layout` says (0 contiguous, 1 every stride doubled, 2 last two dims transposed),
// kept alive in `storage`; the new view reads the same values as `t`. Broadcast dims (stride 0, the grouped-query
// layout's) stay broadcast.
template <class T>
TensorView<const T> relaid(TensorView<const T> t, int layout, std::vector<T>& storage) {
    const Shape& shape = t.shape();
    const Index rank = static_cast<Index>(shape.size());
    Shape stored = shape;  // the dims that take memory
    for (Index d = 0; d < rank; ++d)
        if (t.stride(d) == 0) stored[static_cast<std::size_t>(d)] = 1;
    Shape strides = contiguous_strides(stored);
    if (layout == 1) {
        for (Index& s : strides) s *= 2;
    } else if (layout == 2 && rank >= 2) {
        // The last two dims column-major within each matrix: element (r, c) of an (R, C) matrix at c * R + r.
        strides[static_cast<std::size_t>(rank - 1)] = stored[static_cast<std::size_t>(rank - 2)];
        strides[static_cast<std::size_t>(rank - 2)] = 1;
    }
    for (Index d = 0; d < rank; ++d)
        if (t.stride(d) == 0) strides[static_cast<std::size_t>(d)] = 0;
    storage.assign(static_cast<std::size_t>(std::max<Index>(1, 2 * numel(stored))), T(0));
    TensorView<T> view(storage.data(), shape, strides);
    for_each_index(shape, [&](std::span<const Index> idx) { view.at(idx) = t.at(idx); });
    return view;
}

// The library's own paths among the implementations (its two backends, the tiled one with small blocks, and the
// module's head path), for properties of sizes and inputs the test kernels of kernels/ do not implement.
inline bool is_library_path(const Implementation& impl) {
    return impl.name == "reference" || impl.name == "tiled" || impl.name == "tiled_small_blocks" || impl.name == "mha";
}

// The case with every K/V head repeated for the H/G query heads that read it (kv_heads = H): the multi-head
// attention a grouped-query case equals.
inline SdpaCase with_repeated_kv_heads(const SdpaCase& c) {
    SdpaCase repeated = c;
    repeated.kv_heads = c.H;
    repeated.k = Tensor<double>({c.B, c.H, c.Tk, c.Dk});
    repeated.v = Tensor<double>({c.B, c.H, c.Tk, c.Dv});
    const Index group = c.H / c.kv_heads;
    for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h) {
            const Index g = h / group;  // query head h reads K/V head h / (H/G)
            std::copy_n(c.k.data() + (b * c.kv_heads + g) * c.Tk * c.Dk, c.Tk * c.Dk,
                        repeated.k.data() + (b * c.H + h) * c.Tk * c.Dk);
            std::copy_n(c.v.data() + (b * c.kv_heads + g) * c.Tk * c.Dv, c.Tk * c.Dv,
                        repeated.v.data() + (b * c.H + h) * c.Tk * c.Dv);
        }
    return repeated;
}

// The backward pass of the case by `impl` with `options` (the case's bias and slopes added): a dout of normal values
// drawn from the case's aux_seed in the output's shape and layout (or the `dout` given), then impl.backward
// (Unsupported where it has no backward in T).
template <class T>
struct BackwardRun {
    CaseInputs<T> in;
    SdpaOptions options;
    Tensor<T> dout;
    SdpaGradients<T> grads;
};
template <class T>
BackwardRun<T> run_backward(const Implementation& impl, const SdpaCase& c, const SdpaOptions& options,
                            const Tensor<T>* dout = nullptr) {
    BackwardRun<T> r{make_inputs<T>(c), {}, {}, {}};
    r.options = r.in.with_bias(options);
    if (dout) {
        r.dout = Tensor<T>::copy_of(dout->view());
    } else {
        Shape out_shape = r.in.q_view.shape();
        out_shape.back() = c.Dv;
        Rng rng(c.aux_seed);
        r.dout = normal_tensor<T>(out_shape, rng);
    }
    r.grads = impl.backward<T>(r.in.q_view, r.in.k_view, r.in.v_view, r.dout.view(), r.in.allowed_view, r.options);
    return r;
}
// The same, or nullopt where finite inputs overflowed and the call refused them by name (the contract: a ValueError
// saying "overflowed"); any other exception passes through.
template <class T>
std::optional<BackwardRun<T>> run_backward_unless_overflow(const Implementation& impl, const SdpaCase& c,
                                                           const SdpaOptions& options, const Tensor<T>* dout = nullptr) {
    try {
        return run_backward<T>(impl, c, options, dout);
    } catch (const ValueError& e) {
        if (std::string(e.what()).find("overflowed") == std::string::npos) throw;
        return std::nullopt;
    }
}

// Runs f, turning an attn::Error or any other exception into a verdict naming it.
template <class F>
Verdict guarded(const std::string& what, F&& f) {
    try {
        return f();
    } catch (const Unsupported&) {
        throw;  // the case is skipped, not judged
    } catch (const std::exception& e) {
        return what + " threw: " + e.what();
    }
}

}  // namespace attn::suite
