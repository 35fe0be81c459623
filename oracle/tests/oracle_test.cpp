// The oracle's self-checks: worked example, closed forms, precision agreement, contracts, metrics, and the
// reference backend against the bound over a short random and adversarial sweep.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/detail/problem.hpp"

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace oracle = attn::oracle;

namespace {

// exact = output_exact + output_exact_lo, in long double (enough for the closed forms below).
template <class T>
long double exact_output(const oracle::Result<T>& r, Index flat) {
    return r.output_exact[flat] + r.output_exact_lo[flat];
}

template <class T>
Tensor<T> random_tensor(Shape shape, std::mt19937_64& rng, double scale = 1.0) {
    Tensor<T> t(std::move(shape));
    std::normal_distribution<double> normal(0.0, scale);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(normal(rng));
    return t;
}

}  // namespace

TEMPLATE_TEST_CASE("the course module's worked example comes out right", "[oracle]", float, double) {
    using T = TestType;
    // q (B=1, Tq=3, Dk=4), k (1, Tk=3, 4), v (1, 3, Dv=2): seed/attention-from-scratch.txt, Part 2.
    const Tensor<T> q({1, 3, 4}, {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0});
    const Tensor<T> k({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0});
    const Tensor<T> v({1, 3, 2}, {10, 0, 0, 10, 5, 5});
    const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {});
    const double weights[9] = {0.3837, 0.2327, 0.3837, 0.2327, 0.3837, 0.3837, 0.2741, 0.2741, 0.4519};
    const double output[6] = {5.7548, 4.2452, 4.2452, 5.7548, 5.0, 5.0};
    for (Index i = 0; i < 9; ++i) CHECK(std::fabs(static_cast<double>(r.weights_exact[i]) - weights[i]) <= 0.5e-4);
    for (Index i = 0; i < 6; ++i) CHECK(std::fabs(static_cast<double>(r.output_exact[i]) - output[i]) <= 0.5e-4);
    // Closed forms behind the printed digits: row 0 has logits (1/2, 0, 1/2), so w = e^(1/2) / (2 e^(1/2) + 1).
    const long double e = std::exp(0.5L);
    CHECK(std::fabs(r.weights_exact[0] + r.weights_exact_lo[0] - e / (2 * e + 1)) <= 1e-18L);
    // Row 2 is symmetric in the first two keys and v's third row is their mean: the output is exactly (5, 5).
    CHECK(std::fabs(exact_output(r, 4) - 5) <= 1e-25L);
    CHECK(r.output({0, 2, 0}) == T(5));
    CHECK(r.oracle_error_ratio <= oracle::max_oracle_error_ratio);
}

TEMPLATE_TEST_CASE("closed forms: equal logits give the mean of v, a dominant logit its v row, Tk = 1 gives v",
                   "[oracle]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(1);
    SECTION("all logits equal -> mean of the v rows") {
        const Index Tk = 7, Dv = 5;
        const Tensor<T> q({3, 4}, T(0));  // q = 0: every logit is 0
        const Tensor<T> k = random_tensor<T>({Tk, 4}, rng);
        const Tensor<T> v = random_tensor<T>({Tk, Dv}, rng);
        const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {});
        for (Index i = 0; i < 3; ++i)
            for (Index c = 0; c < Dv; ++c) {
                long double mean = 0;
                for (Index j = 0; j < Tk; ++j) mean += static_cast<long double>(v({j, c}));
                mean /= Tk;
                CHECK(std::fabs(exact_output(r, i * Dv + c) - mean) <= 1e-17L * (1 + std::fabs(mean)));
            }
    }
    SECTION("one dominant logit -> that v row") {
        // logit of key 2 is 1e4 * scale above the others: the other weights are below e^-1000.
        Tensor<T> q({1, 2}, {T(100), T(0)});
        Tensor<T> k({4, 2}, {0, 1, 0, 1, 100, 0, 0, 1});
        const Tensor<T> v = random_tensor<T>({4, 3}, rng);
        const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {});
        for (Index c = 0; c < 3; ++c) {
            CHECK(exact_output(r, c) == static_cast<long double>(v({2, c})));
            CHECK(r.output({0, c}) == v({2, c}));
        }
        CHECK(r.weights({0, 2}) == T(1));
        CHECK(r.weights({0, 0}) == T(0));
    }
    SECTION("Tk = 1 -> v, exactly") {
        const Tensor<T> q = random_tensor<T>({2, 5, 3}, rng);
        const Tensor<T> k = random_tensor<T>({2, 1, 3}, rng);
        const Tensor<T> v = random_tensor<T>({2, 1, 4}, rng);
        const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {});
        for (Index b = 0; b < 2; ++b)
            for (Index i = 0; i < 5; ++i)
                for (Index c = 0; c < 4; ++c) {
                    CHECK(r.output({b, i, c}) == v({b, 0, c}));
                    CHECK(r.output_exact_lo[(b * 5 + i) * 4 + c] == 0);
                }
    }
}

