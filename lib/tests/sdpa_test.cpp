// SDPA: the course module's worked example, masks, empty-row policies, cross-attention, views and broadcasting,
// determinism, a long double triple loop with a derived error bound, and every error path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "error_message.hpp"

using namespace attn;
using Catch::Contains;

namespace {

// The test RNG: std::mt19937_64 with a fixed seed per test case, so every run sees the same inputs.
template <class T>
Tensor<T> random_tensor(const Shape& shape, std::mt19937_64& rng, double lo = -2.0, double hi = 2.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Tensor<T> t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(dist(rng));
    return t;
}

Tensor<bool> random_mask(const Shape& shape, std::mt19937_64& rng, double p_allowed) {
    std::bernoulli_distribution dist(p_allowed);
    Tensor<bool> t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = dist(rng);
    return t;
}

template <class T>
bool bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
    return a.shape() == b.shape() &&
           (a.numel() == 0 || std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0);
}

SdpaOptions with_weights(SdpaOptions options = {}) {
    options.return_weights = true;
    return options;
}

// ---------------------------------------------------------------------------------------------------------------
// A plain triple loop in long double, and the error bound a float/double implementation of the reference backend
// must meet against it.
//
// Error analysis (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., ch. 3; gamma_n = n u / (1 - n u),
// u the unit roundoff of T). Per query row with allowed keys A, exact logits s_j = scale * q . k_j, exact weights
// p_j = softmax(s)_j over A, exact output o_d = sum_j p_j v_jd:
//  (1) logits: the reference forms fl(fl(scale) * (q . k_j)) with one BLIS gemm; any summation order, with or
//      without FMA, gives |s^_j - s_j| <= gamma_{Dk+2} |scale| sum_d |q_d k_jd| =: delta_j (Dk products and sums,
//      the rounding of scale to T, the product by alpha). Let Delta = max_{j in A} delta_j.
//  (2) softmax of perturbed logits: p(s^)_j / p(s)_j = exp(s^_j - s_j) / sum_k p_k exp(s^_k - s_k) lies in
//      [exp(-2 Delta), exp(2 Delta)], so the relative weight error from (1) is eta_a = exp(2 Delta) - 1.
//  (3) the shifted exp: x_j = fl(s^_j - m) = (s^_j - m)(1 + e1) and fl(exp(x_j)) = exp(x_j)(1 + e2) with
//      |e1| <= u, |e2| <= 2u (glibc's exp and expf are within 1 ulp: "Known Maximum Errors in Math Functions" in the
//      glibc manual). exp((s^_j - m) e1) is within exp(R u) of 1 with R = max_j (m - s^_j) <= max_j (m - s_j) +
//      2 Delta. So every e^_j = e_j (1 + k_j), |k_j| <= kappa = exp(R u)(1 + 2u) - 1.
//  (4) the sum of |A| <= Tk positive terms: relative error gamma_Tk; the division: u. Together with (3):
//      eta_b = (1 + kappa)(1 + u) / ((1 - kappa)(1 - gamma_Tk)) - 1 bounds |p'_j - p(s^)_j| / p(s^)_j.
//  Weights: |p'_j - p_j| <= eta p_j with eta = (1 + eta_a)(1 + eta_b) - 1.
//  (5) output: a gemm of Tk terms (blocked keys hold exactly 0): |o^_d - sum_j p'_j v_jd| <= gamma_Tk sum_j
//      p'_j |v_jd|, and sum_j p'_j |v_jd| <= (1 + eta) sum_j p_j |v_jd|. So
//      |o^_d - o_d| <= (eta + gamma_Tk (1 + eta)) sum_j p_j |v_jd|.
// The long double loop itself obeys the same bound with u = 2^-64 (x87 extended); the test allows the sum of both
// bounds (triangle inequality), evaluated with the loop's p_j and |q_d k_jd| (exact to first order in 2^-64).
// Valid while nothing underflows: the random inputs keep |logits| <= 4 sqrt(Dk) <= 16, far from it.
// ---------------------------------------------------------------------------------------------------------------
struct ErrorBudget {
    long double u;
    long double gamma(long double n) const { return n * u / (1 - n * u); }
    // Relative weight error eta for a row, given Delta and R of steps (1)-(3).
    long double weight_eta(long double Delta, long double R, Index Tk) const {
        const long double eta_a = std::exp(2 * Delta) - 1;
        const long double kappa = std::exp(R * u) * (1 + 2 * u) - 1;
        const long double eta_b = (1 + kappa) * (1 + u) / ((1 - kappa) * (1 - gamma(static_cast<long double>(Tk)))) - 1;
        return (1 + eta_a) * (1 + eta_b) - 1;
    }
};

template <class T>
constexpr long double unit_roundoff = std::numeric_limits<T>::epsilon() / 2;

