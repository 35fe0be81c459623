// SdpaOptions::bias (PyTorch's float attn_mask): its contracts (dtype, broadcasting, NaN/+inf where a query reads,
// -inf blocking a key), its equivalences (a -inf bias is a false in the mask, a broadcast bias its expanded copy, bit
// for bit in both backends), and both backends within the oracle's bound (oracle/BOUNDS.md section 2c), capped too.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "error_message.hpp"
#include "oracle_check.hpp"

using namespace attn;
using Catch::Contains;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

template <class T>
Tensor<T> normal_tensor(const Shape& shape, std::mt19937_64& rng, double sd = 1.0) {
    std::normal_distribution<double> dist(0.0, sd);
    Tensor<T> t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(dist(rng));
    return t;
}

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
    return a.shape() == b.shape() &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("a bias of another dtype, a shape that does not broadcast, or NaN/+inf where a query reads is refused by name",
          "[sdpa][bias]") {
    const Tensor<float> q({2, 4}), k({3, 4}), v({3, 1});
    SdpaOptions options;
    const Tensor<double> wrong_dtype({2, 3});
    options.bias = wrong_dtype;
    std::string m = test::error_message<ConfigError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("sdpa: bias has dtype float64 but q, k and v have dtype float32") && Contains("bias [2,3]"));

    const Tensor<float> wrong_shape({3, 3});
    options.bias = wrong_shape;
    m = test::error_message<ShapeError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("sdpa: bias [3,3] does not broadcast to the scores (batch..., Tq, Tk) = [2,3]") &&
                      Contains("q [2,4], k [3,4], v [3,1], bias [3,3]"));
    const Tensor<float> too_many_dims({1, 1, 2, 3});
    options.bias = too_many_dims;
    m = test::error_message<ShapeError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("bias [1,1,2,3] has more dims than the scores [2,3]"));

    // NaN and +inf where a query reads are errors; where the mask or the causal rule blocks, nothing reads them.
    Tensor<float> bias({2, 3}, 0.0f);
    const Tensor<bool> allowed({2, 3}, {true, true, false, true, true, true});
    bias({0, 2}) = std::numeric_limits<float>::quiet_NaN();  // blocked by the mask
    options.bias = bias;
    CHECK_NOTHROW(scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options));
    bias({1, 1}) = std::numeric_limits<float>::infinity();  // read
    m = test::error_message<ValueError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options); });
    CHECK_THAT(m, Contains("sdpa: bias [2,3] holds inf at batch index [], row 1, column 1") &&
                      Contains("set options.check_finite to false to allow it"));
    options.check_finite = false;
    CHECK_NOTHROW(scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options));
    options.check_finite = true;
    options.is_causal = true;  // top-left: row 0 reads key 0 only, row 1 keys 0 and 1; (1, 1) is still read
    CHECK_THROWS_AS(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options), ValueError);
    bias({1, 1}) = 0, bias({1, 2}) = std::numeric_limits<float>::quiet_NaN();  // beyond the diagonal
    CHECK_NOTHROW(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options));
}

TEST_CASE("a row whose bias is -inf at every key it may read is an empty row", "[sdpa][bias]") {
    std::mt19937_64 rng(7001);
    const Tensor<double> q = normal_tensor<double>({3, 4}, rng), k = normal_tensor<double>({5, 4}, rng),
                         v = normal_tensor<double>({5, 2}, rng);
    Tensor<double> bias({3, 5}, 0.0);
    for (Index j = 0; j < 5; ++j) bias({1, j}) = -inf;
    SdpaOptions options;
    options.bias = bias;
    const std::string m = test::error_message<MaskError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("query row 1"));
    options.empty_rows = EmptyRowPolicy::Zero;
    options.return_weights = true;
    const auto r = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    for (Index d = 0; d < 2; ++d) CHECK(r.output({1, d}) == 0.0);
    for (Index j = 0; j < 5; ++j) CHECK((*r.weights)({1, j}) == 0.0);
    CHECK(r.output({0, 0}) != 0.0);
}