TEMPLATE_TEST_CASE("two precisions agree far beyond what float64 needs", "[oracle]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(2);
    // Large logits and a wide range of v: the hard case for the working precision.
    const Tensor<T> q = random_tensor<T>({2, 6, 16}, rng, 8.0);
    const Tensor<T> k = random_tensor<T>({2, 9, 16}, rng, 8.0);
    Tensor<T> v = random_tensor<T>({2, 9, 5}, rng);
    for (Index i = 0; i < v.numel(); i += 3) v[i] *= T(1e20);
    oracle::OracleOptions fast, wide, widest;
    wide.bits = 261;
    widest.bits = 516;
    const auto r0 = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, fast);
    const auto r1 = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, wide);
    const auto r2 = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, widest);
    CHECK(r0.bits == 114);
    CHECK(r1.bits == 261);
    CHECK(r2.bits == 516);
    double worst_fast = 0, worst_wide = 0;
    for (Index e = 0; e < r0.output.numel(); ++e) {
        // Relative to the condition-aware scale; float64's unit roundoff is 1.1e-16.
        // (hi - hi') is exact for close values, so the difference is resolved to ~2^-128.
        const auto diff = [&](const oracle::Result<T>& a) {
            return std::fabs((a.output_exact[e] - r2.output_exact[e]) + (a.output_exact_lo[e] - r2.output_exact_lo[e]));
        };
        const long double s = r2.output_scale[e];
        worst_fast = std::max(worst_fast, static_cast<double>(diff(r0) / s));
        worst_wide = std::max(worst_wide, static_cast<double>(diff(r1) / s));
        CHECK(r0.output[e] == r2.output[e]);  // the same correctly rounded answer
    }
    std::cout << "precision agreement (" << (std::is_same_v<T, float> ? "float" : "double")
              << "): 114-bit fast path vs 516 bits " << worst_fast << ", 261 vs 516 bits " << worst_wide
              << " (relative to sum p|v|; stored to ~2^-128)\n";
    CHECK(worst_fast <= 1e-27);  // float64 needs 1e-16; the fast path's dot products carry ~2^-100
    CHECK(worst_wide <= 1e-60);
}

TEST_CASE("round_to<float> rounds correctly where a conversion through double would round twice", "[oracle]") {
    // 1 + 2^-24 is exactly halfway between the floats 1 and 1 + 2^-23: the rest decides.
    const double mid = 1.0 + 0x1p-24;
    CHECK(oracle::round_to<float>(mid, 0x1p-80) == 1.0f + 0x1p-23f);
    CHECK(oracle::round_to<float>(mid, -0x1p-80) == 1.0f);
    CHECK(oracle::round_to<float>(mid, 0) == 1.0f);  // a true tie goes to even
    CHECK(oracle::round_to<float>(-mid, -0x1p-80) == -(1.0f + 0x1p-23f));
    CHECK(oracle::round_to<double>(mid, 0x1p-80) == mid);
}