struct Expected {
    std::vector<long double> output, output_bound;    // (B, Tq, Dv)
    std::vector<long double> weights, weights_bound;  // (B, Tq, Tk)
    std::vector<char> empty_row;                      // (B, Tq)
};

// q (B, Tq, Dk), k (B, Tk, Dk), v (B, Tk, Dv), allowed (B, Tq, Tk), all contiguous. scale as SdpaProblem has it.
template <class T>
Expected triple_loop(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<bool>& allowed,
                     double scale) {
    const Index B = q.dim(0), Tq = q.dim(1), Dk = q.dim(2), Tk = k.dim(1), Dv = v.dim(2);
    const ErrorBudget lib{unit_roundoff<T>}, ref{unit_roundoff<long double>};
    Expected e;
    e.output.assign(static_cast<std::size_t>(B * Tq * Dv), 0);
    e.output_bound = e.output;
    e.weights.assign(static_cast<std::size_t>(B * Tq * Tk), 0);
    e.weights_bound = e.weights;
    e.empty_row.assign(static_cast<std::size_t>(B * Tq), 0);
    const long double s_ld = scale;
    for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Tq; ++i) {
            std::vector<long double> s(static_cast<std::size_t>(Tk)), abs_dot(static_cast<std::size_t>(Tk));
            long double m = -std::numeric_limits<long double>::infinity();
            for (Index j = 0; j < Tk; ++j) {
                if (!allowed[(b * Tq + i) * Tk + j]) continue;
                long double dot = 0, adot = 0;
                for (Index d = 0; d < Dk; ++d) {
                    const long double x = q[(b * Tq + i) * Dk + d], y = k[(b * Tk + j) * Dk + d];
                    dot += x * y;
                    adot += std::fabs(x * y);
                }
                s[j] = s_ld * dot;
                abs_dot[j] = std::fabs(s_ld) * adot;
                m = std::max(m, s[j]);
            }
            if (m == -std::numeric_limits<long double>::infinity()) {
                e.empty_row[b * Tq + i] = 1;
                continue;
            }
            long double sum = 0, Delta_lib = 0, Delta_ref = 0, R = 0;
            for (Index j = 0; j < Tk; ++j) {
                if (!allowed[(b * Tq + i) * Tk + j]) continue;
                sum += std::exp(s[j] - m);
                Delta_lib = std::max(Delta_lib, lib.gamma(Dk + 2) * abs_dot[j]);
                Delta_ref = std::max(Delta_ref, ref.gamma(Dk + 2) * abs_dot[j]);
                R = std::max(R, m - s[j]);
            }
            const long double eta_lib = lib.weight_eta(Delta_lib, R + 2 * Delta_lib, Tk);
            const long double eta_ref = ref.weight_eta(Delta_ref, R + 2 * Delta_ref, Tk);
            for (Index j = 0; j < Tk; ++j) {
                if (!allowed[(b * Tq + i) * Tk + j]) continue;
                const long double p = std::exp(s[j] - m) / sum;
                e.weights[(b * Tq + i) * Tk + j] = p;
                e.weights_bound[(b * Tq + i) * Tk + j] = (eta_lib + eta_ref) * p;
                for (Index d = 0; d < Dv; ++d) {
                    const long double x = v[(b * Tk + j) * Dv + d];
                    e.output[(b * Tq + i) * Dv + d] += p * x;
                    e.output_bound[(b * Tq + i) * Dv + d] += p * std::fabs(x);  // sum_j p_j |v_jd|, scaled below
                }
            }
            const long double factor = eta_lib + lib.gamma(Tk) * (1 + eta_lib) + eta_ref + ref.gamma(Tk) * (1 + eta_ref);
            for (Index d = 0; d < Dv; ++d) e.output_bound[(b * Tq + i) * Dv + d] *= factor;
        }
    return e;
}

// The largest error / bound over a result (must be <= 1); empty rows must be exactly 0 (policy Zero).
template <class T>
long double check_against_triple_loop(const SdpaResult<T>& r, const Expected& e) {
    long double worst = 0;
    for (std::size_t n = 0; n < e.output.size(); ++n) {
        const long double err = std::fabs(static_cast<long double>(r.output[static_cast<Index>(n)]) - e.output[n]);
        if (e.output_bound[n] == 0) {
            REQUIRE(err == 0);
        } else {
            worst = std::max(worst, err / e.output_bound[n]);
        }
    }
    for (std::size_t n = 0; n < e.weights.size(); ++n) {
        const long double err = std::fabs(static_cast<long double>((*r.weights)[static_cast<Index>(n)]) - e.weights[n]);
        if (e.weights_bound[n] == 0) {
            REQUIRE(err == 0);
        } else {
            worst = std::max(worst, err / e.weights_bound[n]);
        }
    }
    return worst;
}

}  // namespace

