// MultiHeadAttention on 16-bit storage: each projection is formed in float32 and rounded to the storage type once,
// the heads are the 16-bit SDPA on the rounded projections, the output projection rounds once more.
//
// The inputs and q, k, v weights are small dyadic numbers, so the float32 projections are exact and the projected
// q, k, v are known exactly (the exact value, rounded once); the context and the weights must then be bitwise the
// 16-bit SDPA on them. The output projection's inputs are arbitrary 16-bit contexts, so it is checked against its
// exact value (double) within the float32 dot-product bound plus one rounding to the storage type:
//   |out - y| <= u_S |y| + (1 + u_S) gamma_{E+1} (sum_j |c_j w_j| + |b|),  gamma_n = n u / (1 - n u), u = 2^-24
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1; one more term for the bias).
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

// Integers in [-4, 4] times 2^-e: at most 3 significant bits, exact in every storage type.
template <class S>
Tensor<S> dyadic(const Shape& shape, std::mt19937_64& rng, int e) {
    std::uniform_int_distribution<int> dist(-4, 4);
    Tensor<S> t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = S(std::ldexp(dist(rng), -e));
    return t;
}

// y (B, T, out) = x (B, T, in) @ w^T + b, exactly (double holds every sum here) and then rounded to S once.
template <class S>
Tensor<S> exact_projection_rounded(const Tensor<S>& x, const Tensor<S>& w, const Tensor<S>& b) {
    const Index B = x.dim(0), T = x.dim(1), in = x.dim(2), out = w.dim(0);
    Tensor<S> y({B, T, out});
    for (Index bt = 0; bt < B * T; ++bt)
        for (Index o = 0; o < out; ++o) {
            double s = b.numel() ? static_cast<double>(b[o]) : 0.0;
            for (Index i = 0; i < in; ++i) s += static_cast<double>(x[bt * in + i]) * static_cast<double>(w[o * in + i]);
            REQUIRE(static_cast<double>(static_cast<float>(s)) == s);  // the float32 projection is this exact value
            y[bt * out + o] = S(s);
        }
    return y;
}

// (B, T, H*D) -> the (B, H, T, D) view of its heads.
template <class S>
TensorView<const S> heads(const Tensor<S>& t, Index H) {
    const Index B = t.dim(0), T = t.dim(1), D = t.dim(2) / H;
    return TensorView<const S>(t.data(), {B, H, T, D}, {T * H * D, D, H * D, 1});
}

template <class S>
bool same_bits(const S* a, const S* b, Index n) {
    return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(S)) == 0;
}

}  // namespace