TEST_CASE("the oracle applies the library's contracts", "[oracle]") {
    std::mt19937_64 rng(3);
    const Tensor<double> q = random_tensor<double>({2, 3, 4}, rng);
    const Tensor<double> k = random_tensor<double>({2, 5, 4}, rng);
    Tensor<double> v = random_tensor<double>({2, 5, 2}, rng);

    SECTION("bad shapes throw ShapeError naming oracle.sdpa") {
        const Tensor<double> k_bad = random_tensor<double>({2, 5, 3}, rng);
        CHECK_THROWS_WITH(oracle::scaled_dot_product_attention<double>(q, k_bad, v, std::nullopt, {}),
                          Catch::Contains("oracle.sdpa") && Catch::Contains("Dk=4"));
    }
    SECTION("causal alignments match the library's rule, weights are zero where blocked") {
        for (auto alignment : {attn::CausalAlignment::TopLeft, attn::CausalAlignment::BottomRight}) {
            attn::SdpaOptions options;
            options.is_causal = true;
            options.alignment = alignment;
            options.empty_rows = attn::EmptyRowPolicy::Zero;
            const auto r = oracle::scaled_dot_product_attention<double>(q, k, v, std::nullopt, options);
            for (Index b = 0; b < 2; ++b)
                for (Index i = 0; i < 3; ++i)
                    for (Index j = 0; j < 5; ++j) {
                        const bool allowed = attn::causal_allows(i, j, 3, 5, alignment);
                        CHECK((r.weights({b, i, j}) > 0) == allowed);
                    }
        }
    }
    SECTION("empty rows: Throw names the row, Zero gives zeros, Nan gives NaN") {
        Tensor<bool> allowed({3, 5}, true);
        for (Index j = 0; j < 5; ++j) allowed({1, j}) = false;
        attn::SdpaOptions options;
        CHECK_THROWS_AS(oracle::scaled_dot_product_attention<double>(q, k, v, allowed.view(), options), attn::MaskError);
        options.empty_rows = attn::EmptyRowPolicy::Zero;
        const auto z = oracle::scaled_dot_product_attention<double>(q, k, v, allowed.view(), options);
        CHECK(z.output({0, 1, 0}) == 0);
        CHECK(z.output_bound[2] == 0);
        options.empty_rows = attn::EmptyRowPolicy::Nan;
        const auto n = oracle::scaled_dot_product_attention<double>(q, k, v, allowed.view(), options);
        CHECK(std::isnan(n.output({1, 1, 1})));
        CHECK(std::isnan(n.weights({0, 1, 4})));
        CHECK(!std::isnan(n.output({0, 0, 0})));
    }
    SECTION("values nobody may read never matter, not even NaN") {
        Tensor<bool> allowed({1, 5}, true);
        allowed({0, 4}) = false;  // key 4 is padding for every query
        const auto clean = oracle::scaled_dot_product_attention<double>(q, k, v, allowed.view(), {});
        v({0, 4, 0}) = std::numeric_limits<double>::quiet_NaN();
        v({1, 4, 1}) = std::numeric_limits<double>::infinity();
        const auto dirty = oracle::scaled_dot_product_attention<double>(q, k, v, allowed.view(), {});
        for (Index e = 0; e < clean.output.numel(); ++e) CHECK(clean.output[e] == dirty.output[e]);
    }
    SECTION("a broadcast mask equals the expanded one") {
        Tensor<bool> row({5}, true);
        row({2}) = false;
        Tensor<bool> expanded({2, 3, 5}, true);
        for (Index b = 0; b < 2; ++b)
            for (Index i = 0; i < 3; ++i) expanded({b, i, 2}) = false;
        const auto a = oracle::scaled_dot_product_attention<double>(q, k, v, row.view(), {});
        const auto e = oracle::scaled_dot_product_attention<double>(q, k, v, expanded.view(), {});
        for (Index x = 0; x < a.output.numel(); ++x) CHECK(a.output_exact[x] == e.output_exact[x]);
    }
    SECTION("with check_finite off, a NaN a query reads comes out NaN") {
        Tensor<double> q2 = Tensor<double>::copy_of(q.view());
        q2({1, 2, 0}) = std::numeric_limits<double>::quiet_NaN();
        attn::SdpaOptions options;
        CHECK_THROWS_AS(oracle::scaled_dot_product_attention<double>(q2, k, v, std::nullopt, options), attn::ValueError);
        options.check_finite = false;
        const auto r = oracle::scaled_dot_product_attention<double>(q2, k, v, std::nullopt, options);
        CHECK(std::isnan(r.output({1, 2, 0})));
        CHECK(!std::isnan(r.output({1, 1, 0})));
    }
}