TEMPLATE_TEST_CASE("a -inf bias is a false in the mask and a broadcast bias its expanded copy, bit for bit in both backends",
                   "[sdpa][bias]", float, double, float16, bfloat16) {
    using T = TestType;
    std::mt19937_64 rng(7002 + sizeof(T));
    // Sizes past one tiled key block (64 here) and query block, so partial and whole tiles both meet the bias.
    const Index B = 2, Tq = 70, Tk = 150, D = 8;
    const Tensor<T> q = normal_tensor<T>({B, Tq, D}, rng), k = normal_tensor<T>({B, Tk, D}, rng),
                    v = normal_tensor<T>({B, Tk, D}, rng);
    Tensor<bool> allowed({B, Tq, Tk});
    std::bernoulli_distribution keep(0.7);
    for (Index x = 0; x < allowed.numel(); ++x) allowed[x] = keep(rng);
    for (Index b = 0; b < B; ++b) allowed({b, 5, 0}) = true;  // no empty row in either form
    // The bias: 0 where the mask allows, -inf where it blocks; and a finite bias to compare broadcast forms with.
    Tensor<T> blocking({B, Tq, Tk});
    for (Index x = 0; x < allowed.numel(); ++x) blocking[x] = static_cast<T>(allowed[x] ? 0.0 : -inf);
    const Tensor<T> per_key = normal_tensor<T>({Tk}, rng, 3.0);  // a key-padding-like bias, (Tk)
    Tensor<T> per_key_full({B, Tq, Tk});
    for (Index x = 0; x < per_key_full.numel(); ++x) per_key_full[x] = per_key[x % Tk];
    for (const Backend backend : {Backend::Reference, Backend::Tiled})
        for (const bool causal : {false, true}) {
            SdpaOptions options;
            options.backend = backend;
            options.is_causal = causal;
            options.alignment = CausalAlignment::BottomRight;
            options.tiled_key_block = 64;
            options.tiled_query_block = 32;
            options.empty_rows = EmptyRowPolicy::Zero;
            INFO(to_string(backend) << (causal ? ", causal" : ""));
            const auto masked = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
            options.bias = blocking;
            const auto biased = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
            CHECK(same_bits(masked.output, biased.output));
            // Both at once: the mask and the bias block the same keys.
            const auto both = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
            CHECK(same_bits(masked.output, both.output));
            options.bias = per_key.view();
            const auto broadcast = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
            options.bias = per_key_full;
            const auto expanded = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
            CHECK(same_bits(broadcast.output, expanded.output));
            CHECK_FALSE(same_bits(broadcast.output, masked.output));  // the bias did change the output
        }
}

TEMPLATE_TEST_CASE("the tiled kernel adds a bias with the same bits whichever way it reads it", "[sdpa][bias][tiled]",
                   float, double) {
    // Under check_finite the kernel transposes the bias as stored (4 x 4 blocks where the keys are contiguous) and
    // lets a blocked logit's -inf keep the bias out; without it, it gathers the allowed entries one by one. Finite
    // inputs must give the same bits both ways, whatever the bias's layout, with NaN and -inf where no query reads.
    using T = TestType;
    std::mt19937_64 rng(7102 + sizeof(T));
    const Index B = 2, Tq = 45, Tk = 133, D = 8;
    const Tensor<T> q = normal_tensor<T>({B, Tq, D}, rng), k = normal_tensor<T>({B, Tk, D}, rng),
                    v = normal_tensor<T>({B, Tk, D}, rng);
    Tensor<bool> allowed({B, Tq, Tk});
    std::bernoulli_distribution keep(0.8);
    for (Index x = 0; x < allowed.numel(); ++x) allowed[x] = keep(rng);
    Tensor<T> bias = normal_tensor<T>({B, Tq, Tk}, rng, 2.0);
    for (Index x = 0; x < bias.numel(); ++x)
        if (!allowed[x]) bias[x] = static_cast<T>(x % 2 ? -inf : std::numeric_limits<double>::quiet_NaN());
    Tensor<T> bias_t({B, Tk, Tq});  // the same bias stored key-major: a strided view (keys Tq apart)
    for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Tq; ++i)
            for (Index j = 0; j < Tk; ++j) bias_t({b, j, i}) = bias({b, i, j});
    const TensorView<const T> strided = TensorView<const T>(bias_t.view()).transpose(-2, -1);
    const Tensor<T> per_key = normal_tensor<T>({Tk}, rng, 3.0);  // broadcast over queries: row stride 0
    Tensor<T> slopes({B});  // one per batch element
    slopes[0] = static_cast<T>(0.25), slopes[1] = static_cast<T>(0.0625);
    for (const bool causal : {false, true})
        for (int layout = 0; layout < 3; ++layout)
            for (const bool alibi : {false, true}) {
                SdpaOptions options;
                options.backend = Backend::Tiled;
                options.is_causal = causal;
                options.alignment = CausalAlignment::BottomRight;
                options.tiled_key_block = 64;
                options.tiled_query_block = 32;
                options.empty_rows = EmptyRowPolicy::Zero;
                if (layout == 0) options.bias = bias;
                if (layout == 1) options.bias = strided;
                if (layout == 2) options.bias = per_key.view();
                if (alibi) options.alibi_slopes = slopes;
                INFO((causal ? "causal, " : "") << "layout " << layout << (alibi ? ", ALiBi" : ""));
                const auto checked = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
                options.check_finite = false;
                const auto unchecked = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
                CHECK(same_bits(checked.output, unchecked.output));
                for (Index x = 0; x < checked.output.numel(); ++x) REQUIRE(std::isfinite(checked.output[x]));
            }
}