TEST_CASE("the course module's worked example (Part 2) comes out right", "[sdpa][example]") {
    // q (1,3,4), k (1,3,4), v (1,3,2)
    const Tensor<float> q({1, 3, 4}, {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0});
    const Tensor<float> k({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0});
    const Tensor<float> v({1, 3, 2}, {10, 0, 0, 10, 5, 5});
    const auto r = scaled_dot_product_attention(q, k, v, std::nullopt, with_weights());
    // The module prints 4 decimals, hence the 1e-4 margin.
    const float weights[] = {0.3837f, 0.2327f, 0.3837f, 0.2327f, 0.3837f, 0.3837f, 0.2741f, 0.2741f, 0.4519f};
    const float output[] = {5.7548f, 4.2452f, 4.2452f, 5.7548f, 5.0f, 5.0f};
    REQUIRE(r.weights->shape() == Shape{1, 3, 3});
    REQUIRE(r.output.shape() == Shape{1, 3, 2});
    for (int i = 0; i < 9; ++i) CHECK((*r.weights)[i] == Approx(weights[i]).margin(1e-4));
    for (int i = 0; i < 6; ++i) CHECK(r.output[i] == Approx(output[i]).margin(1e-4));
}

TEST_CASE("an all-masked row follows the empty-row policy", "[sdpa][mask]") {
    std::mt19937_64 rng(11);
    // q (2,3,4), k (2,3,4), v (2,3,2); only query 2 of batch element 1 may read no key.
    const auto q = random_tensor<double>({2, 3, 4}, rng), k = random_tensor<double>({2, 3, 4}, rng);
    const auto v = random_tensor<double>({2, 3, 2}, rng);
    Tensor<bool> allowed({2, 3, 3}, true);
    for (Index j = 0; j < 3; ++j) allowed({1, 2, j}) = false;

    SECTION("Throw (the default) names the row and the batch index") {
        const std::string m = test::error_message<MaskError>([&] { scaled_dot_product_attention(q, k, v, allowed.view()); });
        CHECK_THAT(m, Contains("sdpa") && Contains("query row 2") && Contains("batch index [1]") &&
                          Contains("allowed_mask [2,3,3]") && Contains("q [2,3,4]"));
    }
    SECTION("Zero gives zeros in the output and weights rows, and leaves the other rows alone") {
        SdpaOptions options = with_weights();
        options.empty_rows = EmptyRowPolicy::Zero;
        const auto r = scaled_dot_product_attention(q, k, v, allowed.view(), options);
        for (Index d = 0; d < 2; ++d) CHECK(r.output({1, 2, d}) == 0.0);
        for (Index j = 0; j < 3; ++j) CHECK(r.weights->operator()({1, 2, j}) == 0.0);
        const auto unmasked = scaled_dot_product_attention(q, k, v, std::nullopt, with_weights());
        for (Index i = 0; i < 2; ++i)
            for (Index d = 0; d < 2; ++d) CHECK(r.output({1, i, d}) == unmasked.output({1, i, d}));
    }
    SECTION("Nan gives NaN in the output and weights rows only") {
        SdpaOptions options = with_weights();
        options.empty_rows = EmptyRowPolicy::Nan;
        const auto r = scaled_dot_product_attention(q, k, v, allowed.view(), options);
        for (Index d = 0; d < 2; ++d) CHECK(std::isnan(r.output({1, 2, d})));
        for (Index j = 0; j < 3; ++j) CHECK(std::isnan(r.weights->operator()({1, 2, j})));
        for (Index n = 0; n < 10; ++n) CHECK(std::isfinite(r.output[n]));
    }
}

TEST_CASE("NaN inputs still propagate under the Zero policy when check_finite is off", "[sdpa][mask]") {
    // q (3,2), k (3,2), v (3,2): query 0 holds a NaN and reads keys; query 1 reads nothing; query 2 is clean.
    Tensor<float> q({3, 2}, {1, 2, 3, 4, 5, 6});
    const Tensor<float> k({3, 2}, {1, 0, 0, 1, 1, 1}), v({3, 2}, {1, 2, 3, 4, 5, 6});
    q({0, 1}) = std::numeric_limits<float>::quiet_NaN();
    const Tensor<bool> allowed({3, 3}, {true, true, true, false, false, false, true, true, true});
    SdpaOptions options = with_weights();
    options.empty_rows = EmptyRowPolicy::Zero;
    options.check_finite = false;
    const auto r = scaled_dot_product_attention(q, k, v, allowed.view(), options);
    CHECK(std::isnan(r.output({0, 0})));
    CHECK(std::isnan(r.output({0, 1})));
    CHECK(std::isnan(r.weights->operator()({0, 0})));
    CHECK(r.output({1, 0}) == 0.0f);
    CHECK(r.output({1, 1}) == 0.0f);
    CHECK(std::isfinite(r.output({2, 0})));
    // With the check on (the default) the same input is a ValueError naming q and the position.
    options.check_finite = true;
    const std::string m = test::error_message<ValueError>([&] { scaled_dot_product_attention(q, k, v, allowed.view(), options); });
    CHECK_THAT(m, Contains("sdpa") && Contains("q [3,2]") && Contains("row 0, column 1"));
}