// The scale's rounding in the dtype must be relative (BOUNDS.md section 2). Two counterexamples where it is not: a
// kernel folding float(1e-50) = 0 into q computes o = 0.5 where the exact o is 0.731 (logits 1.00000005 and 0), and
// 1.4 * 2^-149 rounds to 2^-149. Both are refused, by the library and by the oracle, with an error naming the scale.
TEST_CASE("a scale below the dtype's normal range is refused, not checked against a bound that cannot hold", "[oracle]") {
    const Tensor<float> q({1, 1}, {1e25f}), k({2, 1}, {1e25f, 0.0f}), v({2, 1}, {1.0f, 0.0f});
    for (const double scale : {1e-50, 1.4 * 0x1p-149}) {
        attn::SdpaOptions options;
        options.scale = scale;
        CHECK_THROWS_WITH(oracle::scaled_dot_product_attention<float>(q, k, v, std::nullopt, options),
                          Catch::StartsWith("oracle.sdpa: scale ") && Catch::Contains("below the normal range"));
        CHECK_THROWS_WITH(attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options),
                          Catch::StartsWith("sdpa: scale ") && Catch::Contains("below the normal range"));
    }
    // In double, 1e-50 is normal: the same problem is accepted, and its exact output is sigmoid(scale q k) (about 1).
    attn::SdpaOptions options;
    options.scale = 1e-50;
    const Tensor<double> qd({1, 1}, {1e25}), kd({2, 1}, {1e25, 0.0}), vd({2, 1}, {1.0, 0.0});
    const auto r = oracle::scaled_dot_product_attention<double>(qd, kd, vd, std::nullopt, options);
    CHECK(r.output[0] == Approx(1 / (1 + std::exp(-(1e-50 * 1e25) * 1e25))).epsilon(1e-12));
    // 0 stays a valid scale (every logit 0: the mean of the values), and so does the smallest normal float.
    options.scale = 0.0;
    CHECK(oracle::scaled_dot_product_attention<float>(q, k, v, std::nullopt, options).output[0] == 0.5f);
    options.scale = static_cast<double>(std::numeric_limits<float>::min());
    const Tensor<float> q1({1, 1}, {1.0f}), k1({2, 1}, {1.0f, 0.0f});
    CHECK_NOTHROW(attn::scaled_dot_product_attention(q1.view(), k1.view(), v.view(), std::nullopt, options));
    CHECK_NOTHROW(oracle::scaled_dot_product_attention<float>(q1, k1, v, std::nullopt, options));
}

// Denormals-are-zero: a kernel that reads subnormal inputs as 0 (a GPU with flush-to-zero) returns 0 here, where
// the exact output is half a subnormal value. The generic model (flush-to-zero, inputs flushed) accepts it; the
// reference model (IEEE gradual underflow, inputs read as given) rejects it, as it must for a CPU kernel; in double
// too, where the oracle stores such values beyond double-double (BOUNDS.md sections 4 and 7).
TEMPLATE_TEST_CASE("a kernel that flushes subnormal inputs passes generic and fails the gradual-underflow models",
                   "[oracle]", float, double) {
    using T = TestType;
    const T sub = std::numeric_limits<T>::min() / 8;  // subnormal in T
    REQUIRE(std::fpclassify(sub) == FP_SUBNORMAL);
    const Tensor<T> q({1, 1}, {T(1)}), k({2, 1}, {T(1), T(1)}), v({2, 1}, {sub, T(0)});
    const Tensor<T> flushed_output({1, 1}, {T(0)});  // v read as [0, 0]
    oracle::OracleOptions generic, reference;
    generic.model = oracle::generic_model();
    reference.model = oracle::reference_model();
    const auto g = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, generic);
    const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, reference);
    CHECK(oracle::check_candidate<T>(flushed_output.view(), g).pass());
    CHECK_FALSE(oracle::check_candidate<T>(flushed_output.view(), r).pass());
    // Read as given, the same kernel's output (sub / 2, exact) passes the reference model too.
    const Tensor<T> ieee_output({1, 1}, {sub / 2});
    CHECK(oracle::check_candidate<T>(ieee_output.view(), r).pass());
    CHECK(r.output[0] == sub / 2);
}

// The all-MPFR path rounds into the subnormal range once, and stores the exact value beyond double-double: the mean
// of 2^-1074 and 2^-1073 is 1.5 * 2^-1074, a tie that rounds to even (2^-1073); a double-double would hold it as
// hi = 2^-1073 and a lo that underflows to 0.
TEST_CASE("double outputs in the subnormal range: rounded once to nearest even, exact to beyond double", "[oracle]") {
    const double tiny = std::numeric_limits<double>::denorm_min();
    const Tensor<double> q({1, 1}, {1.0}), k({2, 1}, {1.0, 1.0}), v({2, 1}, {tiny, 2 * tiny});
    oracle::OracleOptions reference;
    reference.model = oracle::reference_model();
    const auto r = oracle::scaled_dot_product_attention<double>(q, k, v, std::nullopt, {}, reference);
    CHECK(r.output[0] == 2 * tiny);
    CHECK(exact_output(r, 0) == 1.5L * static_cast<long double>(tiny));
    CHECK(r.weights[0] == 0.5);
    // The bound is a handful of gradual-underflow units (2^-1075 each), not the flush-to-zero unit 2^-1022.
    CHECK(r.output_bound[0] < 64 * tiny);
    CHECK(r.output_bound[0] > 0);
}

