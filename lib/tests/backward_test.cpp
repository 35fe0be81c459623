// attn/backward.hpp and SdpaOptions::return_lse: the row log-sum-exp of both backends where it is exact, the backward
// pass against the oracle's exact gradients on inputs whose every intermediate is exact (so the bits must agree),
// its contracts (zero gradients where nobody reads, empty rows per policy, the sums of broadcast inputs, causal
// independence, thread counts) and its refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "attn/detail/splitmix64.hpp"
#include "attn/oracle/backward.hpp"
#include "attn/oracle/metrics.hpp"
#include "error_message.hpp"

using namespace attn;
using Catch::Contains;

namespace {

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
    return a.shape() == b.shape() &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

template <class T>
Tensor<T> integers(const Shape& shape, std::mt19937_64& rng, int lo, int hi) {
    std::uniform_int_distribution<int> dist(lo, hi);
    Tensor<T> t(shape);
    for (Index x = 0; x < t.numel(); ++x) t[x] = static_cast<T>(dist(rng));
    return t;
}

template <class T>
Tensor<T> normal(const Shape& shape, std::mt19937_64& rng) {
    std::normal_distribution<double> dist(0.0, 1.0);
    Tensor<T> t(shape);
    for (Index x = 0; x < t.numel(); ++x) t[x] = static_cast<T>(dist(rng));
    return t;
}

// Row i allows keys [0, 2^(i mod 4)) of Tk = 10: 1, 2, 4 or 8 keys, so uniform weights 1/n are powers of two;
// keys 8 and 9 nobody reads.
Tensor<bool> power_of_two_mask(Index Tq) {
    Tensor<bool> mask({Tq, 10});
    for (Index i = 0; i < Tq; ++i)
        for (Index j = 0; j < 10; ++j) mask[i * 10 + j] = j < (Index(1) << (i % 4));
    return mask;
}

template <class T>
void check_exact_case(bool zero_queries, int threads) {
    // Dk = 4 (scale 1/2), small integer inputs and weights 1/n with n a power of two: the logits are 0 (q = 0 or
    // k = 0), P is uniform, and dP, D, dS, dq, dk and dv are short dyadic numbers, exact in every dtype here. So the
    // library's gradients must be the oracle's exact ones, bit for bit. k and v are shared by 3 query heads.
    std::mt19937_64 rng(zero_queries ? 11 : 12);
    const Index Tq = 6;
    Tensor<T> q = integers<T>({2, 3, Tq, 4}, rng, -3, 3), k = integers<T>({2, 1, 10, 4}, rng, -3, 3);
    const Tensor<T> v = integers<T>({2, 1, 10, 2}, rng, -3, 3), dout = integers<T>({2, 3, Tq, 2}, rng, -3, 3);
    for (Index x = 0; x < (zero_queries ? q.numel() : k.numel()); ++x) (zero_queries ? q : k)[x] = T(0);
    const Tensor<bool> mask = power_of_two_mask(Tq);
    SdpaOptions options;
    options.return_lse = true;
    options.backend = Backend::Reference;
    options.num_threads = threads;
    const SdpaResult<T> fwd = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask.view(), options);
    const SdpaGradients<T> g =
        sdpa_backward(q.view(), k.view(), v.view(), fwd.output.view(), fwd.lse->view(), dout.view(), mask.view(), options);
    const oracle::Gradients<T> e = oracle::sdpa_backward<T>(q.view(), k.view(), v.view(), dout.view(), mask.view(), options);
    CHECK(same_bits(g.dq, e.dq));
    CHECK(same_bits(g.dk, e.dk));
    CHECK(same_bits(g.dv, e.dv));
    // Not a trivial agreement: the case has non-zero gradients.
    const Tensor<T>& moved = zero_queries ? e.dq : e.dk;
    bool any = false;
    for (Index x = 0; x < moved.numel(); ++x) any = any || static_cast<double>(moved[x]) != 0;
    CHECK(any);
}

}  // namespace