TEST_CASE("cross-attention with Tq=4, Tk=7 and Dk != Dv matches the triple loop", "[sdpa][cross]") {
    std::mt19937_64 rng(3);
    // q (2,4,3), k (2,7,3), v (2,7,5) -> output (2,4,5), weights (2,4,7)
    const auto q = random_tensor<double>({2, 4, 3}, rng), k = random_tensor<double>({2, 7, 3}, rng);
    const auto v = random_tensor<double>({2, 7, 5}, rng);
    const auto r = scaled_dot_product_attention(q, k, v, std::nullopt, with_weights());
    REQUIRE(r.output.shape() == Shape{2, 4, 5});
    REQUIRE(r.weights->shape() == Shape{2, 4, 7});
    const auto e = triple_loop(q, k, v, Tensor<bool>({2, 4, 7}, true), 1.0 / std::sqrt(3.0));
    const long double worst = check_against_triple_loop(r, e);
    std::cout << "cross-attention Tq=4 Tk=7 Dk=3 Dv=5 double: max error/bound " << static_cast<double>(worst) << "\n";
    CHECK(worst <= 1);
}

TEST_CASE("bottom-right and top-left causal SDPA read exactly the documented keys when Tq != Tk", "[sdpa][causal]") {
    std::mt19937_64 rng(5);
    for (auto [Tq, Tk] : {std::pair<Index, Index>{3, 5}, {2, 6}, {5, 3}}) {
        const auto q = random_tensor<double>({Tq, 4}, rng), k = random_tensor<double>({Tk, 4}, rng);
        const auto v = random_tensor<double>({Tk, 2}, rng);
        for (CausalAlignment alignment : {CausalAlignment::TopLeft, CausalAlignment::BottomRight}) {
            SdpaOptions options = with_weights();
            options.is_causal = true;
            options.alignment = alignment;
            options.empty_rows = EmptyRowPolicy::Zero;
            const auto r = scaled_dot_product_attention(q, k, v, std::nullopt, options);
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j) {
                    INFO(to_string(alignment) << " Tq=" << Tq << " Tk=" << Tk << " i=" << i << " j=" << j);
                    const bool visible = alignment == CausalAlignment::TopLeft ? j <= i : j <= i + Tk - Tq;
                    CHECK((r.weights->operator()({i, j}) > 0) == visible);
                }
            if (alignment == CausalAlignment::BottomRight)
                for (Index j = 0; j < Tk; ++j) CHECK(r.weights->operator()({Tq - 1, j}) > 0);  // the last query sees all
            // The explicit mask of the same rule gives bitwise the same result.
            SdpaOptions explicit_options = with_weights();
            explicit_options.empty_rows = EmptyRowPolicy::Zero;
            const Tensor<bool> allowed = causal_allowed_mask(Tq, Tk, alignment);
            const auto m = scaled_dot_product_attention(q, k, v, allowed.view(), explicit_options);
            CHECK(bitwise_equal(m.output, r.output));
            CHECK(bitwise_equal(*m.weights, *r.weights));
        }
    }
}

TEST_CASE("NaN and Inf in key/value rows no query may read leave the output bitwise unchanged", "[sdpa][contract]") {
    std::mt19937_64 rng(13);
    // q (2,2,3,4), k (2,2,6,4), v (2,2,6,3); batch 0 pads keys 4 and 5, batch 1 pads key 5; causal top-left also
    // hides keys 3.. from every query (Tq=3), so those rows are unreadable in every batch element.
    const auto q = random_tensor<float>({2, 2, 3, 4}, rng);
    const auto k = random_tensor<float>({2, 2, 6, 4}, rng), v = random_tensor<float>({2, 2, 6, 3}, rng);
    const Tensor<std::int64_t> token_ids({2, 6}, {4, 8, 15, 16, 0, 0, 23, 42, 7, 9, 1, 0});
    const Tensor<bool> key_padding = key_padding_allowed_mask(token_ids.view(), 0);  // (2,1,1,6)
    for (bool causal : {false, true}) {
        SdpaOptions options = with_weights();
        options.is_causal = causal;
        const auto clean = scaled_dot_product_attention(q, k, v, key_padding.view(), options);
        Tensor<float> k_dirty = k, v_dirty = v;
        const float poison[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity()};
        for (Index b = 0; b < 2; ++b)
            for (Index h = 0; h < 2; ++h)
                for (Index j = 0; j < 6; ++j) {
                    const bool readable = token_ids({b, j}) != 0 && (!causal || j < 3);
                    if (readable) continue;
                    for (Index d = 0; d < 4; ++d) k_dirty({b, h, j, d}) = poison[(j + d) % 3];
                    for (Index d = 0; d < 3; ++d) v_dirty({b, h, j, d}) = poison[(j + d + 1) % 3];
                }
        const auto dirty = scaled_dot_product_attention(q, k_dirty, v_dirty, key_padding.view(), options);
        CHECK(bitwise_equal(dirty.output, clean.output));
        CHECK(bitwise_equal(*dirty.weights, *clean.weights));
    }
}