// Section 7: the bound's terms that scale with the values or the logits are formed in Wide arithmetic, so neither
// sum_j |v_j| for |v_j| near DBL_MAX nor |q.k| = 1e400 (q = k = 1e200, scale 1e-300) makes a finite bound infinite.
TEST_CASE("double inputs near the ends of the range get finite bounds", "[oracle]") {
    SECTION("values near DBL_MAX / 2") {
        const double big = std::numeric_limits<double>::max() / 2;
        std::mt19937_64 rng(3);
        const Tensor<double> q = random_tensor<double>({2, 4}, rng), k = random_tensor<double>({5, 4}, rng);
        Tensor<double> v({5, 2});
        for (Index e = 0; e < v.numel(); ++e) v[e] = (e % 3 == 0 ? -big : big) * (0.5 + 0.1 * static_cast<double>(e % 4));
        oracle::OracleOptions reference;
        reference.model = oracle::reference_model();
        const auto r = oracle::scaled_dot_product_attention<double>(q, k, v, std::nullopt, {}, reference);
        for (Index e = 0; e < r.output.numel(); ++e) {
            CAPTURE(e);
            CHECK(std::isfinite(r.output_bound[e]));
            CHECK(r.output_bound[e] < 1e-13 * big);  // relative to the values, as for moderate ones
        }
        // The reference backend normalises before the weighted sum, so it does not overflow here; it is within.
        attn::SdpaOptions ref_backend;
        ref_backend.backend = attn::Backend::Reference;
        const auto out = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, ref_backend);
        CHECK(oracle::check_candidate<double>(out.output.view(), r).pass());
    }
    SECTION("q = k = 1e200 with scale 1e-300: logits of 1e100") {
        attn::SdpaOptions options;
        options.scale = 1e-300;
        // Logits 1e100 and 0: the second key's weight is exp(-1e100), and the reference model's bound is finite;
        // under generic, FlashAttention-2's rounded-max shift errs by u |m| = 1e84 in the exponent, so there it is not.
        const Tensor<double> q({1, 1}, {1e200}), k({2, 1}, {1e200, 0.0}), v({2, 2}, {3.0, -1.0, 5.0, 7.0});
        oracle::OracleOptions reference;
        reference.model = oracle::reference_model();
        const auto r = oracle::scaled_dot_product_attention<double>(q, k, v, std::nullopt, options, reference);
        CHECK(std::isinf(oracle::scaled_dot_product_attention<double>(q, k, v, std::nullopt, options).output_bound[0]));
        CHECK(r.output[0] == 3.0);
        CHECK(r.output[1] == -1.0);
        for (Index e = 0; e < r.output.numel(); ++e) CHECK(std::isfinite(r.output_bound[e]));
        CHECK(r.weights[0] == 1.0);
        CHECK(r.weights[1] == 0.0);
        CHECK(std::isfinite(r.weights_bound[0]));
    }
}

TEST_CASE("ulp_distance: +0 == -0, NaN only matches NaN, Inf mismatches are infinite, sign flips are measured", "[oracle][metrics]") {
    constexpr double inf = std::numeric_limits<double>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(oracle::ulp_distance<float>(-0.0f, 0.0L) == 0);
    CHECK(oracle::ulp_distance<float>(nan, static_cast<long double>(nan)) == 0);
    CHECK(oracle::ulp_distance<float>(nan, 1.0L) == inf);
    CHECK(oracle::ulp_distance<float>(1.0f, static_cast<long double>(nan)) == inf);
    CHECK(oracle::ulp_distance<float>(std::numeric_limits<float>::infinity(), 1e30L) == inf);
    // A sign flip is its distance: about 2^24 ulps for a normal float, 2 ulps for the smallest subnormals.
    CHECK(oracle::ulp_distance<float>(-0x1p-100f, 0x1p-100L) == Approx(0x1p24));
    CHECK(oracle::ulp_distance<float>(-0x1p-149f, 0x1p-149L) == Approx(2.0));
    CHECK(oracle::ulp_distance<float>(1.0f + 0x1p-23f, 1.0L) == Approx(1.0));
    CHECK(oracle::ulp_distance<double>(1.0, 1.0L + 0x1p-53L) == Approx(0.5));
    // Below the normal range the spacing is the subnormal one, not ulp(0) = 0.
    CHECK(oracle::ulp_distance<float>(0x1p-149f, 0.0L) == Approx(1.0));
}