TEST_CASE("the lse of both backends is log(n) + c where every allowed logit is c, -inf for an empty row", "[backward][lse]") {
    // q = 0 and a row-constant bias c: every allowed logit of row i is c_i exactly, the max is c_i, the sum is n_i
    // exactly, so both backends give fl(c_i + log(n_i)) with log as the library computes it (std::log in T).
    std::mt19937_64 rng(3);
    const Index Tq = 300, Tk = 300;  // beyond the tiled kernel's blocks
    const Tensor<float> q({2, Tq, 8}), k = normal<float>({2, Tk, 8}, rng), v = normal<float>({2, Tk, 3}, rng);
    Tensor<float> bias({Tq, 1});
    for (Index i = 0; i < Tq; ++i) bias[i] = static_cast<float>(i % 7) - 3.0f;
    SdpaOptions options;
    options.bias = bias;
    options.is_causal = true;
    options.alignment = CausalAlignment::BottomRight;
    options.return_lse = true;
    for (Backend backend : {Backend::Reference, Backend::Tiled}) {
        INFO(to_string(backend));
        options.backend = backend;
        const Tensor<float> qs({2, Tq + 5, 8});  // 5 more queries than keys: rows 0-4 see no key
        options.empty_rows = EmptyRowPolicy::Zero;
        const SdpaResult<float> r = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
        REQUIRE(r.lse);
        REQUIRE(r.lse->shape() == Shape{2, Tq});
        for (Index b = 0; b < 2; ++b)
            for (Index i = 0; i < Tq; ++i)
                CHECK((*r.lse)[b * Tq + i] == bias[i] + std::log(static_cast<float>(i + 1)));
        Tensor<float> bias_long({Tq + 5, 1});
        for (Index i = 0; i < Tq + 5; ++i) bias_long[i] = 1.0f;
        options.bias = bias_long;
        const SdpaResult<float> e = scaled_dot_product_attention(qs.view(), k.view(), v.view(), std::nullopt, options);
        for (Index i = 0; i < 5; ++i) CHECK((*e.lse)[i] == -std::numeric_limits<float>::infinity());
        CHECK((*e.lse)[5] == 1.0f + std::log(1.0f));
        options.bias = bias;
    }
    // 16-bit storage: the lse is in float, the compute type.
    const Tensor<float16> h({1, 4, 2}), hk({1, 8, 2}), hv({1, 8, 2});
    SdpaOptions plain;
    plain.return_lse = true;
    const SdpaResult<float16> hr = scaled_dot_product_attention(h.view(), hk.view(), hv.view(), std::nullopt, plain);
    for (Index i = 0; i < 4; ++i) CHECK((*hr.lse)[i] == std::log(8.0f));
    CHECK_THROWS_AS(scaled_dot_product_attention_into(Tensor<float16>({1, 4, 2}).view(), h.view(), hk.view(), hv.view(),
                                                      std::nullopt, plain),
                    ConfigError);
}

TEST_CASE("the backward pass gives the exact gradients bit for bit where every intermediate is exact",
          "[backward][oracle]") {
    for (int threads : {1, 2}) {
        INFO("threads " << threads);
        check_exact_case<double>(true, threads);
        check_exact_case<double>(false, threads);
        check_exact_case<float>(true, threads);
        check_exact_case<float>(false, threads);
        check_exact_case<bfloat16>(true, threads);
        check_exact_case<float16>(false, threads);
    }
}