TEST_CASE("2-D, 3-D and 4-D masks and stride-0 views give bitwise the output of their expanded copies",
          "[sdpa][broadcast]") {
    std::mt19937_64 rng(17);
    const Shape full_mask{2, 3, 4, 5};  // (B, H, Tq, Tk)
    const auto q = random_tensor<float>({2, 3, 4, 6}, rng);
    const auto k = random_tensor<float>({2, 3, 5, 6}, rng), v = random_tensor<float>({2, 3, 5, 2}, rng);
    SdpaOptions options = with_weights();
    options.empty_rows = EmptyRowPolicy::Zero;
    for (const Shape& shape : {Shape{5}, Shape{4, 5}, Shape{3, 4, 5}, Shape{2, 1, 4, 5}, Shape{2, 3, 1, 5}, full_mask}) {
        INFO("allowed_mask " << to_string(shape));
        const Tensor<bool> allowed = random_mask(shape, rng, 0.7);
        const Tensor<bool> expanded = Tensor<bool>::copy_of(allowed.view().broadcast_to(full_mask, "test", "allowed_mask"));
        const auto a = scaled_dot_product_attention(q, k, v, allowed.view(), options);
        const auto b = scaled_dot_product_attention(q, k, v, expanded.view(), options);
        CHECK(bitwise_equal(a.output, b.output));
        CHECK(bitwise_equal(*a.weights, *b.weights));
    }
    // k and v shared across batch (1, 3, ...) and across heads (2, 1, ...) as stride-0 views vs materialised copies.
    const auto k_shared = random_tensor<float>({1, 3, 5, 6}, rng), v_heads = random_tensor<float>({2, 1, 5, 2}, rng);
    const auto k_full = Tensor<float>::copy_of(k_shared.view().broadcast_to({2, 3, 5, 6}, "test", "k"));
    const auto v_full = Tensor<float>::copy_of(v_heads.view().broadcast_to({2, 3, 5, 2}, "test", "v"));
    const auto a = scaled_dot_product_attention(q, k_shared, v_heads, std::nullopt, options);
    const auto b = scaled_dot_product_attention(q, k_full, v_full, std::nullopt, options);
    CHECK(a.output.shape() == Shape{2, 3, 4, 2});
    CHECK(bitwise_equal(a.output, b.output));
    // A stride-0 view passed directly (not a size-1 dim) behaves the same.
    const auto c = scaled_dot_product_attention(q.view(), k_shared.view().broadcast_to({2, 3, 5, 6}, "test", "k"),
                                                v_full.view(), std::nullopt, options);
    CHECK(bitwise_equal(c.output, b.output));
}

TEST_CASE("transposed and strided q, k, v views give bitwise the output of contiguous copies", "[sdpa][views]") {
    std::mt19937_64 rng(19);
    // q stored as (B, Dk, Tq) and viewed transposed; k a slice of a longer, wider buffer; v with B and H swapped.
    const auto q_t = random_tensor<double>({2, 4, 3}, rng);                // (B, Dk, Tq)
    const auto q_view = q_t.view().transpose(-1, -2);                      // (B, Tq, Dk)
    const auto k_big = random_tensor<double>({2, 9, 7}, rng);              // (B, 9, 7)
    const auto k_view = k_big.view().slice(1, 2, 7).slice(2, 1, 5);        // (B, Tk=5, Dk=4)
    const auto v_hb = random_tensor<double>({5, 2, 3}, rng);               // (Tk, B, Dv)
    const auto v_view = v_hb.view().transpose(0, 1);                       // (B, Tk, Dv)
    const auto q_c = Tensor<double>::copy_of(q_view), k_c = Tensor<double>::copy_of(k_view);
    const auto v_c = Tensor<double>::copy_of(v_view);
    SdpaOptions options = with_weights();
    options.is_causal = true;
    options.alignment = CausalAlignment::BottomRight;
    const auto a = scaled_dot_product_attention(q_view, k_view, v_view, std::nullopt, options);
    const auto b = scaled_dot_product_attention(q_c, k_c, v_c, std::nullopt, options);
    CHECK(a.output.shape() == Shape{2, 3, 3});
    CHECK(bitwise_equal(a.output, b.output));
    CHECK(bitwise_equal(*a.weights, *b.weights));
}

