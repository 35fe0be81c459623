// Backend `tiled` against `reference`: random shapes, masks, policies, unreadable NaN rows, thread counts.
#include <bit>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/machine.hpp"
#include "attn/tiled.hpp"
#include "backends.hpp"

using namespace attn;

namespace {

// Small seeded generator so every run sees the same cases (Catch's --rng-seed only orders the tests).
struct Rng {
    std::mt19937_64 gen;
    explicit Rng(std::uint64_t seed) : gen(seed) {}
    Index uniform(Index lo, Index hi) { return std::uniform_int_distribution<Index>(lo, hi)(gen); }
    double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen); }
    bool bernoulli(double p) { return std::bernoulli_distribution(p)(gen); }
    template <class V>
    V pick(const std::vector<V>& xs) { return xs[static_cast<std::size_t>(uniform(0, Index(xs.size()) - 1))]; }
};

template <class T>
Tensor<T> random_tensor(Rng& rng, const Shape& shape) {
    Tensor<T> t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(rng.normal());
    return t;
}

// Unit roundoff of T and Higham's gamma_n = n u / (1 - n u).
template <class T>
double unit_roundoff() { return std::ldexp(1.0, -std::numeric_limits<T>::digits); }
template <class T>
double gamma(double n) { return n * unit_roundoff<T>() / (1.0 - n * unit_roundoff<T>()); }

// Bound on |tiled - reference| for output element (b, i, d), derived for any implementation that
//   (a) forms each logit s_j = scale * q_i . k_j with a length-Dk dot product and one scaling (BLIS gemm, any
//       summation order): |ds_j| <= gamma(Dk + 1) * scale * sum_d |q_id k_jd| =: E_j  (Higham, Thm 3.5);
//   (b) evaluates p_j = exp(s_j - m) with one rounded subtraction (relative u |s_j - m|) and an exp within
//       `ulps` ulps (relative error <= 2 ulps u);
//   (c) forms l = sum_j p_j and a = sum_j p_j v_j, possibly in blocks with up to `blocks` rescalings by a
//       factor exp(m_old - m_new) (within `ulps` ulps, i.e. 2 ulps roundings of u) and one multiply each: every
//       term passes through at most Tk additions plus (2 ulps + 1) roundings per rescaling, relative
//       gamma(Tk + (2 ulps + 1) blocks) on the sum of |terms|;
//   (d) divides once (u) -- reference normalises p before the product, which is the same count.
// With eta = exp(2 max_j E_j + u max_j |s_j - m|) - 1 + 2 ulps u (relative perturbation of every p_j; the max
// is exact, so s_j - m errs by at most 2 E), the ratio a / l of perturbed sums moves by at most
// 2 eta / (1 - eta) * sum_j w_j |v_jd| (both sums perturbed relatively by eta), the sums add
// 2 gamma(Tk + (2 ulps + 1) blocks) * sum_j w_j |v_jd| (first order), and the division u |o|. Both
// implementations obey the bound, so their difference obeys twice it. Evaluated in double from the inputs and
// the reference weights.
template <class T>
struct Bound {
    const Tensor<T>& q;
    const Tensor<T>& k;
    const Tensor<T>& v;
    double scale;
    Index Tq, Tk, Dk, Dv;

    // Per row: the logit error and range terms (eta), computed once for all Dv output elements.
    struct Row {
        double eta = 0;
        bool empty = true;
    };
    Row row(const Tensor<T>& weights, Index b, Index i, bool k_broadcast) const {
        const double u = unit_roundoff<T>();
        const Index kb = k_broadcast ? 0 : b;
        double max_e = 0, max_logit = -INFINITY, min_logit = INFINITY;
        for (Index j = 0; j < Tk; ++j) {
            if (weights[(b * Tq + i) * Tk + j] == 0) continue;  // blocked, or a zero term either way
            double dot = 0, abs_dot = 0;
            for (Index c = 0; c < Dk; ++c) {
                const double x = q[(b * Tq + i) * Dk + c], y = k[(kb * Tk + j) * Dk + c];
                dot += x * y;
                abs_dot += std::abs(x * y);
            }
            max_e = std::max(max_e, gamma<T>(double(Dk + 1)) * scale * abs_dot);
            max_logit = std::max(max_logit, scale * dot);
            min_logit = std::min(min_logit, scale * dot);
        }
        if (max_logit == -INFINITY) return {};
        return {std::expm1(2 * max_e + u * (max_logit - min_logit + 2 * max_e)) +
                    2 * tiled_kernel_info.exp_max_ulps * u,
                false};
    }
    // weights: the reference's (batch, Tq, Tk); out: the reference output (batch, Tq, Dv).
    double at(const Row& r, const Tensor<T>& weights, const Tensor<T>& out, Index b, Index i, Index d,
              bool k_broadcast) const {
        if (r.empty) return 0;
        const double u = unit_roundoff<T>();
        const Index kb = k_broadcast ? 0 : b;
        double wv = 0;
        for (Index j = 0; j < Tk; ++j) {
            const double w = weights[(b * Tq + i) * Tk + j];
            if (w != 0) wv += w * std::abs(double(v[(kb * Tk + j) * Dv + d]));  // unread v rows may hold NaN/Inf
        }
        const double blocks = double(tiled_kernel_info.rescalings(Tk));
        const double rescale_roundings = 2 * tiled_kernel_info.exp_max_ulps + 1;
        const double per_impl =
            (2 * r.eta / (1 - r.eta) + 2 * gamma<T>(double(Tk) + rescale_roundings * blocks)) * wv * (1 + 2 * u) +
            u * std::abs(double(out[(b * Tq + i) * Dv + d]));
        return 2 * per_impl;
    }
};