namespace {

void check_contracts_case(Backend backend) {
    INFO(to_string(backend));
    std::mt19937_64 rng(5);
    const Index Tq = 9, Tk = 9;
    Tensor<double> q = normal<double>({2, 3, Tq, 4}, rng), k = normal<double>({2, 1, Tk, 4}, rng),
                   v = normal<double>({2, 1, Tk, 3}, rng);
    const Tensor<double> dout = normal<double>({2, 3, Tq, 3}, rng);
    Tensor<bool> mask({Tq, Tk});
    for (Index x = 0; x < mask.numel(); ++x) mask[x] = x % Tk != 7;  // key 7: nobody reads it
    for (Index b = 0; b < 2; ++b)  // whatever it holds
        for (Index d = 0; d < 4; ++d) k[(b * Tk + 7) * 4 + d] = std::numeric_limits<double>::quiet_NaN();
    SdpaOptions options;
    options.is_causal = true;
    options.softcap = 3.0;
    options.return_lse = true;
    options.num_threads = 1;
    options.backend = backend;
    options.tiled_query_block = 2;  // several query and key blocks in the tiled backward (and forward)
    options.tiled_key_block = 4;
    const SdpaResult<double> f = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask.view(), options);
    const SdpaGradients<double> g =
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), mask.view(), options);
    for (Index b = 0; b < 2; ++b) {
        for (Index d = 0; d < 4; ++d) CHECK(g.dk[(b * Tk + 7) * 4 + d] == 0.0);
        for (Index d = 0; d < 3; ++d) CHECK(g.dv[(b * Tk + 7) * 3 + d] == 0.0);
    }
    options.num_threads = 2;
    const SdpaGradients<double> g2 =
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), mask.view(), options);
    CHECK(same_bits(g.dq, g2.dq));
    CHECK(same_bits(g.dk, g2.dk));
    CHECK(same_bits(g.dv, g2.dv));

    // k and v expanded to the 3 query heads: per-head gradients whose sums, in head order, are the grouped ones.
    Tensor<double> k3({2, 3, Tk, 4}), v3({2, 3, Tk, 3});
    for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 3; ++h) {
            std::copy_n(k.data() + b * Tk * 4, Tk * 4, k3.data() + (b * 3 + h) * Tk * 4);
            std::copy_n(v.data() + b * Tk * 3, Tk * 3, v3.data() + (b * 3 + h) * Tk * 3);
        }
    const SdpaGradients<double> e =
        sdpa_backward(q.view(), k3.view(), v3.view(), f.output.view(), f.lse->view(), dout.view(), mask.view(), options);
    CHECK(same_bits(e.dq, g.dq));
    for (Index b = 0; b < 2; ++b)
        for (Index x = 0; x < Tk * 4; ++x) {
            double sum = 0;
            for (Index h = 0; h < 3; ++h) sum += e.dk[(b * 3 + h) * Tk * 4 + x];
            CHECK(sum == g.dk[b * Tk * 4 + x]);
        }

    // Causal (top-left): query i reads keys 0..i, so changing keys i+1.. changes none of the first i+1 rows of dq.
    Tensor<double> k_future = Tensor<double>::copy_of(k.view()), v_future = Tensor<double>::copy_of(v.view());
    for (Index b = 0; b < 2; ++b)
        for (Index j = 5; j < Tk; ++j) {
            for (Index d = 0; d < 4; ++d) k_future[(b * Tk + j) * 4 + d] += 1.5;
            for (Index d = 0; d < 3; ++d) v_future[(b * Tk + j) * 3 + d] -= 2.0;
        }
    const SdpaResult<double> ff = scaled_dot_product_attention(q.view(), k_future.view(), v_future.view(), mask.view(), options);
    const SdpaGradients<double> gf = sdpa_backward(q.view(), k_future.view(), v_future.view(), ff.output.view(),
                                                   ff.lse->view(), dout.view(), mask.view(), options);
    for (Index bh = 0; bh < 6; ++bh)
        for (Index i = 0; i < 5; ++i)
            for (Index d = 0; d < 4; ++d) CHECK(gf.dq[(bh * Tq + i) * 4 + d] == g.dq[(bh * Tq + i) * 4 + d]);
}

}  // namespace

TEST_CASE("backward contracts: unread keys get zero, broadcast inputs the sum, causal rows ignore the future, any thread count the same bits",
          "[backward]") {
    check_contracts_case(Backend::Reference);
    check_contracts_case(Backend::Tiled);
}