TEMPLATE_TEST_CASE("with a bias, capped or not, both backends are within the oracle's bound of their models",
                   "[sdpa][bias][oracle]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(sizeof(T) == 4 ? 7101 : 7102);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    double worst[2] = {0, 0};
    // Bias kinds: standard normal, large (1e3: a row is decided by its bias, the logits ride on top of it), an
    // ALiBi-like ramp -m |i + Tk - Tq - j|, a (Tk) key bias with -inf entries, and a (Tq, 1) row bias (which
    // changes nothing exactly but is added all the same).
    const char* kinds[] = {"normal", "large", "alibi", "keys -inf", "rows"};
    int n = 0;
    for (const char* kind : kinds)
        for (const double cap : {0.0, 2.0, 50.0}) {
            const Index B = 2, Tq = n % 2 ? 129 : 33, Tk = n % 3 ? 300 : 65, Dk = 16, Dv = 5;
            ++n;
            const double value_scale = cap == 50.0 ? 4.0 : 1.0;
            const Tensor<T> q = normal_tensor<T>({B, Tq, Dk}, rng, value_scale),
                            k = normal_tensor<T>({B, Tk, Dk}, rng, value_scale), v = normal_tensor<T>({B, Tk, Dv}, rng);
            Tensor<T> bias;
            const std::string K = kind;
            if (K == "keys -inf") {
                bias = Tensor<T>({Tk});
                for (Index j = 0; j < Tk; ++j) bias[j] = static_cast<T>(j % 7 == 3 ? -inf : normal(rng));
            } else if (K == "rows") {
                bias = Tensor<T>({Tq, 1});
                for (Index i = 0; i < Tq; ++i) bias[i] = static_cast<T>(100 * normal(rng));
            } else {
                bias = Tensor<T>({B, Tq, Tk});
                for (Index b = 0; b < B; ++b)
                    for (Index i = 0; i < Tq; ++i)
                        for (Index j = 0; j < Tk; ++j) {
                            const double slope = std::ldexp(1.0, -static_cast<int>(b) - 1);
                            const double x = K == "normal"  ? normal(rng)
                                             : K == "large" ? 1e3 * (2 * unit(rng) - 1)
                                                            : -slope * std::fabs(static_cast<double>(i + Tk - Tq - j));
                            bias({b, i, j}) = static_cast<T>(x);
                        }
            }
            SdpaOptions options;
            options.bias = bias;
            options.softcap = cap;
            options.tiled_key_block = 64;  // several rescalings per row
            options.empty_rows = EmptyRowPolicy::Zero;
            INFO("bias " << kind << ", softcap " << cap << ", Tq " << Tq << ", Tk " << Tk);
            const auto tightness = test::backends_within_oracle_bounds<T>(q, k, v, std::nullopt, options);
            for (int b = 0; b < 2; ++b) worst[b] = std::max(worst[b], tightness[std::size_t(b)]);
        }
    std::cout << (sizeof(T) == 4 ? "float" : "double") << " with a bias: worst error/bound tiled " << worst[0]
              << ", reference " << worst[1] << "\n";
}