struct Case {
    Index B, H, Tq, Tk, Dk, Dv;
    bool causal;
    CausalAlignment alignment;
    enum Masking { None, Padding, Random, Broadcast } masking;
    bool k_broadcast;  // k and v shared across heads and batch (stride 0)
    std::optional<SlidingWindow> window = std::nullopt;
    std::string str() const {
        std::ostringstream s;
        s << "sdpa(B=" << B << ",H=" << H << ",Tq=" << Tq << ",Tk=" << Tk << ",Dk=" << Dk << ",Dv=" << Dv
          << ",mask=" << (causal ? (alignment == CausalAlignment::TopLeft ? "causal-tl" : "causal-br") : "none")
          << "+"
          << (masking == None      ? "none"
              : masking == Padding ? "padding"
              : masking == Random  ? "random"
                                   : "broadcast")
          << (k_broadcast ? ",kv=broadcast" : "") << (window ? "," + to_string(*window) : "") << ",impl=tiled)";
        return s.str();
    }
};

// Whether query i of flat batch element b may read key j (causal rule and the case's allowed mask).
bool may_read(const Case& c, const std::optional<Tensor<bool>>& allowed, Index b, Index i, Index j) {
    if (c.causal && !causal_allows(i, j, c.Tq, c.Tk, c.alignment)) return false;
    if (c.window) {  // FlashAttention's and JAX's inequalities, written out
        const Index d = c.window->alignment == CausalAlignment::TopLeft ? i : i + c.Tk - c.Tq;
        if ((c.window->left >= 0 && j < d - c.window->left) || (c.window->right >= 0 && j > d + c.window->right))
            return false;
    }
    switch (c.masking) {
        case Case::None: return true;
        case Case::Padding: return (*allowed)[(b / c.H) * c.Tk + j];
        case Case::Random: return (*allowed)[(b * c.Tq + i) * c.Tk + j];
        case Case::Broadcast: return (*allowed)[i * c.Tk + j];
    }
    return true;
}