TEST_CASE("backward: empty rows per policy, values nobody reads never reach a gradient, bad calls are refused by name",
          "[backward]") {
    std::mt19937_64 rng(9);
    const Tensor<float> q = normal<float>({5, 4}, rng), k = normal<float>({3, 4}, rng), v = normal<float>({3, 2}, rng);
    Tensor<float> dout = normal<float>({5, 2}, rng);
    SdpaOptions options;
    options.is_causal = true;
    options.alignment = CausalAlignment::BottomRight;  // Tq = 5 > Tk = 3: rows 0 and 1 see no key
    options.return_lse = true;
    options.empty_rows = EmptyRowPolicy::Zero;
    const SdpaResult<float> f = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    dout[0] = std::numeric_limits<float>::quiet_NaN();  // an empty row's: never read
    const SdpaGradients<float> g =
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), std::nullopt, options);
    for (Index d = 0; d < 8; ++d) CHECK(g.dq[d] == 0.0f);
    for (const Tensor<float>* t : {&g.dq, &g.dk, &g.dv})
        for (Index x = 0; x < t->numel(); ++x) CHECK(std::isfinite((*t)[x]));
    options.empty_rows = EmptyRowPolicy::Nan;
    const SdpaGradients<float> n =
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), std::nullopt, options);
    for (Index d = 0; d < 8; ++d) CHECK(std::isnan(n.dq[d]));
    CHECK(same_bits(n.dk, g.dk));
    CHECK(same_bits(n.dv, g.dv));
    options.empty_rows = EmptyRowPolicy::Throw;
    std::string m = test::error_message<MaskError>([&] {
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), std::nullopt, options);
    });
    CHECK_THAT(m, Contains("sdpa_backward"));
    options.empty_rows = EmptyRowPolicy::Zero;

    dout[2 * 2] = std::numeric_limits<float>::infinity();  // row 2 reads key 0
    m = test::error_message<ValueError>([&] {
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), std::nullopt, options);
    });
    CHECK_THAT(m, Contains("sdpa_backward: dout [5,2] holds inf at batch index [], row 2, column 0"));
    dout[2 * 2] = 0.5f;
    const Tensor<float> short_lse({4});
    m = test::error_message<ShapeError>([&] {
        sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), short_lse.view(), dout.view(), std::nullopt, options);
    });
    CHECK_THAT(m, Contains("sdpa_backward: lse must have the forward's shape [5], got [4]"));
}

namespace {

// The largest error / bound of one gradient (oracle::compare_gradient); fails the test on any element over its bound.
template <class T>
double tightness(const Tensor<T>& computed, const oracle::Gradients<T>& exact, oracle::Gradient which) {
    const oracle::Comparison c = oracle::compare_gradient<T>(computed.view(), exact, which);
    INFO(oracle::gradient_name(which) << ": " << c.summary());
    REQUIRE(c.pass());
    CHECK(c.unbounded == 0);
    return c.max_tightness;
}

template <class T>
void check_within_bound(std::uint64_t seed, bool variants, Backend backend) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<Index> size(1, 24);
    const Index Tq = size(rng), Tk = size(rng), Dk = size(rng) % 9 + 1, Dv = size(rng) % 7 + 1;
    const Tensor<T> q = normal<T>({2, 3, Tq, Dk}, rng), k = normal<T>({2, 1, Tk, Dk}, rng),
                    v = normal<T>({2, 1, Tk, Dv}, rng), dout = normal<T>({2, 3, Tq, Dv}, rng);
    Tensor<bool> mask({Tq, Tk});
    for (Index x = 0; x < mask.numel(); ++x) mask[x] = (rng() % 5) != 0;
    Tensor<T> bias = normal<T>({3, Tq, Tk}, rng);
    const std::vector<double> standard = alibi_slopes(3);
    Tensor<T> slopes({3});  // (H): one slope per query head
    for (Index h = 0; h < 3; ++h) slopes[h] = static_cast<T>(standard[static_cast<std::size_t>(h)]);
    SdpaOptions options;
    options.empty_rows = EmptyRowPolicy::Zero;
    options.return_lse = true;
    options.backend = backend;
    // The tiled backward (and forward) with small blocks, so that rows and keys span several of them.
    options.tiled_query_block = static_cast<Index>(rng() % 5) + 1;
    options.tiled_key_block = static_cast<Index>(rng() % 7) + 1;
    std::optional<TensorView<const bool>> m;
    if (variants) {
        m = mask.view();
        options.bias = bias;
        options.alibi_slopes = slopes;
        options.is_causal = seed % 2 == 0;
        options.alignment = CausalAlignment::BottomRight;
        if (seed % 3 == 0) options.window = SlidingWindow{3, 2};
        if (seed % 2 == 1) options.softcap = seed == 3 ? 0.7 : 5.0;  // near saturation, and mild
    }
    const SdpaResult<T> f = scaled_dot_product_attention(q.view(), k.view(), v.view(), m, options);
    const SdpaGradients<T> g = sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), m, options);
    oracle::OracleOptions oo;
    oo.model = backend == Backend::Tiled ? oracle::library_tiled_model(options.tiled_key_block) : oracle::reference_model();
    const oracle::Gradients<T> e = oracle::sdpa_backward<T>(q.view(), k.view(), v.view(), dout.view(), m, options, oo);
    const double t = std::max({tightness(g.dq, e, oracle::Gradient::Dq), tightness(g.dk, e, oracle::Gradient::Dk),
                               tightness(g.dv, e, oracle::Gradient::Dv)});
    const char* dtype = std::is_same_v<T, double>  ? "double"
                        : std::is_same_v<T, float> ? "float"
                        : std::is_same_v<T, float16> ? "float16"
                                                      : "bfloat16";
    std::cout << "  " << to_string(backend) << " backward, " << dtype << ", seed " << seed
              << (variants ? " with mask, bias, ALiBi" : "") << (options.softcap != 0 ? ", soft-cap" : "")
              << ": max error / bound " << t << "\n";
}

}  // namespace