TEST_CASE("the same inputs give bitwise the same output, run twice and on 1 or 2 threads", "[sdpa][determinism]") {
    std::mt19937_64 rng(23);
    const auto q = random_tensor<float>({3, 2, 9, 16}, rng);
    const auto k = random_tensor<float>({3, 2, 11, 16}, rng), v = random_tensor<float>({3, 2, 11, 8}, rng);
    SdpaOptions options = with_weights();
    options.is_causal = true;
    options.alignment = CausalAlignment::BottomRight;
    const auto first = scaled_dot_product_attention(q, k, v, std::nullopt, options);
    const auto again = scaled_dot_product_attention(q, k, v, std::nullopt, options);
    CHECK(bitwise_equal(first.output, again.output));
    options.num_threads = 1;
    const auto one = scaled_dot_product_attention(q, k, v, std::nullopt, options);
    options.num_threads = 2;
    const auto two = scaled_dot_product_attention(q, k, v, std::nullopt, options);
    CHECK(bitwise_equal(one.output, two.output));
    CHECK(bitwise_equal(*one.weights, *two.weights));
    CHECK(bitwise_equal(one.output, first.output));
}

TEMPLATE_TEST_CASE("random shapes agree with a long double triple loop within the derived bound", "[sdpa][accuracy]",
                   float, double) {
    std::mt19937_64 rng(29);
    std::uniform_int_distribution<Index> batch(1, 2), tq(1, 9), tk(1, 12), dk(1, 16), dv(1, 8), kind(0, 3);
    long double worst = 0;
    const int cases = 150;
    for (int c = 0; c < cases; ++c) {
        const Index B = batch(rng), Tq = tq(rng), Tk = tk(rng), Dk = dk(rng), Dv = dv(rng);
        const auto q = random_tensor<TestType>({B, Tq, Dk}, rng), k = random_tensor<TestType>({B, Tk, Dk}, rng);
        const auto v = random_tensor<TestType>({B, Tk, Dv}, rng);
        SdpaOptions options = with_weights();
        options.empty_rows = EmptyRowPolicy::Zero;
        // 0: no mask, 1: random mask, 2: causal bottom-right, 3: random mask and causal top-left.
        const int k_ind = static_cast<int>(kind(rng));
        Tensor<bool> allowed({B, Tq, Tk}, true);
        if (k_ind == 1 || k_ind == 3) allowed = random_mask({B, Tq, Tk}, rng, 0.6);
        if (k_ind >= 2) {
            options.is_causal = true;
            options.alignment = k_ind == 2 ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
        }
        Tensor<bool> effective = allowed;
        for (Index b = 0; b < B; ++b)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j)
                    if (options.is_causal && !causal_allows(i, j, Tq, Tk, options.alignment)) effective({b, i, j}) = false;
        INFO("sdpa(B=" << B << ",Tq=" << Tq << ",Tk=" << Tk << ",Dk=" << Dk << ",Dv=" << Dv << ",kind=" << k_ind << ")");
        const auto r = k_ind == 1 || k_ind == 3 ? scaled_dot_product_attention(q, k, v, allowed.view(), options)
                                                : scaled_dot_product_attention(q, k, v, std::nullopt, options);
        const auto e = triple_loop(q, k, v, effective, 1.0 / std::sqrt(static_cast<double>(Dk)));
        worst = std::max(worst, check_against_triple_loop(r, e));
        REQUIRE(worst <= 1);
    }
    std::cout << "triple loop vs sdpa<" << (sizeof(TestType) == 4 ? "float" : "double") << ">, " << cases
              << " random shapes: max error/bound " << static_cast<double>(worst) << "\n";
    CHECK(worst > 0);  // the comparison measured something
}

TEST_CASE("Tq = 0 gives an empty output; Tk = 0 makes every row empty", "[sdpa][edge]") {
    const Tensor<float> q0({2, 0, 3}), k({2, 4, 3}), v({2, 4, 5});
    const auto r = scaled_dot_product_attention(q0, k, v, std::nullopt, with_weights());
    CHECK(r.output.shape() == Shape{2, 0, 5});
    CHECK(r.weights->shape() == Shape{2, 0, 4});

    const Tensor<float> q({2, 3, 3}), k0({2, 0, 3}), v0({2, 0, 5});
    const std::string m = test::error_message<MaskError>([&] { scaled_dot_product_attention(q, k0, v0); });
    CHECK_THAT(m, Contains("sdpa") && Contains("query row 0") && Contains("batch index [0]") && Contains("k [2,0,3]"));
    SdpaOptions options = with_weights();
    options.empty_rows = EmptyRowPolicy::Zero;
    const auto z = scaled_dot_product_attention(q, k0, v0, std::nullopt, options);
    CHECK(z.output.shape() == Shape{2, 3, 5});
    CHECK(z.weights->shape() == Shape{2, 3, 0});
    for (Index n = 0; n < z.output.numel(); ++n) CHECK(z.output[n] == 0.0f);
    options.empty_rows = EmptyRowPolicy::Nan;
    const auto nan = scaled_dot_product_attention(q, k0, v0, std::nullopt, options);
    for (Index n = 0; n < nan.output.numel(); ++n) CHECK(std::isnan(nan.output[n]));
}