// Runs one case on both backends and checks every element against the derived bound (NaN/zero rows exactly).
template <class T>
void check_case(Rng& rng, const Case& c, EmptyRowPolicy policy, bool nan_in_unread) {
    INFO(c.str() << " policy=" << to_string(policy) << " dtype=" << (sizeof(T) == 4 ? "float" : "double"));
    const Index batch = c.B * c.H;
    Tensor<T> q = random_tensor<T>(rng, {c.B, c.H, c.Tq, c.Dk});
    Tensor<T> k = random_tensor<T>(rng, c.k_broadcast ? Shape{1, 1, c.Tk, c.Dk} : Shape{c.B, c.H, c.Tk, c.Dk});
    Tensor<T> v = random_tensor<T>(rng, c.k_broadcast ? Shape{1, 1, c.Tk, c.Dv} : Shape{c.B, c.H, c.Tk, c.Dv});
    std::optional<Tensor<bool>> allowed;
    if (c.masking == Case::Padding) {
        // (B, 1, 1, Tk): the last keys of each batch element are padding (at least one real key).
        allowed = Tensor<bool>({c.B, 1, 1, c.Tk}, false);
        for (Index b = 0; b < c.B; ++b) {
            const Index len = rng.uniform(1, c.Tk);
            for (Index j = 0; j < len; ++j) (*allowed)[b * c.Tk + j] = true;
        }
    } else if (c.masking == Case::Random) {
        allowed = Tensor<bool>({c.B, c.H, c.Tq, c.Tk});
        const double p = rng.pick(std::vector<double>{0.05, 0.5, 0.95});
        for (Index i = 0; i < allowed->numel(); ++i) (*allowed)[i] = rng.bernoulli(p);
    } else if (c.masking == Case::Broadcast) {
        allowed = Tensor<bool>({c.Tq, c.Tk});
        for (Index i = 0; i < allowed->numel(); ++i) (*allowed)[i] = rng.bernoulli(0.7);
    }
    SdpaOptions options;
    options.is_causal = c.causal;
    options.alignment = c.alignment;
    options.window = c.window;
    options.empty_rows = policy;
    options.backend = Backend::Reference;
    options.return_weights = true;
    std::optional<TensorView<const bool>> mask_view;
    if (allowed) mask_view = allowed->view();

    SdpaResult<T> ref = [&] {
        try {
            return scaled_dot_product_attention(q.view(), k.view(), v.view(), mask_view, options);
        } catch (const MaskError&) {
            return SdpaResult<T>{Tensor<T>(), std::nullopt};  // empty row under Throw: tiled must throw too
        }
    }();
    options.backend = Backend::Tiled;
    options.return_weights = false;
    if (!ref.weights) {
        CHECK_THROWS_AS(scaled_dot_product_attention(q.view(), k.view(), v.view(), mask_view, options), MaskError);
        return;
    }
    if (nan_in_unread) {
        // Every key/value row no query may read becomes NaN: the output must not change by a bit.
        const SdpaResult<T> clean = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask_view, options);
        const Index kv_batch = c.k_broadcast ? 1 : batch;
        for (Index b = 0; b < kv_batch; ++b)
            for (Index j = 0; j < c.Tk; ++j) {
                bool read = false;
                for (Index bb = c.k_broadcast ? 0 : b; bb < (c.k_broadcast ? batch : b + 1) && !read; ++bb)
                    for (Index i = 0; i < c.Tq && !read; ++i) read = may_read(c, allowed, bb, i, j);
                if (read) continue;
                for (Index d = 0; d < c.Dk; ++d) k[(b * c.Tk + j) * c.Dk + d] = std::numeric_limits<T>::quiet_NaN();
                for (Index d = 0; d < c.Dv; ++d) v[(b * c.Tk + j) * c.Dv + d] = std::numeric_limits<T>::infinity();
            }
        const SdpaResult<T> dirty = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask_view, options);
        for (Index e = 0; e < clean.output.numel(); ++e) {
            const bool same = clean.output[e] == dirty.output[e] ||
                              (std::isnan(clean.output[e]) && std::isnan(dirty.output[e]));
            if (!same) FAIL("element " << e << ": " << clean.output[e] << " became " << dirty.output[e]);
        }
    }
    const SdpaResult<T> tiled = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask_view, options);
    REQUIRE(tiled.output.shape() == ref.output.shape());
    const Bound<T> bound{q, k, v, 1.0 / std::sqrt(double(c.Dk)), c.Tq, c.Tk, c.Dk, c.Dv};
    double worst = 0;  // max error / bound, printed even when it passes
    for (Index b = 0; b < batch; ++b)
        for (Index i = 0; i < c.Tq; ++i) {
            const auto row = bound.row(*ref.weights, b, i, c.k_broadcast);
            for (Index d = 0; d < c.Dv; ++d) {
                const Index e = (b * c.Tq + i) * c.Dv + d;
                const double r = ref.output[e], t = tiled.output[e];
                if (std::isnan(r) || std::isnan(t)) {
                    if (std::isnan(r) != std::isnan(t)) FAIL("element " << e << ": reference " << r << ", tiled " << t);
                    continue;
                }
                const double err = std::abs(t - r);
                const double bnd = bound.at(row, *ref.weights, ref.output, b, i, d, c.k_broadcast);
                if (bnd == 0) {
                    if (t != r) FAIL("element " << e << " of an empty row: reference " << r << ", tiled " << t);
                    continue;
                }
                worst = std::max(worst, err / bnd);
                if (!(err <= bnd)) FAIL("element " << e << ": |tiled - reference| = " << err << " > bound " << bnd);
            }
        }
    CAPTURE(worst);
    SUCCEED("max |tiled - reference| / bound = " << worst);
}

}  // namespace

// One documented place for how many random cases each test runs (they stay under a few seconds in Release).
constexpr int random_cases = 40;

Case random_case(Rng& rng) {
    // Edge sizes (1, block multiples and their neighbours) weighted against arbitrary ones.
    const std::vector<Index> T_edges{1, 2, 127, 128, 129, 255, 256, 257, 300, 513};
    const std::vector<Index> D_edges{1, 3, 16, 64, 80};
    Case c;
    c.B = rng.uniform(1, 2);
    c.H = rng.uniform(1, 2);
    c.Tq = rng.bernoulli(0.7) ? rng.pick(T_edges) : rng.uniform(1, 600);
    c.Tk = rng.bernoulli(0.7) ? rng.pick(T_edges) : rng.uniform(1, 600);
    c.Dk = rng.pick(D_edges);
    c.Dv = rng.bernoulli(0.5) ? c.Dk : rng.pick(D_edges);
    c.causal = rng.bernoulli(0.5);
    c.alignment = rng.bernoulli(0.5) ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
    c.masking = static_cast<Case::Masking>(rng.uniform(0, 3));
    c.k_broadcast = rng.bernoulli(0.2);
    if (rng.bernoulli(0.4)) {
        // Sides around the micro-tile and block sizes, so windows start and end inside and across key blocks.
        const std::vector<Index> sides{-1, 0, 1, 5, 17, 64, 200, 300};
        c.window = SlidingWindow{rng.pick(sides), rng.pick(sides),
                                 rng.bernoulli(0.5) ? CausalAlignment::TopLeft : CausalAlignment::BottomRight};
    }
    return c;
}

TEMPLATE_TEST_CASE("tiled equals reference within the derived bound on random shapes, masks and policies",
                   "[tiled]", float, double) {
    Rng rng(sizeof(TestType) == 4 ? 7001 : 7002);
    for (int n = 0; n < random_cases; ++n) {
        const Case c = random_case(rng);
        const EmptyRowPolicy policy = rng.pick(std::vector<EmptyRowPolicy>{
            EmptyRowPolicy::Throw, EmptyRowPolicy::Zero, EmptyRowPolicy::Nan});
        check_case<TestType>(rng, c, policy, rng.bernoulli(0.5));
    }
}