TEST_CASE("both backwards are within the oracle's gradient bound (oracle/BOUNDS.md sections 12, 12b)",
          "[backward][oracle]") {
    for (Backend backend : {Backend::Reference, Backend::Tiled})
        for (std::uint64_t seed = 1; seed <= 6; ++seed) {
            INFO(to_string(backend) << ", seed " << seed);
            check_within_bound<double>(seed, seed > 2, backend);
            check_within_bound<float>(seed, seed > 2, backend);
            check_within_bound<float16>(seed, seed > 2, backend);
            check_within_bound<bfloat16>(seed, seed > 2, backend);
        }
}

TEST_CASE("the tiled backward's bound does not absorb a wrong saved lse or output (oracle/BOUNDS.md section 12b)",
          "[backward][oracle]") {
    // The bound takes the saved lse and output as a forward of the model computes them, not as given: a backward
    // handed an lse off by 2^-12 (a few hundred ulps) or an output off by 2^-12 in one row computes gradients of another
    // function, and the check says so.
    std::mt19937_64 rng(21);
    const Tensor<float> q = normal<float>({2, 12, 8}, rng), k = normal<float>({2, 10, 8}, rng),
                        v = normal<float>({2, 10, 4}, rng), dout = normal<float>({2, 12, 4}, rng);
    SdpaOptions options;
    options.backend = Backend::Tiled;
    options.return_lse = true;
    options.tiled_query_block = 4;
    options.tiled_key_block = 3;
    const SdpaResult<float> f = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    oracle::OracleOptions oo;
    oo.model = oracle::library_tiled_model(options.tiled_key_block);
    const oracle::Gradients<float> e = oracle::sdpa_backward<float>(q.view(), k.view(), v.view(), dout.view(), std::nullopt, options, oo);
    const auto passes = [&](const SdpaGradients<float>& g) {
        return oracle::compare_gradient<float>(g.dq.view(), e, oracle::Gradient::Dq).pass() &&
               oracle::compare_gradient<float>(g.dk.view(), e, oracle::Gradient::Dk).pass() &&
               oracle::compare_gradient<float>(g.dv.view(), e, oracle::Gradient::Dv).pass();
    };
    CHECK(passes(sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(), std::nullopt, options)));
    Tensor<float> lse = Tensor<float>::copy_of(f.lse->view());
    lse[5] += 0x1p-12f;
    CHECK_FALSE(passes(sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), lse.view(), dout.view(), std::nullopt, options)));
    Tensor<float> out = Tensor<float>::copy_of(f.output.view());
    for (Index d = 0; d < 4; ++d) out[5 * 4 + d] += 0x1p-12f;
    CHECK_FALSE(passes(sdpa_backward(q.view(), k.view(), v.view(), out.view(), f.lse->view(), dout.view(), std::nullopt, options)));
}