TEMPLATE_TEST_CASE("16-bit MultiHeadAttention rounds each projection and the attention once", "[mha][half]", float16,
                   bfloat16) {
    using S = TestType;
    std::mt19937_64 rng(20261202);
    const Index B = 2, Tq = 5, Tk = 7, E = 16, H = 2;
    MhaConfig config;
    config.embed_dim = E;
    config.num_heads = H;
    MultiHeadAttention<S> mha(config);
    mha.set_q_proj_weight(dyadic<S>({E, E}, rng, 3).view());
    mha.set_k_proj_weight(dyadic<S>({E, E}, rng, 3).view());
    mha.set_v_proj_weight(dyadic<S>({E, E}, rng, 3).view());
    mha.set_q_proj_bias(dyadic<S>({E}, rng, 2).view());
    mha.set_k_proj_bias(dyadic<S>({E}, rng, 2).view());
    mha.set_v_proj_bias(dyadic<S>({E}, rng, 2).view());
    // The output projection's weights are any 16-bit values (the Xavier initialisation, rounded), its bias too.
    std::uniform_real_distribution<double> unit(-1.0, 1.0);
    Tensor<S> out_bias({E});
    for (Index i = 0; i < E; ++i) out_bias[i] = S(unit(rng));
    mha.set_out_proj_bias(out_bias.view());

    const Tensor<S> x = dyadic<S>({B, Tq, E}, rng, 2);
    const Tensor<S> memory = dyadic<S>({B, Tk, E}, rng, 2);
    const auto own = [](TensorView<const S> v) { return Tensor<S>::copy_of(v); };
    const Tensor<S> q = exact_projection_rounded(x, own(mha.q_proj_weight()), own(mha.q_proj_bias()));
    const Tensor<S> k = exact_projection_rounded(memory, own(mha.k_proj_weight()), own(mha.k_proj_bias()));
    const Tensor<S> v = exact_projection_rounded(memory, own(mha.v_proj_weight()), own(mha.v_proj_bias()));

    for (const Backend backend : {Backend::Reference, Backend::Tiled})
        for (const bool causal : {false, true}) {
            INFO("backend " << (backend == Backend::Tiled ? "tiled" : "reference") << ", causal " << causal);
            MhaOptions options;
            options.backend = backend;
            options.is_causal = causal;
            options.alignment = CausalAlignment::BottomRight;  // Tq <= Tk: every row has a key
            const bool weights = backend == Backend::Reference;  // tiled never forms them
            options.weights = weights ? MhaWeights::PerHead : MhaWeights::None;
            const MhaResult<S> r = mha.forward_cross(x.view(), memory.view(), std::nullopt, options);

            SdpaOptions sdpa;
            sdpa.backend = backend;
            sdpa.is_causal = causal;
            sdpa.alignment = CausalAlignment::BottomRight;
            sdpa.return_weights = weights;
            const SdpaResult<S> att = scaled_dot_product_attention(heads(q, H), heads(k, H), heads(v, H), std::nullopt, sdpa);
            if (weights) {
                REQUIRE(r.weights);
                CHECK(r.weights->shape() == Shape{B, H, Tq, Tk});
                CHECK(same_bits(r.weights->data(), att.weights->data(), att.weights->numel()));
            }

            // The context (B, Tq, E) from the heads, then the output projection against its bound.
            const Index Dh = E / H;
            const Tensor<S> w_out = own(mha.out_proj_weight());
            const double u = std::ldexp(1.0, -24), u_s = std::numeric_limits<S>::epsilon() / 2.0;
            const double gamma = (E + 1) * u / (1 - (E + 1) * u);
            Index over = 0;
            for (Index b = 0; b < B; ++b)
                for (Index i = 0; i < Tq; ++i)
                    for (Index o = 0; o < E; ++o) {
                        double y = static_cast<double>(out_bias[o]), magnitude = std::fabs(y);
                        for (Index c = 0; c < E; ++c) {
                            const Index h = c / Dh, d = c % Dh;
                            const double ctx = static_cast<double>(att.output[((b * H + h) * Tq + i) * Dh + d]);
                            y += ctx * static_cast<double>(w_out[o * E + c]);
                            magnitude += std::fabs(ctx * static_cast<double>(w_out[o * E + c]));
                        }
                        const double got = static_cast<double>(r.output[(b * Tq + i) * E + o]);
                        if (!(std::fabs(got - y) <= u_s * std::fabs(y) + (1 + u_s) * gamma * magnitude)) ++over;
                    }
            CHECK(over == 0);
            if (!weights) continue;

            // The head average: the per-head weights summed in float32, divided by H, rounded once.
            options.weights = MhaWeights::HeadAverage;
            const MhaResult<S> avg = mha.forward_cross(x.view(), memory.view(), std::nullopt, options);
            REQUIRE(avg.weights);
            Index mismatched = 0;
            for (Index b = 0; b < B; ++b)
                for (Index f = 0; f < Tq * Tk; ++f) {
                    float sum = 0;
                    for (Index h = 0; h < H; ++h) sum += static_cast<float>(att.weights->data()[(b * H + h) * Tq * Tk + f]);
                    const S expected(sum / static_cast<float>(H));
                    if (!same_bits(&expected, avg.weights->data() + b * Tq * Tk + f, 1)) ++mismatched;
                }
            CHECK(mismatched == 0);
            CHECK(same_bits(avg.output.data(), r.output.data(), r.output.numel()));  // the weights change nothing
        }
}

TEST_CASE("16-bit MultiHeadAttention reports an output that overflows the storage type", "[mha][half][errors]") {
    // float16's largest finite value is 65504: values 2^8 through an identity-like projection of width 16 with
    // weights 2^4 give 2^8 * 2^4 * 16 = 2^16 in float32, which float16 cannot hold.
    MhaConfig config;
    config.embed_dim = 16;
    config.num_heads = 1;
    config.bias = false;
    MultiHeadAttention<float16> mha(config);
    Tensor<float16> big({16, 16});
    for (Index i = 0; i < big.numel(); ++i) big[i] = float16(16.0);
    mha.set_q_proj_weight(big.view());
    mha.set_k_proj_weight(big.view());
    mha.set_v_proj_weight(big.view());
    mha.set_out_proj_weight(big.view());
    Tensor<float16> x({1, 2, 16});
    for (Index i = 0; i < x.numel(); ++i) x[i] = float16(256.0);
    CHECK_THROWS_WITH(mha.forward_self(x.view()),
                      Contains("MultiHeadAttention::forward_self") && Contains("q (projected)") &&
                          Contains("the projection overflowed"));
}