TEMPLATE_TEST_CASE("tiled handles T=1, D=1, Tq != Tk, block edges and both causal alignments", "[tiled]", float,
                   double) {
    Rng rng(7100);
    const std::vector<Case> cases{
        {1, 1, 1, 1, 1, 1, false, CausalAlignment::TopLeft, Case::None, false},
        {1, 1, 1, 1, 1, 1, true, CausalAlignment::BottomRight, Case::None, false},
        {1, 2, 1, 513, 64, 64, true, CausalAlignment::BottomRight, Case::None, false},  // decode step
        {1, 1, 513, 1, 1, 5, false, CausalAlignment::TopLeft, Case::None, false},
        {2, 1, 300, 700, 16, 8, true, CausalAlignment::TopLeft, Case::None, false},
        {2, 1, 300, 700, 16, 8, true, CausalAlignment::BottomRight, Case::None, false},
        {1, 1, 700, 300, 16, 8, true, CausalAlignment::TopLeft, Case::Padding, false},
        {1, 1, 700, 300, 16, 8, true, CausalAlignment::BottomRight, Case::None, false},  // first 400 rows empty
        {1, 3, 256, 512, 64, 64, false, CausalAlignment::TopLeft, Case::Broadcast, true},
        {1, 1, 129, 257, 1, 1, true, CausalAlignment::TopLeft, Case::Random, false},
        // Sliding windows: a local band across several key blocks, its top-left twin, an asymmetric band with a
        // padding mask on top, and a window with causal (right side cut to 0).
        {1, 1, 700, 700, 16, 8, false, CausalAlignment::TopLeft, Case::None, false, SlidingWindow{256, 0}},
        {1, 1, 300, 900, 16, 8, false, CausalAlignment::TopLeft, Case::None, false,
         SlidingWindow{100, 3, CausalAlignment::TopLeft}},
        {2, 1, 600, 520, 8, 8, false, CausalAlignment::TopLeft, Case::Padding, false, SlidingWindow{7, 150}},
        {1, 2, 513, 513, 32, 16, true, CausalAlignment::BottomRight, Case::None, true, SlidingWindow{300, 40}},
    };
    for (const Case& c : cases)
        for (EmptyRowPolicy policy : {EmptyRowPolicy::Throw, EmptyRowPolicy::Zero, EmptyRowPolicy::Nan})
            check_case<TestType>(rng, c, policy, true);
}

TEMPLATE_TEST_CASE("tiled gives bitwise the same output on 1 and 2 threads", "[tiled][threads]", float, double) {
    Rng rng(7200);
    const Tensor<TestType> q = random_tensor<TestType>(rng, {2, 3, 300, 32});
    const Tensor<TestType> k = random_tensor<TestType>(rng, {2, 3, 520, 32});
    const Tensor<TestType> v = random_tensor<TestType>(rng, {2, 3, 520, 24});
    for (bool causal : {false, true}) {
        SdpaOptions options;
        options.backend = Backend::Tiled;
        options.is_causal = causal;
        options.alignment = CausalAlignment::BottomRight;
        options.num_threads = 1;
        const auto one = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
        options.num_threads = 2;
        const auto two = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
        options.num_threads = 3;  // more threads than cores, and a different split of the items
        const auto three = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
        Index differing = 0;
        for (Index e = 0; e < one.output.numel(); ++e)
            differing += (one.output[e] != two.output[e]) + (one.output[e] != three.output[e]);
        CHECK(differing == 0);
    }
}

TEST_CASE("tiled reports an overflowing logit or output as a ValueError naming the row", "[tiled][errors]") {
    // q k^T overflows float: 1e20 * 1e20 * Dk; every input is finite.
    Tensor<float> q({1, 2, 4}, 1e20f), k({1, 3, 4}, 1e20f), v({1, 3, 2}, 1.0f);
    SdpaOptions options;
    options.backend = Backend::Tiled;
    CHECK_THROWS_WITH(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options),
                      Catch::Contains("a logit (scale * q k^T) overflowed") && Catch::Contains("query row 0"));
    // Finite weights but v near FLT_MAX: the weighted sum overflows.
    Tensor<float> q2({1, 1, 4}, 0.0f), k2({1, 2, 4}, 0.0f), v2({1, 2, 2}, 3e38f);
    CHECK_THROWS_WITH(scaled_dot_product_attention(q2.view(), k2.view(), v2.view(), std::nullopt, options),
                      Catch::Contains("the output (weights @ v) overflowed"));
}

TEST_CASE("tiled refuses to return weights and rejects empty rows under Throw", "[tiled][errors]") {
    Rng rng(7300);
    const Tensor<float> q = random_tensor<float>(rng, {1, 4, 8});
    const Tensor<float> k = random_tensor<float>(rng, {1, 6, 8});
    const Tensor<float> v = random_tensor<float>(rng, {1, 6, 8});
    SdpaOptions options;
    options.backend = Backend::Tiled;
    options.return_weights = true;
    CHECK_THROWS_AS(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options), ConfigError);
    options.return_weights = false;
    const Tensor<bool> none({4, 6}, false);
    CHECK_THROWS_AS(scaled_dot_product_attention(q.view(), k.view(), v.view(), none.view(), options), MaskError);
}