namespace {

// The head path's backward (multi_head_sdpa_backward) in training mode against the oracle with dropout's weight
// multipliers (oracle/BOUNDS.md section 12c), built here from MhaConfig::dropout_seed's documented rule.
template <class T>
double head_dropout_tightness(std::uint64_t seed, double p) {
    std::mt19937_64 rng(seed);
    const Index B = 2, H = 4, G = 2, R = H / G, Tq = 9, Tk = 11, Dk = 5, Dv = 3;
    const Tensor<T> q = normal<T>({B, Tq, H * Dk}, rng), k = normal<T>({B, Tk, G * Dk}, rng),
                    v = normal<T>({B, Tk, G * Dv}, rng), dout = normal<T>({B, Tq, H * Dv}, rng);
    Tensor<bool> mask({B, H, Tq, Tk});
    for (Index x = 0; x < mask.numel(); ++x) mask[x] = (rng() % 4) != 0;
    MhaOptions options;
    options.training = true;
    options.dropout_step = seed;
    options.empty_rows = EmptyRowPolicy::Zero;
    options.softcap = seed % 2 ? 3.0 : 0.0;
    const MhaDropout dropout{p, seed * 7919};
    const MhaGradients<T> g =
        multi_head_sdpa_backward(q.view(), k.view(), v.view(), dout.view(), H, G, mask.view(), options, dropout);
    Tensor<double> mult({B, G, R, Tq, Tk});
    const double keep = static_cast<double>(static_cast<compute_t<T>>(1.0 / (1.0 - p)));
    Index dropped = 0;
    for (Index f = 0; f < mult.numel(); ++f) {
        const std::uint64_t bits = detail::splitmix64_mix(detail::splitmix64_mix(detail::splitmix64_mix(dropout.seed) ^
                                                                                 options.dropout_step) ^
                                                          static_cast<std::uint64_t>(f));
        mult[f] = detail::unit_uniform(bits) >= p ? keep : 0.0;
        dropped += mult[f] == 0.0;
    }
    CHECK(dropped > 0);
    const auto split = [&](const Tensor<T>& x, Index groups, Index per, Index D) {
        return TensorView<const T>(x.data(), {B, groups, per, x.dim(1), D}, {x.dim(1) * x.dim(2), per * D, D, x.dim(2), 1});
    };
    SdpaOptions sdpa;
    sdpa.softcap = options.softcap;
    sdpa.empty_rows = options.empty_rows;
    const TensorView<const bool> mask5(mask.data(), {B, G, R, Tq, Tk}, {H * Tq * Tk, R * Tq * Tk, Tq * Tk, Tk, 1});
    oracle::OracleOptions oo;
    oo.model = oracle::reference_model();
    const oracle::Gradients<T> e = oracle::sdpa_backward<T>(split(q, G, R, Dk), split(k, G, 1, Dk), split(v, G, 1, Dv),
                                                            split(dout, G, R, Dv), mask5, sdpa, oo, mult.view());
    const Tensor<T> dq = Tensor<T>::copy_of(split(g.dq_projected, G, R, Dk)),
                    dk = Tensor<T>::copy_of(split(g.dk_projected, G, 1, Dk)),
                    dv = Tensor<T>::copy_of(split(g.dv_projected, G, 1, Dv));
    return std::max({tightness(dq, e, oracle::Gradient::Dq), tightness(dk, e, oracle::Gradient::Dk),
                     tightness(dv, e, oracle::Gradient::Dv)});
}

}  // namespace

TEST_CASE("the head path's backward with dropout is within the oracle's bound of the dropped-out forward's gradients "
          "(oracle/BOUNDS.md section 12c)",
          "[backward][oracle][mha]") {
    for (std::uint64_t seed = 1; seed <= 4; ++seed)
        for (double p : {0.1, 0.3, 0.5}) {
            INFO("seed " << seed << ", p " << p);
            std::cout << "  head path backward with dropout p=" << p << ", seed " << seed << ": max error / bound double "
                      << head_dropout_tightness<double>(seed, p) << ", float " << head_dropout_tightness<float>(seed, p)
                      << ", float16 " << head_dropout_tightness<float16>(seed, p) << ", bfloat16 "
                      << head_dropout_tightness<bfloat16>(seed, p) << "\n";
        }
}