TEST_CASE("Dk = 0 makes every logit 0, so each query averages the values it may read", "[sdpa][edge]") {
    const Tensor<double> q({3, 0}), k({4, 0});
    const Tensor<double> v({4, 1}, {1, 2, 4, 8});
    SdpaOptions options = with_weights();
    options.is_causal = true;  // query i reads keys 0..i
    const auto r = scaled_dot_product_attention(q, k, v, std::nullopt, options);
    // Means of 1 and 2 values are exact in binary. Row 2: weights fl(1/3) (relative error u), products by 1, 2, 4
    // exact, two additions of positive terms: relative error <= (1 + u)^3 - 1; plus u for fl(7/3): < 5u < 3 eps.
    CHECK(r.output[0] == 1.0);
    CHECK(r.output[1] == 1.5);
    CHECK(r.output[2] == Approx(7.0 / 3.0).epsilon(3 * std::numeric_limits<double>::epsilon()));
    CHECK(r.weights->operator()({2, 3}) == 0.0);
}

TEST_CASE("every bad input is the documented error naming the function, the tensors and their shapes",
          "[sdpa][errors]") {
    const Tensor<float> q({2, 3, 4}), k({2, 5, 4}), v({2, 5, 6});
    SECTION("rank < 2") {
        const Tensor<float> q1({4});
        const std::string m = test::error_message<ShapeError>([&] { scaled_dot_product_attention(q1, k, v); });
        CHECK_THAT(m, Contains("sdpa") && Contains("rank >= 2") && Contains("q [4]") && Contains("k [2,5,4]") &&
                          Contains("v [2,5,6]"));
    }
    SECTION("Dk mismatch") {
        const Tensor<float> k3({2, 5, 3});
        const std::string m = test::error_message<ShapeError>([&] { scaled_dot_product_attention(q, k3, v); });
        CHECK_THAT(m, Contains("sdpa: q has Dk=4 but k has Dk=3") && Contains("q [2,3,4]") && Contains("k [2,5,3]"));
    }
    SECTION("Tk mismatch") {
        const Tensor<float> v7({2, 7, 6});
        const std::string m = test::error_message<ShapeError>([&] { scaled_dot_product_attention(q, k, v7); });
        CHECK_THAT(m, Contains("sdpa: k has Tk=5 but v has Tk=7") && Contains("k [2,5,4]") && Contains("v [2,7,6]"));
    }
    SECTION("batch dims that do not broadcast") {
        const Tensor<float> k3({3, 5, 4}), v3({3, 5, 6});
        const std::string m = test::error_message<ShapeError>([&] { scaled_dot_product_attention(q, k3, v3); });
        CHECK_THAT(m, Contains("sdpa") && Contains("do not broadcast") && Contains("q [2,3,4]") && Contains("k [3,5,4]"));
    }
    SECTION("a mask that does not broadcast to (batch..., Tq, Tk)") {
        const Tensor<bool> allowed({3, 4}, true);
        const std::string m =
            test::error_message<ShapeError>([&] { scaled_dot_product_attention(q, k, v, allowed.view()); });
        CHECK_THAT(m, Contains("sdpa") && Contains("allowed_mask [3,4]") && Contains("[2,3,5]") && Contains("q [2,3,4]"));
        const Tensor<bool> too_many_dims({1, 1, 1, 3, 5}, true);
        const std::string r =
            test::error_message<ShapeError>([&] { scaled_dot_product_attention(q, k, v, too_many_dims.view()); });
        CHECK_THAT(r, Contains("sdpa") && Contains("allowed_mask [1,1,1,3,5]") && Contains("more dims"));
    }
    SECTION("a non-finite scale, or one that overflows the input dtype") {
        for (double scale : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 1e300}) {
            SdpaOptions options;
            options.scale = scale;
            const std::string m =
                test::error_message<ConfigError>([&] { scaled_dot_product_attention(q, k, v, std::nullopt, options); });
            CHECK_THAT(m, Contains("sdpa") && Contains("scale") && Contains("q [2,3,4]") && Contains("v [2,5,6]"));
        }
    }
    SECTION("negative num_threads") {
        SdpaOptions options;
        options.num_threads = -1;
        const std::string m =
            test::error_message<ConfigError>([&] { scaled_dot_product_attention(q, k, v, std::nullopt, options); });
        CHECK_THAT(m, Contains("sdpa") && Contains("num_threads") && Contains("-1") && Contains("k [2,5,4]"));
    }
    SECTION("a non-finite readable input") {
        Tensor<float> v_inf({2, 5, 6});
        v_inf({1, 3, 2}) = std::numeric_limits<float>::infinity();
        const std::string m = test::error_message<ValueError>([&] { scaled_dot_product_attention(q, k, v_inf); });
        CHECK_THAT(m, Contains("sdpa") && Contains("v [2,5,6]") && Contains("batch index [1], row 3, column 2"));
    }
    SECTION("logits that overflow although every input is finite") {
        const Tensor<float> q_big({1, 2, 2}, 1e20f), k_big({1, 3, 2}, 1e20f), v1({1, 3, 1}, 1.0f);
        const std::string m = test::error_message<ValueError>([&] { scaled_dot_product_attention(q_big, k_big, v1); });
        CHECK_THAT(m, Contains("sdpa") && Contains("overflowed") && Contains("query row 0") && Contains("q [1,2,2]") &&
                          Contains("k [1,3,2]"));
    }
    SECTION("an empty row under Throw") {
        SdpaOptions options;
        options.is_causal = true;
        options.alignment = CausalAlignment::BottomRight;
        const Tensor<float> q_long({2, 7, 4});  // Tq=7 > Tk=5: rows 0 and 1 see no key
        const std::string m =
            test::error_message<MaskError>([&] { scaled_dot_product_attention(q_long, k, v, std::nullopt, options); });
        CHECK_THAT(m, Contains("sdpa") && Contains("query row 0") && Contains("batch index [0]") &&
                          Contains("bottom-right") && Contains("q [2,7,4]"));
    }
}