TEMPLATE_TEST_CASE("compare_output passes the library's output and names an element moved just past its bound",
                   "[oracle][metrics]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(4);
    const Tensor<T> q = random_tensor<T>({2, 4, 8}, rng);
    const Tensor<T> k = random_tensor<T>({2, 6, 8}, rng);
    const Tensor<T> v = random_tensor<T>({2, 6, 3}, rng);
    attn::SdpaOptions options;
    options.backend = attn::Backend::Reference;
    options.return_weights = true;
    const auto computed = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    oracle::OracleOptions oo;
    oo.model = oracle::reference_model();
    const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, options, oo);
    const auto ok = oracle::compare_output<T>(computed.output.view(), r);
    INFO(ok.summary());
    CHECK(ok.pass());
    CHECK(ok.worst_flat >= 0);
    CHECK(ok.max_tightness > 0);  // a real comparison, not an all-exact accident
    CHECK(oracle::compare_weights<T>(computed.weights->view(), r).pass());

    // Move element (1, 2, 1) to the first T beyond exact + bound.
    Tensor<T> moved = Tensor<T>::copy_of(computed.output.view());
    const Index flat = (1 * 4 + 2) * 3 + 1;
    const long double target = r.output_exact[flat] + r.output_exact_lo[flat] + r.output_bound[flat];
    T x = static_cast<T>(target);
    while (static_cast<long double>(x) <= target) x = std::nextafter(x, std::numeric_limits<T>::infinity());
    moved[flat] = x;
    const auto bad = oracle::compare_output<T>(moved.view(), r);
    INFO(bad.summary());
    CHECK(!bad.pass());
    CHECK(bad.violations == 1);
    CHECK(bad.worst_index == Shape{1, 2, 1});
    CHECK(bad.max_tightness > 1);
    // Just past: by less than one step of T beyond the bound.
    const double step = static_cast<double>(x - std::nextafter(x, T(0)));
    CHECK(bad.max_tightness <= 1 + step / r.output_bound[flat]);

    // A NaN where none is expected fails whatever the bound.
    moved[flat] = std::numeric_limits<T>::quiet_NaN();
    CHECK(oracle::compare_output<T>(moved.view(), r).nonfinite_mismatches == 1);
}

TEMPLATE_TEST_CASE("check_candidate (attn check's verdict) fails when either the output or the weights are wrong",
                   "[oracle][metrics]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(5);
    const Tensor<T> q = random_tensor<T>({2, 3, 4}, rng);  // (B, Tq, Dk)
    const Tensor<T> k = random_tensor<T>({2, 5, 4}, rng);  // (B, Tk, Dk)
    const Tensor<T> v = random_tensor<T>({2, 5, 2}, rng);  // (B, Tk, Dv)
    attn::SdpaOptions options;
    options.return_weights = true;
    const auto computed = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, options);  // generic model

    const oracle::CheckVerdict ok = oracle::check_candidate<T>(computed.output.view(), r, computed.weights->view());
    INFO(ok.output.summary());
    CHECK(ok.pass());
    REQUIRE(ok.weights);
    CHECK(ok.weights->pass());
    CHECK(!oracle::check_candidate<T>(computed.output.view(), r).weights);  // weights not given: not checked

    // One weight off by 0.5 (weights are in [0, 1]): the output still passes, the verdict does not.
    Tensor<T> bad_weights = Tensor<T>::copy_of(computed.weights->view());
    bad_weights[7] += T(0.5);
    const oracle::CheckVerdict w = oracle::check_candidate<T>(computed.output.view(), r, bad_weights.view());
    CHECK(w.output.pass());
    REQUIRE(w.weights);
    CHECK(w.weights->violations == 1);
    CHECK(!w.pass());

    // One output element off by 1: fails with or without weights.
    Tensor<T> bad_output = Tensor<T>::copy_of(computed.output.view());
    bad_output[3] += T(1);
    CHECK(!oracle::check_candidate<T>(bad_output.view(), r).pass());
    CHECK(!oracle::check_candidate<T>(bad_output.view(), r, computed.weights->view()).pass());

    // A candidate of the wrong shape is an error, not a verdict.
    const Tensor<T> wrong_shape = random_tensor<T>({2, 3, 3}, rng);
    CHECK_THROWS_AS(oracle::check_candidate<T>(wrong_shape.view(), r), attn::ShapeError);
}