TEST_CASE("the head path's backward: evaluation mode is sdpa_backward per head, p = 0 drops nothing, bad calls are "
          "refused by name",
          "[backward][mha]") {
    std::mt19937_64 rng(5);
    const Index B = 2, H = 2, Tq = 6, Tk = 5, Dk = 4, Dv = 3;
    const Tensor<double> q = normal<double>({B, Tq, H * Dk}, rng), k = normal<double>({B, Tk, H * Dk}, rng),
                         v = normal<double>({B, Tk, H * Dv}, rng), dout = normal<double>({B, Tq, H * Dv}, rng);
    MhaOptions options;
    options.backend = Backend::Reference;
    const MhaGradients<double> eval = multi_head_sdpa_backward(q.view(), k.view(), v.view(), dout.view(), H, H,
                                                               std::nullopt, options);
    MhaOptions training = options;
    training.training = true;
    const MhaGradients<double> p0 = multi_head_sdpa_backward(q.view(), k.view(), v.view(), dout.view(), H, H,
                                                             std::nullopt, training, MhaDropout{0.0, 3});
    for (Index x = 0; x < eval.dq_projected.numel(); ++x) CHECK(eval.dq_projected[x] == p0.dq_projected[x]);
    // Head h alone through sdpa_backward: its columns of the projected inputs.
    for (Index h = 0; h < H; ++h) {
        const auto head = [&](const Tensor<double>& x, Index D) {
            return TensorView<const double>(x.data() + h * D, {B, x.dim(1), D}, {x.dim(1) * x.dim(2), x.dim(2), 1});
        };
        SdpaOptions sdpa;
        sdpa.backend = Backend::Reference;
        sdpa.return_lse = true;
        const SdpaResult<double> f = scaled_dot_product_attention(head(q, Dk), head(k, Dk), head(v, Dv), std::nullopt, sdpa);
        const SdpaGradients<double> g = sdpa_backward(head(q, Dk), head(k, Dk), head(v, Dv), f.output.view(),
                                                      f.lse->view(), head(dout, Dv), std::nullopt, sdpa);
        for (Index b = 0; b < B; ++b)
            for (Index i = 0; i < Tq; ++i)
                for (Index d = 0; d < Dk; ++d)
                    CHECK(g.dq[(b * Tq + i) * Dk + d] == eval.dq_projected[(b * Tq + i) * H * Dk + h * Dk + d]);
        for (Index b = 0; b < B; ++b)
            for (Index j = 0; j < Tk; ++j) {
                for (Index d = 0; d < Dk; ++d)
                    CHECK(g.dk[(b * Tk + j) * Dk + d] == eval.dk_projected[(b * Tk + j) * H * Dk + h * Dk + d]);
                for (Index d = 0; d < Dv; ++d)
                    CHECK(g.dv[(b * Tk + j) * Dv + d] == eval.dv_projected[(b * Tk + j) * H * Dv + h * Dv + d]);
            }
    }
    const Tensor<double> short_dout = normal<double>({B, Tq, H * Dv - 1}, rng);
    const std::string m = test::error_message<ShapeError>([&] {
        multi_head_sdpa_backward(q.view(), k.view(), v.view(), short_dout.view(), H, H, std::nullopt, options);
    });
    CHECK_THAT(m, Contains("multi_head_sdpa_backward: dout must have the context's shape (B, Tq, num_heads*Dv) = [2,6,6]"));
    CHECK_THAT(m, Contains("dout [2,6,5]"));
    Tensor<double> nan_dout = Tensor<double>::copy_of(dout.view());
    nan_dout[7] = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_AS(multi_head_sdpa_backward(q.view(), k.view(), v.view(), nan_dout.view(), H, H, std::nullopt, options),
                    ValueError);
    CHECK_THROWS_AS(multi_head_sdpa_backward(q.view(), k.view(), v.view(), dout.view(), H, H, std::nullopt, training,
                                             MhaDropout{1.0, 3}),
                    ConfigError);
}