TEMPLATE_TEST_CASE("scaled_dot_product_attention_into writes the output bits into the caller's tensor",
                   "[sdpa][into]", float, double, float16, bfloat16) {
    using T = TestType;
    std::mt19937_64 rng(61);
    const Shape qs{2, 3, 5, 4}, ks{2, 3, 7, 4}, vs{2, 3, 7, 6};
    Tensor<T> q({2, 3, 5, 4}), k({2, 3, 7, 4}), v({2, 3, 7, 6}), bias({5, 7});
    std::uniform_real_distribution<double> dist(-2, 2);
    for (Tensor<T>* t : {&q, &k, &v, &bias})
        for (Index f = 0; f < t->numel(); ++f) (*t)[f] = static_cast<T>(dist(rng));
    const Tensor<bool> mask = random_mask({5, 7}, rng, 0.8);
    for (const Backend backend : {Backend::Reference, Backend::Tiled}) {
        INFO("backend " << to_string(backend));
        SdpaOptions o;
        o.backend = backend, o.is_causal = true, o.alignment = CausalAlignment::BottomRight, o.bias = bias;
        o.empty_rows = EmptyRowPolicy::Zero;
        const Tensor<T> want = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask.view(), o).output;
        Tensor<T> out({2, 3, 5, 6}, static_cast<T>(7.0));  // stale values the call must overwrite
        for (int reuse = 0; reuse < 2; ++reuse) {
            scaled_dot_product_attention_into(out.view(), q.view(), k.view(), v.view(), mask.view(), o);
            for (Index f = 0; f < want.numel(); ++f)
                CHECK(std::memcmp(&out[f], &want[f], sizeof(T)) == 0);
        }
    }
    // Refusals name the function and the shapes.
    Tensor<T> wrong({2, 3, 5, 5});
    CHECK_THROWS_AS(scaled_dot_product_attention_into(wrong.view(), q.view(), k.view(), v.view()), ShapeError);
    CHECK(test::error_message<ShapeError>([&] {
              scaled_dot_product_attention_into(wrong.view(), q.view(), k.view(), v.view());
          }).find("sdpa_into: out must have the output's shape [2,3,5,6] (out [2,3,5,5], q [2,3,5,4]") == 0);
    Tensor<T> wide({2, 3, 5, 12});
    const TensorView<T> strided(wide.data(), {2, 3, 5, 6}, {180, 60, 12, 1});
    CHECK_THROWS_AS(scaled_dot_product_attention_into(strided, q.view(), k.view(), v.view()), ShapeError);
    // An output on top of an input would be written while it is read.
    Tensor<T> qv({2, 3, 5, 4});
    CHECK_THROWS_AS(scaled_dot_product_attention_into(qv.view(), qv.view(), k.view(), k.view()), ConfigError);
    SdpaOptions weights;
    weights.return_weights = true;
    Tensor<T> out({2, 3, 5, 6});
    CHECK_THROWS_AS(scaled_dot_product_attention_into(out.view(), q.view(), k.view(), v.view(), std::nullopt, weights),
                    ConfigError);
}