TEST_CASE("error models: the documented values, rescalings per row, and a looser bound for a weaker model",
          "[oracle]") {
    const oracle::ErrorModel ref = oracle::reference_model(), gen = oracle::generic_model(),
                             tiled = oracle::tiled_model(64);
    CHECK(ref.exp_ulps == 1.0);
    CHECK(oracle::effective_rescalings(ref, 1000) == 0);
    CHECK(oracle::effective_rescalings(gen, 1000) == 1000);
    CHECK(oracle::effective_rescalings(tiled, 1000) == 16);  // ceil(1000 / 64) key blocks
    CHECK(oracle::model_by_name("tiled", 32).key_block == 32);
    CHECK_THROWS_AS(oracle::model_by_name("fastest"), attn::ConfigError);
    CHECK_THROWS_AS(oracle::tiled_model(0), attn::ConfigError);

    std::mt19937_64 rng(5);
    const Tensor<float> q = random_tensor<float>({3, 16}, rng), k = random_tensor<float>({40, 16}, rng),
                        v = random_tensor<float>({40, 4}, rng);
    oracle::OracleOptions r_opts, t_opts, g_opts;
    r_opts.model = ref;
    t_opts.model = tiled;
    g_opts.model = gen;
    const auto r = oracle::scaled_dot_product_attention<float>(q, k, v, std::nullopt, {}, r_opts);
    const auto t = oracle::scaled_dot_product_attention<float>(q, k, v, std::nullopt, {}, t_opts);
    const auto g = oracle::scaled_dot_product_attention<float>(q, k, v, std::nullopt, {}, g_opts);
    for (Index e = 0; e < r.output.numel(); ++e) {
        CHECK(r.output[e] == g.output[e]);  // the model changes the bound, never the answer
        CHECK(r.output_bound[e] <= t.output_bound[e]);
        CHECK(t.output_bound[e] <= g.output_bound[e]);
    }
}

TEST_CASE("blocked partial sums: the same bound within one key block, a tighter one past it, and only for tiled",
          "[oracle]") {
    oracle::ErrorModel blocked = oracle::tiled_model(16), plain = blocked;
    blocked.block_partial_sums = true;
    CHECK(oracle::library_tiled_model().block_partial_sums);  // attn::tiled_kernel_info says the backend does it
    CHECK_FALSE(oracle::tiled_model(16).block_partial_sums);   // an MMA into the accumulator does not
    oracle::ErrorModel unblocked_generic = oracle::generic_model();
    unblocked_generic.block_partial_sums = true;  // without a key block there are no blocks: no effect

    std::mt19937_64 rng(11);
    for (const Index Tk : {Index(16), Index(1024)}) {
        const Tensor<float> q = random_tensor<float>({2, 8}, rng), k = random_tensor<float>({Tk, 8}, rng),
                            v = random_tensor<float>({Tk, 3}, rng);
        const auto bound_of = [&](const oracle::ErrorModel& m) {
            oracle::OracleOptions o;
            o.model = m;
            return oracle::scaled_dot_product_attention<float>(q, k, v, std::nullopt, {}, o);
        };
        const auto b = bound_of(blocked), p = bound_of(plain), g = bound_of(oracle::generic_model()),
                   gb = bound_of(unblocked_generic);
        for (Index e = 0; e < b.output.numel(); ++e) {
            CAPTURE(Tk, e);
            if (Tk <= 16)
                CHECK(b.output_bound[e] == p.output_bound[e]);  // one block: N_add = n - 1 either way
            else
                // 1024 keys in blocks of 16: N_add = 16 + 64 - 2 = 78 instead of 1023 (BOUNDS.md section 3)
                CHECK(b.output_bound[e] < 0.5 * p.output_bound[e]);
            CHECK(gb.output_bound[e] == g.output_bound[e]);
        }
    }
}

