// SDPA on 16-bit storage: both backends compute in float32 from the exactly converted inputs and round once, so each
// is bitwise its float32 run on the same values with the result rounded; masks, empty rows, NaN contracts and
// errors as for float.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "attn/attn.hpp"
#include "error_message.hpp"

using namespace attn;
using Catch::Contains;

namespace {

// Values exactly representable in H, as H and as float.
template <class H>
std::pair<Tensor<H>, Tensor<float>> random_pair(const Shape& shape, std::mt19937_64& rng, double lo = -3.0,
                                                double hi = 3.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Tensor<H> h(shape);
    Tensor<float> f(shape);
    for (Index i = 0; i < h.numel(); ++i) {
        h[i] = H(dist(rng));
        f[i] = h[i];
    }
    return {std::move(h), std::move(f)};
}

template <class H>
Tensor<H> rounded(const Tensor<float>& f) {
    Tensor<H> h(f.shape());
    for (Index i = 0; i < f.numel(); ++i) h[i] = H(f[i]);
    return h;
}

template <class H>
bool same_bits(const Tensor<H>& a, const Tensor<H>& b) {
    return a.shape() == b.shape() &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(H)) == 0;
}

}  // namespace

TEMPLATE_TEST_CASE("16-bit SDPA is the float32 kernel on the same values, rounded once", "[sdpa][half]", float16,
                   bfloat16) {
    std::mt19937_64 rng(20261202);
    struct Shapes {
        Index B, H, Tq, Tk, Dk, Dv;
    };
    // Sizes past the tiled kernel's blocks (and not multiples of them) as well as single rows.
    for (const Shapes s : {Shapes{1, 1, 1, 1, 1, 1}, Shapes{2, 3, 7, 9, 16, 8}, Shapes{1, 2, 130, 300, 64, 64},
                           Shapes{1, 1, 33, 517, 24, 40}}) {
        auto [qh, qf] = random_pair<TestType>({s.B, s.H, s.Tq, s.Dk}, rng);
        auto [kh, kf] = random_pair<TestType>({s.B, s.H, s.Tk, s.Dk}, rng);
        auto [vh, vf] = random_pair<TestType>({s.B, s.H, s.Tk, s.Dv}, rng);
        for (const bool causal : {false, true})
            for (const Backend backend : {Backend::Reference, Backend::Tiled}) {
                INFO("B=" << s.B << " H=" << s.H << " Tq=" << s.Tq << " Tk=" << s.Tk << " causal=" << causal
                          << " backend=" << to_string(backend));
                SdpaOptions options;
                options.backend = backend;
                options.is_causal = causal;
                options.alignment = CausalAlignment::BottomRight;
                options.empty_rows = EmptyRowPolicy::Zero;
                options.return_weights = backend == Backend::Reference;
                const auto h = scaled_dot_product_attention(qh.view(), kh.view(), vh.view(), std::nullopt, options);
                const auto f = scaled_dot_product_attention(qf.view(), kf.view(), vf.view(), std::nullopt, options);
                CHECK(same_bits(h.output, rounded<TestType>(f.output)));
                REQUIRE(h.weights.has_value() == options.return_weights);
                if (h.weights) CHECK(same_bits(*h.weights, rounded<TestType>(*f.weights)));
                // Small tiled blocks: the online softmax between blocks, in float, the same way.
                if (backend == Backend::Tiled) {
                    options.tiled_query_block = 8;
                    options.tiled_key_block = 16;
                    const auto hs = scaled_dot_product_attention(qh.view(), kh.view(), vh.view(), std::nullopt, options);
                    const auto fs = scaled_dot_product_attention(qf.view(), kf.view(), vf.view(), std::nullopt, options);
                    CHECK(same_bits(hs.output, rounded<TestType>(fs.output)));
                }
            }
    }
}

TEMPLATE_TEST_CASE("16-bit SDPA keeps the contracts: masks, empty rows, unread NaN, errors", "[sdpa][half]", float16,
                   bfloat16) {
    std::mt19937_64 rng(7);
    auto [q, qf] = random_pair<TestType>({2, 4, 5}, rng);
    auto [k, kf] = random_pair<TestType>({2, 6, 5}, rng);
    auto [v, vf] = random_pair<TestType>({2, 6, 3}, rng);
    Tensor<bool> mask({4, 6}, true);
    for (Index j = 0; j < 6; ++j) mask({1, j}) = false;  // row 1 reads nothing
    mask({0, 5}) = false;                                // key 5 is read by rows 2 and 3 only
    for (const Backend backend : {Backend::Reference, Backend::Tiled}) {
        SdpaOptions options;
        options.backend = backend;
        // Throw: the empty row is named.
        const std::string m = test::error_message<MaskError>(
            [&] { (void)scaled_dot_product_attention(q.view(), k.view(), v.view(), mask.view(), options); });
        CHECK_THAT(m, Contains("query row 1"));
        for (const EmptyRowPolicy policy : {EmptyRowPolicy::Zero, EmptyRowPolicy::Nan}) {
            options.empty_rows = policy;
            const auto r = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask.view(), options);
            for (Index b = 0; b < 2; ++b)
                for (Index d = 0; d < 3; ++d) {
                    const float x = r.output({b, 1, d});
                    CHECK((policy == EmptyRowPolicy::Zero ? x == 0.0f : std::isnan(x)));
                    CHECK(std::isfinite(static_cast<float>(r.output({b, 0, d}))));
                }
        }
        // A NaN in a value row nobody may read changes nothing; one that is read is a ValueError naming v.
        options.empty_rows = EmptyRowPolicy::Zero;
        Tensor<bool> no_key5({4, 6}, true);
        for (Index i = 0; i < 4; ++i) no_key5({i, 5}) = false;
        const auto clean = scaled_dot_product_attention(q.view(), k.view(), v.view(), no_key5.view(), options);
        Tensor<TestType> v_nan = v;
        v_nan({0, 5, 1}) = std::numeric_limits<TestType>::quiet_NaN();
        const auto dirty = scaled_dot_product_attention(q.view(), k.view(), v_nan.view(), no_key5.view(), options);
        CHECK(same_bits(clean.output, dirty.output));
        const std::string e = test::error_message<ValueError>(
            [&] { (void)scaled_dot_product_attention(q.view(), k.view(), v_nan.view(), std::nullopt, options); });
        CHECK_THAT(e, Contains("sdpa") && Contains("v [2,6,3]") && Contains("nan"));
    }
    // Shapes are checked as for float, with the same words.
    Tensor<TestType> bad_k({2, 6, 4});
    const std::string s = test::error_message<ShapeError>(
        [&] { (void)scaled_dot_product_attention(q.view(), bad_k.view(), v.view()); });
    CHECK_THAT(s, Contains("sdpa") && Contains("k [2,6,4]"));
}

TEST_CASE("a scale below float16's range is fine: the scale multiplies in float32", "[sdpa][half]") {
    Tensor<float16> q({1, 2, 2}, float16(1.0)), k({1, 3, 2}, float16(0.5)), v({1, 3, 2}, float16(2.0));
    SdpaOptions options;
    options.scale = 1e-6;  // below float16's smallest normal, a normal float
    const auto r = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    CHECK(static_cast<float>(r.output({0, 0, 0})) == 2.0f);
}