TEST_CASE("tiled's error-model description is the kernel's", "[tiled]") {
    STATIC_REQUIRE(tiled_kernel_info.query_block == tiled_query_block);
    STATIC_REQUIRE(tiled_kernel_info.key_block == tiled_key_block);
    CHECK(tiled_kernel_info.rescalings(1) == 1);
    CHECK(tiled_kernel_info.rescalings(tiled_key_block) == 1);
    CHECK(tiled_kernel_info.rescalings(tiled_key_block + 1) == 2);
    CHECK_FALSE(tiled_kernel_info.scale_folded_into_q);
}

// Distance in representable values between two finite T of the same sign (+0 and -0 are the same value).
template <class T>
double ulp_distance(T a, T b) {
    if (a == b) return 0;
    using Bits = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
    Bits ia, ib;
    std::memcpy(&ia, &a, sizeof a);
    std::memcpy(&ib, &b, sizeof b);
    return double(ia > ib ? ia - ib : ib - ia);  // both >= 0 here (exp is never negative), so no overflow
}

TEMPLATE_TEST_CASE("on every SIMD target, the kernel's exp is within tiled_exp_max_ulps of the correctly rounded "
                   "exp on (-inf, log(max)]",
                   "[tiled][exp]", float, double) {
    // The forward's arguments are s - max <= 0 (or -inf); the backward's s - lse may be just above 0 (a saved lse's
    // rounding), or anything below log(max) with a wrong lse. The sweep covers down to where exp underflows to 0
    // (subnormal results included) on 2^20 points and up to the largest finite result on 2^16, with exact identities
    // first. The error model (tiled_kernel_info) uses one number for every target, so it is measured on each target
    // this CPU runs; the maximum is always printed.
    const std::string forced = simd_target();
    const double lowest = sizeof(TestType) == 4 ? -103.9 : -745.0;
    const double highest = std::log(double(std::numeric_limits<TestType>::max())) - 1e-3;
    const Index n_below = 1 << 20, n_above = 1 << 16, n = n_below + n_above;
    std::vector<TestType> x(static_cast<std::size_t>(n));
    for (Index i = 0; i < n_below; ++i) x[i] = static_cast<TestType>(lowest * double(i) / double(n_below - 1));
    for (Index i = 0; i < n_above; ++i)
        x[n_below + i] = static_cast<TestType>(highest * double(i + 1) / double(n_above));
    // Under ATTN_SIMD_TARGET (ctest's per-target runs) the forced target alone; otherwise every one.
    const std::vector<std::string> targets =
        std::getenv("ATTN_SIMD_TARGET") ? std::vector<std::string>{forced} : simd_targets();
    for (const std::string& target : targets) {
        force_simd_target(target);
        TestType edge[] = {0, -0.0, -std::numeric_limits<TestType>::infinity()};
        detail::tiled_exp(edge, 3);
        CHECK(edge[0] == 1);
        CHECK(edge[1] == 1);
        CHECK(edge[2] == 0);
        std::vector<TestType> y = x;
        detail::tiled_exp(y.data(), n);
        double worst = 0;
        TestType worst_x = 0;
        for (Index i = 0; i < n; ++i) {
            const auto exact = static_cast<TestType>(std::exp(static_cast<long double>(x[i])));
            const double d = ulp_distance(y[i], exact);
            if (d > worst) {
                worst = d;
                worst_x = x[i];
            }
        }
        std::printf("exp %-6s on %-8s max ulp distance %g at x = %.9g (limit %g)\n",
                    sizeof(TestType) == 4 ? "float" : "double", target.c_str(), worst, double(worst_x),
                    tiled_exp_max_ulps);
        INFO("target " << target << ": max ulp distance " << worst << " at x = " << worst_x);
        CHECK(worst <= tiled_exp_max_ulps);
    }
    force_simd_target(forced);
}

// The arguments of the soft-capping's tanh: [0, 20] densely (beyond 18.7 Highway's Tanh returns 1, beyond 9.02 the
// float one's argument is clamped), and tiny ones down to the subnormal range, where tanh x = x. tanh is odd and both
// implementations are.
template <class T>
std::vector<T> tanh_arguments() {
    std::vector<T> x;
    const Index n = 1 << 19;
    for (Index i = 0; i < n; ++i) x.push_back(static_cast<T>(20.0 * double(i) / double(n - 1)));
    for (double e = -140; e < 0; e += 0.01) x.push_back(static_cast<T>(std::exp2(e)));
    return x;
}

template <class T>
double worst_tanh_ulps(const std::vector<T>& x, const std::vector<T>& y, T& worst_x) {
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const auto exact = static_cast<T>(std::tanh(static_cast<long double>(x[i])));
        const double d = ulp_distance(y[i], exact);
        if (d > worst) worst = d, worst_x = x[i];
    }
    return worst;
}