// The default path (double-double softmax, Ziv's strategy) against the all-MPFR path: bitwise the same rounded
// outputs and weights, on random cases with near-ties, exact ties and large logits. `attn oracle-sweep --cases N`
// runs the same comparison at scale (BOUNDS.md section 5).
TEMPLATE_TEST_CASE("the double-double path rounds exactly as the all-MPFR path", "[oracle]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(20261201);
    std::uniform_int_distribution<int> size(1, 9), kind(0, 3);
    std::normal_distribution<double> normal(0.0, 1.0);
    Index redone = 0;
    for (int t = 0; t < 300; ++t) {
        const int k_ = kind(rng);
        const Index Tq = size(rng), Tk = k_ == 3 ? 2 : size(rng), Dk = size(rng), Dv = size(rng);
        const double logit_scale = k_ == 1 ? 40.0 : 1.0;  // large logits: weights spread over many binades
        Tensor<T> q({Tq, Dk}), k({Tk, Dk}), v({Tk, Dv});
        for (Index e = 0; e < q.numel(); ++e) q[e] = static_cast<T>(normal(rng) * logit_scale);
        for (Index e = 0; e < k.numel(); ++e) k[e] = static_cast<T>(normal(rng));
        for (Index e = 0; e < v.numel(); ++e) v[e] = static_cast<T>(normal(rng));
        if (k_ == 2)  // exact ties: every key the same, so the weights are 1/Tk and the outputs means of v
            for (Index e = 0; e < k.numel(); ++e) k[e] = k[e % Dk];
        if (k_ == 3) {  // outputs at midpoints: two equal keys whose values are neighbours in T
            for (Index e = 0; e < k.numel(); ++e) k[e] = k[e % Dk];
            for (Index c = 0; c < Dv; ++c)
                v[Dv + c] = std::nextafter(v[c], std::numeric_limits<T>::infinity());
        }
        oracle::OracleOptions mpfr;
        mpfr.bits = 114;
        const auto fast = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, {});
        const auto slow = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, {}, mpfr);
        redone += fast.rows_redone_in_mpfr;
        for (Index e = 0; e < fast.output.numel(); ++e) {
            CAPTURE(t, e, k_);
            REQUIRE(std::memcmp(&fast.output[e], &slow.output[e], sizeof(T)) == 0);
        }
        for (Index e = 0; e < fast.weights.numel(); ++e) {
            CAPTURE(t, e, k_);
            REQUIRE(fast.weights[e] == slow.weights[e]);
        }
    }
    CHECK(redone > 0);  // the midpoint cases cannot be decided from the enclosure
}

TEMPLATE_TEST_CASE("soft-capping: two keys give the closed form, and the double-double path rounds as MPFR does",
                   "[oracle][softcap]", float, double) {
    using T = TestType;
    // q = [a], k = [[1], [0]], v = [[1], [0]], scale 1: the output is the first weight, 1 / (1 + e^(-c tanh(a / c))).
    for (const double a : {0.3, 5.0, 80.0, -40.0, 3e4})
        for (const double c : {0.5, 3.0, 100.0}) {
            Tensor<T> q({1, 1}), k({2, 1}), v({2, 1});
            q[0] = static_cast<T>(a);
            k[0] = 1, k[1] = 0, v[0] = 1, v[1] = 0;
            attn::SdpaOptions o;
            o.scale = 1.0;
            o.softcap = c;
            for (const int bits : {0, 114}) {
                oracle::OracleOptions oo;
                oo.bits = bits;
                const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, o, oo);
                const long double t = c * std::tanh(static_cast<long double>(static_cast<T>(a)) / c);
                const long double expected = 1 / (1 + std::exp(-t));
                CAPTURE(a, c, bits);
                CHECK(std::fabs(exact_output(r, 0) - expected) <= 1e-17L * expected);
                CHECK(r.output[0] == static_cast<T>(expected));
            }
        }
    // Random capped rows, large logits included: both paths give the same bits.
    std::mt19937_64 rng(20261203);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int t = 0; t < 60; ++t) {
        const Index Tq = 3, Tk = 1 + t % 9, Dk = 1 + t % 5, Dv = 2;
        const double logit_scale = t % 3 == 0 ? 30.0 : 1.0;
        Tensor<T> q({Tq, Dk}), k({Tk, Dk}), v({Tk, Dv});
        for (Index e = 0; e < q.numel(); ++e) q[e] = static_cast<T>(normal(rng) * logit_scale);
        for (Index e = 0; e < k.numel(); ++e) k[e] = static_cast<T>(normal(rng));
        for (Index e = 0; e < v.numel(); ++e) v[e] = static_cast<T>(normal(rng));
        attn::SdpaOptions o;
        o.softcap = std::vector<double>{0.25, 2.0, 50.0}[static_cast<std::size_t>(t % 3)];
        oracle::OracleOptions mpfr;
        mpfr.bits = 114;
        const auto fast = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, o, {});
        const auto slow = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, o, mpfr);
        for (Index e = 0; e < fast.output.numel(); ++e) {
            CAPTURE(t, e);
            REQUIRE(std::memcmp(&fast.output[e], &slow.output[e], sizeof(T)) == 0);
            CHECK(fast.output_bound[e] > 0);
        }
    }
}