TEMPLATE_TEST_CASE("the oracle with a bias: two keys give the closed form, and the double-double path rounds as MPFR does",
                   "[oracle][bias]", float, double) {
    using T = TestType;
    // q = [a], k = [[1], [0]], v = [[1], [0]], scale 1, bias [b0, b1]: the output is the first weight,
    // 1 / (1 + e^(b1 - a - b0)).
    for (const double a : {0.3, 5.0, -40.0})
        for (const double b0 : {0.0, -2.5, 1e3})
            for (const double b1 : {0.0, 7.0, -inf}) {
                Tensor<T> q({1, 1}), k({2, 1}), v({2, 1}), bias({2});
                q[0] = static_cast<T>(a);
                k[0] = 1, k[1] = 0, v[0] = 1, v[1] = 0;
                bias[0] = static_cast<T>(b0), bias[1] = static_cast<T>(b1);
                SdpaOptions o;
                o.scale = 1.0;
                o.bias = bias;
                for (const int bits : {0, 114}) {
                    oracle::OracleOptions oo;
                    oo.bits = bits;
                    const auto r = oracle::scaled_dot_product_attention<T>(q, k, v, std::nullopt, o, oo);
                    const long double t0 = static_cast<long double>(static_cast<T>(a)) + static_cast<T>(b0);
                    const long double expected = 1 / (1 + std::exp(static_cast<long double>(static_cast<T>(b1)) - t0));
                    CAPTURE(a, b0, b1, bits);
                    CHECK(std::fabs(r.output_exact[0] + r.output_exact_lo[0] - expected) <= 1e-17L * expected);
                    CHECK(r.output[0] == static_cast<T>(expected));
                }
            }
    // Random biased rows, capped and large ones included: both paths give the same bits.
    std::mt19937_64 rng(20261203);
    for (int t = 0; t < 60; ++t) {
        const Index Tq = 3, Tk = 1 + t % 9, Dk = 1 + t % 5, Dv = 2;
        const Tensor<T> q = normal_tensor<T>({Tq, Dk}, rng, t % 3 == 0 ? 30.0 : 1.0), k = normal_tensor<T>({Tk, Dk}, rng),
                        v = normal_tensor<T>({Tk, Dv}, rng);
        const Tensor<T> bias = normal_tensor<T>({Tq, Tk}, rng, t % 4 == 0 ? 1e4 : 2.0);
        SdpaOptions o;
        o.bias = bias;
        o.softcap = t % 2 ? 3.0 : 0.0;
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

TEST_CASE("alibi_slopes gives the standard schedule, for a power of two and between them", "[sdpa][alibi]") {
    const std::vector<double> eight = alibi_slopes(8);
    REQUIRE(eight.size() == 8);
    for (int h = 1; h <= 8; ++h) CHECK(eight[std::size_t(h - 1)] == std::ldexp(1.0, -h));
    // 12 heads: the 8 of 8, then slopes 1, 3, 5, 7 of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    const std::vector<double> twelve = alibi_slopes(12);
    REQUIRE(twelve.size() == 12);
    for (int h = 0; h < 8; ++h) CHECK(twelve[std::size_t(h)] == eight[std::size_t(h)]);
    for (int h = 0; h < 4; ++h) CHECK(twelve[std::size_t(8 + h)] == Approx(std::exp2(-0.5 - h)).epsilon(1e-15));
    CHECK(alibi_slopes(1) == std::vector<double>{1.0 / 256});
    CHECK(alibi_slopes(0).empty());
}

TEMPLATE_TEST_CASE("ALiBi gives bitwise the output of the explicit bias -slope |i + Tk - Tq - j| it describes",
                   "[sdpa][alibi]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(7201 + sizeof(T));
    const Index B = 2, H = 3, Tq = 40, Tk = 150, D = 8;
    const Tensor<T> q = normal_tensor<T>({B, H, Tq, D}, rng), k = normal_tensor<T>({B, H, Tk, D}, rng),
                    v = normal_tensor<T>({B, H, Tk, D}, rng);
    const std::vector<double> standard = alibi_slopes(H);
    Tensor<T> per_head({H}), per_batch_head({B, H});
    for (Index h = 0; h < H; ++h) per_head[h] = static_cast<T>(standard[std::size_t(h)]);
    for (Index x = 0; x < B * H; ++x) per_batch_head[x] = static_cast<T>(0.1 * static_cast<double>(x + 1));
    for (const Tensor<T>* slopes : {&per_head, &per_batch_head}) {
        // The bias written out: the product -m d rounded to T once, as the kernels form it.
        Tensor<T> bias({B, H, Tq, Tk});
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h) {
                const T m = slopes->rank() == 1 ? (*slopes)[h] : (*slopes)[b * H + h];
                for (Index i = 0; i < Tq; ++i)
                    for (Index j = 0; j < Tk; ++j)
                        bias({b, h, i, j}) = -m * static_cast<T>(std::abs(i + Tk - Tq - j));
            }
        for (const Backend backend : {Backend::Reference, Backend::Tiled})
            for (const bool causal : {false, true}) {
                SdpaOptions options;
                options.backend = backend;
                options.is_causal = causal;
                options.alignment = CausalAlignment::BottomRight;
                options.tiled_key_block = 64;
                INFO(to_string(backend) << (causal ? ", causal" : "") << ", slopes " << to_string(slopes->shape()));
                options.alibi_slopes = *slopes;
                const auto alibi = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
                options.alibi_slopes.reset();
                options.bias = bias;
                const auto explicit_bias = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
                CHECK(same_bits(alibi.output, explicit_bias.output));
                options.bias.reset();
                const auto plain = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
                CHECK_FALSE(same_bits(alibi.output, plain.output));
            }
    }
}

TEMPLATE_TEST_CASE("ALiBi with a bias and a cap: both backends are within the oracle's bound of their models",
                   "[sdpa][alibi][oracle]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(sizeof(T) == 4 ? 7301 : 7302);
    double worst[2] = {0, 0};
    for (const double cap : {0.0, 5.0})
        for (const bool with_bias : {false, true})
            for (const double slope_scale : {1.0, 30.0}) {  // standard slopes, and steep ones (one key dominates)
                const Index B = 2, H = 4, Tq = 33, Tk = 200, Dk = 16, Dv = 5;
                const Tensor<T> q = normal_tensor<T>({B, H, Tq, Dk}, rng), k = normal_tensor<T>({B, H, Tk, Dk}, rng),
                                v = normal_tensor<T>({B, H, Tk, Dv}, rng);
                Tensor<T> slopes({H});
                const std::vector<double> standard = alibi_slopes(H);
                for (Index h = 0; h < H; ++h) slopes[h] = static_cast<T>(slope_scale * standard[std::size_t(h)]);
                const Tensor<T> bias = normal_tensor<T>({Tq, Tk}, rng, 3.0);
                SdpaOptions options;
                options.alibi_slopes = slopes;
                if (with_bias) options.bias = bias;
                options.softcap = cap;
                options.tiled_key_block = 64;
                INFO("softcap " << cap << (with_bias ? ", with a bias" : "") << ", slopes x" << slope_scale);
                const auto tightness = test::backends_within_oracle_bounds<T>(q, k, v, std::nullopt, options);
                for (int b = 0; b < 2; ++b) worst[b] = std::max(worst[b], tightness[std::size_t(b)]);
            }
    std::cout << (sizeof(T) == 4 ? "float" : "double") << " with ALiBi: worst error/bound tiled " << worst[0]
              << ", reference " << worst[1] << "\n";
}

TEST_CASE("ALiBi slopes of another dtype, a shape that does not broadcast, NaN or an overflowing slope are refused",
          "[sdpa][alibi]") {
    const Tensor<float> q({2, 3, 4}), k({2, 5, 4}), v({2, 5, 1});  // batch shape (2)
    SdpaOptions options;
    const Tensor<double> wrong_dtype({2});
    options.alibi_slopes = wrong_dtype;
    std::string m = test::error_message<ConfigError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("sdpa: alibi_slopes has dtype float64 but q, k and v have dtype float32"));
    const Tensor<float> three({3});
    options.alibi_slopes = three;
    m = test::error_message<ShapeError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("sdpa: alibi_slopes [3] does not broadcast to the batch shape [2]") &&
                      Contains("alibi_slopes [3])"));
    Tensor<float> bad({2}, 0.5f);
    bad[1] = std::numeric_limits<float>::quiet_NaN();
    options.alibi_slopes = bad;
    m = test::error_message<ValueError>(
        [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("alibi_slopes [2] holds nan at batch index [1]"));
    options.check_finite = false;  // the slopes are checked whatever check_finite says
    CHECK_THROWS_AS(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options), ValueError);
    bad[1] = 1e38f;  // times a distance of 4: beyond float
    CHECK_THROWS_AS(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options), ValueError);
    bad[1] = 1e37f;
    CHECK_NOTHROW(scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options));
}