TEMPLATE_TEST_CASE("on every SIMD target, the kernel's soft-capping tanh is within tiled_tanh_max_ulps of the "
                   "correctly rounded tanh",
                   "[tiled][softcap]", float, double) {
    using T = TestType;
    const std::vector<T> x = tanh_arguments<T>();
    const std::string forced = simd_target();
    const std::vector<std::string> targets =
        std::getenv("ATTN_SIMD_TARGET") ? std::vector<std::string>{forced} : simd_targets();
    for (const std::string& target : targets) {
        force_simd_target(target);
        // cap 1: the division and the product are exact, so the result is Tanh's own.
        std::vector<T> y = x;
        detail::tiled_softcap(y.data(), static_cast<Index>(y.size()), T(1));
        T worst_x = 0;
        const double worst = worst_tanh_ulps(x, y, worst_x);
        std::printf("tanh %-6s on %-8s max ulp distance %g at x = %.9g (limit %g)\n", sizeof(T) == 4 ? "float" : "double",
                    target.c_str(), worst, double(worst_x), tiled_tanh_max_ulps);
        INFO("target " << target << ": max ulp distance " << worst << " at x = " << worst_x);
        CHECK(worst <= tiled_tanh_max_ulps);
        // Blocked keys stay -inf, NaN stays NaN, +-inf and huge logits become +-cap, 0 stays 0.
        T edge[] = {-std::numeric_limits<T>::infinity(), std::numeric_limits<T>::quiet_NaN(),
                    std::numeric_limits<T>::infinity(), std::numeric_limits<T>::max(), -std::numeric_limits<T>::max(),
                    T(0), T(30)};
        detail::tiled_softcap(edge, 7, T(2.5));
        CHECK(edge[0] == -std::numeric_limits<T>::infinity());
        CHECK(std::isnan(edge[1]));
        CHECK(edge[2] == T(2.5));
        CHECK(edge[3] == T(2.5));
        CHECK(edge[4] == T(-2.5));
        CHECK(edge[5] == T(0));
        CHECK(std::fabs(edge[6] - T(2.5) * std::tanh(T(12))) <= 8 * std::numeric_limits<T>::epsilon());
    }
    force_simd_target(forced);
}

// float tanh correctly rounded: tanh in double (within 1 ulp of double), rounded to float; where that double lies
// within a few of its ulps of a float rounding boundary (the double rounding could then pick the wrong side), in long
// double instead.
float correctly_rounded_tanh(float x) {
    const double r = std::tanh(static_cast<double>(x));
    const float f = static_cast<float>(r);
    const double below = 0.5 * (double(f) + double(std::nextafter(f, 0.0f)));
    const double above = 0.5 * (double(f) + double(std::nextafter(f, 2.0f)));
    const double slack = 4 * std::numeric_limits<double>::epsilon() * std::fabs(r);
    if (std::fabs(r - below) > slack && std::fabs(r - above) > slack) return f;
    return static_cast<float>(std::tanh(static_cast<long double>(x)));
}

TEST_CASE("on every SIMD target, the kernel's float tanh is within tiled_tanh_max_ulps at every float in "
          "[2^-13, 16]",
          "[tiled][softcap][exhaustive]") {
    // Exhaustive where the rational approximation's terms matter: below 2^-13 its two polynomials round to 1 and
    // the result is the argument (the sampled test above covers that range), beyond 9.02 the argument is clamped
    // (the range goes to 16). Odd bit for bit, so the positive half is the whole story. About 142 million
    // arguments, in chunks, each against every target this CPU runs.
    const std::string forced = simd_target();
    const std::vector<std::string> targets =
        std::getenv("ATTN_SIMD_TARGET") ? std::vector<std::string>{forced} : simd_targets();
    std::uint32_t first, last;
    const float lo = 0x1p-13f, hi = 16.0f;
    std::memcpy(&first, &lo, 4);
    std::memcpy(&last, &hi, 4);
    std::vector<double> worst(targets.size(), 0);
    std::vector<float> worst_x(targets.size(), 0);
    constexpr std::uint32_t chunk = 1u << 20;
    std::vector<float> x, exact, y;
    for (std::uint32_t c0 = first; c0 <= last; c0 += chunk) {
        const std::uint32_t n = std::min(chunk, last - c0 + 1);
        x.resize(n);
        exact.resize(n);
        for (std::uint32_t i = 0; i < n; ++i) {
            const std::uint32_t bits = c0 + i;
            std::memcpy(&x[i], &bits, 4);
            exact[i] = correctly_rounded_tanh(x[i]);
        }
        for (std::size_t t = 0; t < targets.size(); ++t) {
            force_simd_target(targets[t]);
            y = x;
            detail::tiled_softcap(y.data(), static_cast<Index>(n), 1.0f);  // cap 1: the tanh alone
            for (std::uint32_t i = 0; i < n; ++i) {
                const double d = ulp_distance(y[i], exact[i]);
                if (d > worst[t]) worst[t] = d, worst_x[t] = x[i];
            }
        }
    }
    force_simd_target(forced);
    for (std::size_t t = 0; t < targets.size(); ++t) {
        std::printf("tanh float on %-8s every x in [2^-13, 16]: max ulp distance %g at x = %.9g (limit %g)\n",
                    targets[t].c_str(), worst[t], double(worst_x[t]), tiled_tanh_max_ulps);
        INFO("target " << targets[t] << ": max ulp distance " << worst[t] << " at x = " << worst_x[t]);
        CHECK(worst[t] <= tiled_tanh_max_ulps);
    }
}

TEST_CASE("Backend::Auto runs tiled from 128 x 128 scores on and reference below or when weights are asked for",
          "[tiled][dispatch]") {
    Rng rng(7400);
    const auto same_bits = [](const Tensor<float>& a, const Tensor<float>& b) {
        for (Index e = 0; e < a.numel(); ++e)
            if (a[e] != b[e]) return false;
        return true;
    };
    for (const Index T : {Index(100), Index(128)}) {
        const Tensor<float> q = random_tensor<float>(rng, {2, T, 16});
        const Tensor<float> k = random_tensor<float>(rng, {2, T, 16});
        const Tensor<float> v = random_tensor<float>(rng, {2, T, 16});
        SdpaOptions options;
        const auto run = [&](Backend backend, bool weights) {
            options.backend = backend;
            options.return_weights = weights;
            return scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options).output;
        };
        const Tensor<float> tiled = run(Backend::Tiled, false), reference = run(Backend::Reference, false);
        REQUIRE_FALSE(same_bits(tiled, reference));  // otherwise the dispatch would be unobservable
        CHECK(same_bits(run(Backend::Auto, false), T == 128 ? tiled : reference));
        CHECK(same_bits(run(Backend::Auto, true), reference));
        CHECK_THROWS_AS(run(Backend::Tiled, true), ConfigError);
    }
}

TEST_CASE("tiled's block sizes are options: negative ones are refused by name, any positive ones run", "[tiled][errors]") {
    const Tensor<float> q({4, 3}), k({7, 3}), v({7, 2});
    SdpaOptions o;
    o.backend = Backend::Tiled;
    o.tiled_key_block = -1;
    CHECK_THROWS_WITH(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, o),
                      Catch::StartsWith("sdpa: tiled_query_block and tiled_key_block must be >= 0") &&
                          Catch::Contains("got 0 and -1"));
    // Blocks of one query and one key, and blocks that divide neither Tq nor Tk. Every logit is 0, so each p is
    // Exp(0) = 1, every rescaling multiplies by Exp(0) = 1, and the sums of small integers are exact: whatever the
    // blocking, the output is the one rounding fl(sum_j v_jc / 7).
    Tensor<float> vv({7, 2});
    for (Index e = 0; e < vv.numel(); ++e) vv[e] = static_cast<float>(e % 5);
    for (const auto& [bq, bk] : {std::pair<Index, Index>{1, 1}, {3, 5}, {2, 3}}) {
        o.tiled_query_block = bq;
        o.tiled_key_block = bk;
        const Tensor<float> out = scaled_dot_product_attention(q.view(), k.view(), vv.view(), std::nullopt, o).output;
        for (Index i = 0; i < 4; ++i)
            for (Index c = 0; c < 2; ++c) {
                float sum = 0;
                for (Index j = 0; j < 7; ++j) sum += vv[j * 2 + c];
                CAPTURE(bq, bk, i, c);
                CHECK(out[i * 2 + c] == sum / 7.0f);
            }
    }
}

TEMPLATE_TEST_CASE("on every SIMD target, the kernel's packing converts every 16-bit pattern to the float the scalar "
                   "conversion gives, bit for bit",
                   "[tiled][half]", float16, bfloat16) {
    // All 2^16 patterns (zeros, subnormals, normals, both infinities, quiet and signalling NaNs), at every offset
    // of the vector loop and its scalar tail: the row length 65536 + 7 is no multiple of any lane count.
    const std::string forced = simd_target();
    std::vector<TestType> x(65536 + 7);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = TestType::from_bits(static_cast<std::uint16_t>(i));
    const std::vector<std::string> targets =
        std::getenv("ATTN_SIMD_TARGET") ? std::vector<std::string>{forced} : simd_targets();
    for (const std::string& target : targets) {
        force_simd_target(target);
        std::vector<float> y(x.size(), -1.0f);
        detail::tiled_widen(x.data(), static_cast<Index>(x.size()), y.data());
        std::size_t differ = 0, first = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            const float scalar = static_cast<float>(x[i]);
            if (std::memcmp(&scalar, &y[i], sizeof scalar) != 0 && differ++ == 0) first = i;
        }
        INFO("target " << target << ": " << differ << " patterns differ, the first 0x" << std::hex
                       << x[first].bits);
        CHECK(differ == 0);
    }
    force_simd_target(forced);
}

TEMPLATE_TEST_CASE("on every SIMD target, the kernel's output rounding gives every float the 16-bit value the scalar "
                   "conversion gives, bit for bit",
                   "[tiled][half]", float16, bfloat16) {
    // Floats with bits a multiple of 2^9 + 7 apart (every exponent, varied low bits), and every float within 2^16
    // ulps of the edges: ties and carries near 1, both formats' largest finite values and the float16 infinity
    // threshold (65520), float16's smallest normal and subnormals (2^-14, 2^-24, 2^-25: rounds to 0 or up), float's
    // smallest normal, infinity and the NaNs beside it; each with both signs, at every offset of the vector loop.
    const std::string forced = simd_target();
    std::vector<float> x;
    const auto add_bits = [&](std::uint32_t bits) {
        for (const std::uint32_t sign : {0u, 0x8000'0000u}) x.push_back(std::bit_cast<float>(bits | sign));
    };
    for (std::uint64_t bits = 0; bits < 0x8000'0000ull; bits += (1u << 9) + 7) add_bits(static_cast<std::uint32_t>(bits));
    for (const float edge : {1.0f, 65504.0f, 65520.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.fep127f,
                             std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                             std::numeric_limits<float>::infinity()}) {
        const auto centre = static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(edge));
        for (std::int64_t d = -(1 << 16); d <= (1 << 16); ++d)
            if (centre + d >= 0 && centre + d < 0x8000'0000ll) add_bits(static_cast<std::uint32_t>(centre + d));
    }
    x.push_back(0.0f);  // an odd count: a scalar tail on every lane count
    const std::vector<std::string> targets =
        std::getenv("ATTN_SIMD_TARGET") ? std::vector<std::string>{forced} : simd_targets();
    for (const std::string& target : targets) {
        force_simd_target(target);
        std::vector<TestType> y(x.size(), TestType::from_bits(0x1234));
        detail::tiled_narrow(x.data(), static_cast<Index>(x.size()), y.data());
        std::size_t differ = 0, first = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
            if (static_cast<TestType>(x[i]).bits != y[i].bits && differ++ == 0) first = i;
        INFO("target " << target << ": " << differ << " of " << x.size() << " floats differ, the first 0x" << std::hex
                       << std::bit_cast<std::uint32_t>(x[first]) << " -> 0x" << y[first].bits << ", scalar 0x"
                       << static_cast<TestType>(x[first]).bits);
        CHECK(differ == 0);
    }
    force_simd_target(forced);
}

TEST_CASE("the kept workspace never carries one call's packed keys into the next: calls of every storage type and "
          "shape in turn give each call's own bits", "[tiled][workspace]") {
    // float16, bfloat16 and float calls share one workspace per thread (they compute in float), and a call of the
    // same shape as the last one must still pack its own keys.
    Rng rng(83);
    SdpaOptions o;
    o.backend = Backend::Tiled;
    o.num_threads = 1;
    const auto first = [&](auto q, auto k, auto v) {
        return scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, o).output;
    };
    const Tensor<float> qf = random_tensor<float>(rng, {1, 2, 5, 8}), kf = random_tensor<float>(rng, {1, 2, 9, 8}),
                        vf = random_tensor<float>(rng, {1, 2, 9, 8});
    const Tensor<float> kf2 = random_tensor<float>(rng, {1, 2, 9, 8});
    const Tensor<float16> qh = random_tensor<float16>(rng, {1, 2, 5, 8}), kh = random_tensor<float16>(rng, {1, 2, 9, 8}),
                          vh = random_tensor<float16>(rng, {1, 2, 9, 8});
    const Tensor<bfloat16> qb = random_tensor<bfloat16>(rng, {1, 2, 5, 8}), kb = random_tensor<bfloat16>(rng, {1, 2, 9, 8}),
                           vb = random_tensor<bfloat16>(rng, {1, 2, 9, 8});
    // Each call's bits, first on their own (each after a call of another shape, so nothing can be reused).
    const Tensor<float> lone_f = first(qf, kf, vf);
    (void)first(random_tensor<float>(rng, {1, 1, 3, 4}), random_tensor<float>(rng, {1, 1, 3, 4}),
                random_tensor<float>(rng, {1, 1, 3, 4}));
    const Tensor<float> lone_f2 = first(qf, kf2, vf);
    const Tensor<float16> lone_h = first(qh, kh, vh);
    const Tensor<bfloat16> lone_b = first(qb, kb, vb);
    // Then in turn, same shapes back to back.
    for (int round = 0; round < 2; ++round) {
        const Tensor<float> a = first(qf, kf, vf), a2 = first(qf, kf2, vf);
        const Tensor<float16> h = first(qh, kh, vh);
        const Tensor<bfloat16> b = first(qb, kb, vb);
        const Tensor<float> c = first(qf, kf, vf);
        CHECK(std::memcmp(a.data(), lone_f.data(), sizeof(float) * a.numel()) == 0);
        CHECK(std::memcmp(a2.data(), lone_f2.data(), sizeof(float) * a2.numel()) == 0);
        CHECK(std::memcmp(h.data(), lone_h.data(), sizeof(float16) * h.numel()) == 0);
        CHECK(std::memcmp(b.data(), lone_b.data(), sizeof(bfloat16) * b.numel()) == 0);
        CHECK(std::memcmp(c.data(), lone_f.data(), sizeof(float) * c.numel()) == 0);
    }
    CHECK(std::memcmp(lone_f.data(), lone_f2.data(), sizeof(float) * lone_f.numel()) != 0);  // the keys matter
}
