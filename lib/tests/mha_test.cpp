// MultiHeadAttention: the course module's example, head split, GQA, cross-attention, mask conventions, dropout,
// contracts, every error path, and random shapes against a long-double implementation with a derived bound.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "attn/attn.hpp"
#include "attn/detail/mha_sdpa_path.hpp"
#include "mha_reference.hpp"

using namespace attn;
using attn::detail::mha_sdpa_path;  // test glue, internal
using attn::testing::LD;

namespace {

// Test RNG: mt19937_64 with a fixed seed per test case, so every run sees the same data.
template <class T>
Tensor<T> random_tensor(Shape shape, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Tensor<T> t(std::move(shape));
    for (Index f = 0; f < t.numel(); ++f) t[f] = static_cast<T>(dist(rng));
    return t;
}

Tensor<bool> random_mask(Shape shape, std::mt19937_64& rng, double p_allowed = 0.7) {
    std::bernoulli_distribution dist(p_allowed);
    Tensor<bool> t(std::move(shape));
    for (Index f = 0; f < t.numel(); ++f) t[f] = dist(rng);
    return t;
}

template <class T>
void set_random_biases(MultiHeadAttention<T>& m, std::mt19937_64& rng) {
    if (!m.has_bias()) return;
    const Index kv = m.num_kv_heads() * m.head_dim();
    m.set_q_proj_bias(random_tensor<T>({m.embed_dim()}, rng));
    m.set_k_proj_bias(random_tensor<T>({kv}, rng));
    m.set_v_proj_bias(random_tensor<T>({kv}, rng));
    m.set_out_proj_bias(random_tensor<T>({m.embed_dim()}, rng));
}

template <class T>
testing::RefInputs ref_inputs(const Tensor<T>& xq, const Tensor<T>& xk, const Tensor<T>& xv, std::vector<char> allowed) {
    testing::RefInputs in;
    in.B = xq.dim(0), in.Tq = xq.dim(1), in.Tk = xk.dim(1);
    in.xq = testing::to_ld<T>(xq.view()), in.xk = testing::to_ld<T>(xk.view()), in.xv = testing::to_ld<T>(xv.view());
    in.allowed = std::move(allowed);
    return in;
}

template <class T>
bool bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
    if (a.shape() != b.shape()) return false;
    for (Index f = 0; f < a.numel(); ++f)
        if (!(a[f] == b[f] || (std::isnan(a[f]) && std::isnan(b[f])))) return false;
    return true;
}

// Whether every diagonal weight (b, h, i, i) of (B, H, T, T) weights is nonzero: a causal mask must keep the diagonal.
template <class T>
bool diagonal_visible(const Tensor<T>& weights) {
    const Index B = weights.dim(0), H = weights.dim(1), Tn = weights.dim(2);
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tn; ++i)
                if (!(weights({b, h, i, i}) > 0)) return false;
    return true;
}

template <class F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

MhaConfig config(Index E, Index H, std::optional<Index> G = std::nullopt, std::uint64_t seed = 1) {
    MhaConfig c;
    c.embed_dim = E, c.num_heads = H, c.num_kv_heads = G, c.init_seed = seed;
    return c;
}

}  // namespace

TEST_CASE("the course module's Part 5 example: causal, B=2, T=5, d_model=32, H=4", "[mha][example]") {
    std::mt19937_64 rng(7);
    const MultiHeadAttention<float> mha(config(32, 4));
    const Tensor<float> x = random_tensor<float>({2, 5, 32}, rng);
    const Tensor<bool> causal = causal_allowed_mask(5, 5, CausalAlignment::TopLeft);  // (T, T)
    MhaOptions options;
    options.weights = MhaWeights::PerHead;
    const auto r = mha.forward_self(x, causal.view(), options);
    REQUIRE(r.output.shape() == Shape{2, 5, 32});
    REQUIRE(r.weights->shape() == Shape{2, 4, 5, 5});
    for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 4; ++h)
            for (Index i = 0; i < 5; ++i)
                for (Index j = i + 1; j < 5; ++j) REQUIRE((*r.weights)({b, h, i, j}) == 0.0f);
    CHECK(diagonal_visible(*r.weights));
    // And the values, against the long-double module within the derived bound.
    const auto ref = testing::ref_mha(testing::ref_module(mha),
                                      ref_inputs(x, x, x, testing::expand_allowed(causal.view(), 2, 4, 5, 5, false, {})),
                                      testing::comparison_unit_roundoff<float>());
    const LD out_ratio = testing::max_error_ratio(r.output.data(), ref.output, ref.output_bound);
    const LD w_ratio = testing::max_error_ratio(r.weights->data(), ref.weights, ref.weights_bound);
    std::printf("mha Part 5 example (float): max error/bound output %.3Lg, weights %.3Lg\n", out_ratio, w_ratio);
    CHECK(out_ratio <= 1);
    CHECK(w_ratio <= 1);
}

TEST_CASE("multi-head attention equals H separate single-head attentions on column slices, concatenated, projected",
          "[mha][heads]") {
    std::mt19937_64 rng(11);
    const Index B = 2, Tn = 6, E = 24, H = 4, Dh = E / H;
    MhaConfig c = config(E, H);
    MultiHeadAttention<double> mha(c);
    set_random_biases(mha, rng);
    const Tensor<double> x = random_tensor<double>({B, Tn, E}, rng);
    const auto r = mha.forward_self(x);

    // Independent path: each head on its own with the 3-D SDPA, on the head's output-feature rows of the weights.
    const auto project_rows = [&](TensorView<const double> W, TensorView<const double> bias, Index row0, Index rows) {
        Tensor<double> y({B, Tn, rows});  // (B, T, rows) = x (B, T, E) @ W[row0:row0+rows, :]^T + bias
        for (Index b = 0; b < B; ++b)
            for (Index t = 0; t < Tn; ++t)
                for (Index c2 = 0; c2 < rows; ++c2) {
                    double s = bias({row0 + c2});
                    for (Index i = 0; i < E; ++i) s += x({b, t, i}) * W({row0 + c2, i});
                    y({b, t, c2}) = s;
                }
        return y;
    };
    Tensor<double> concat({B, Tn, E});
    for (Index h = 0; h < H; ++h) {
        const auto qh = project_rows(mha.q_proj_weight(), mha.q_proj_bias(), h * Dh, Dh);  // (B, T, Dh)
        const auto kh = project_rows(mha.k_proj_weight(), mha.k_proj_bias(), h * Dh, Dh);
        const auto vh = project_rows(mha.v_proj_weight(), mha.v_proj_bias(), h * Dh, Dh);
        const auto oh = scaled_dot_product_attention(qh.view(), kh.view(), vh.view()).output;  // (B, T, Dh)
        for (Index b = 0; b < B; ++b)
            for (Index t = 0; t < Tn; ++t)
                for (Index d = 0; d < Dh; ++d) concat({b, t, h * Dh + d}) = oh({b, t, d});
    }
    Tensor<double> separate({B, Tn, E});  // (B, T, E) = concat @ Wo^T + bo
    for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < Tn; ++t)
            for (Index e = 0; e < E; ++e) {
                double s = mha.out_proj_bias()({e});
                for (Index i = 0; i < E; ++i) s += concat({b, t, i}) * mha.out_proj_weight()({e, i});
                separate({b, t, e}) = s;
            }
    // Both are double implementations of the same formula, each within the derived bound of the exact value.
    const auto ref = testing::ref_mha(testing::ref_module(mha),
                                      ref_inputs(x, x, x, testing::expand_allowed(std::nullopt, B, H, Tn, Tn, false, {})),
                                      testing::comparison_unit_roundoff<double>());
    LD worst = 0;
    for (Index f = 0; f < r.output.numel(); ++f)
        worst = std::max(worst, std::fabs(static_cast<LD>(r.output[f]) - separate[f]) / (2 * ref.output_bound[f]));
    std::printf("mha head split vs separate heads (double): max |diff| / (2 bound) = %.3Lg\n", worst);
    CHECK(worst <= 1);
}

TEST_CASE("changing num_heads at fixed embed_dim keeps the parameter count and sets head_dim = E / H", "[mha][params]") {
    for (const Index H : {1, 2, 4, 8, 16, 32}) {
        const MultiHeadAttention<float> with_bias(config(32, H));
        CHECK(with_bias.parameter_count() == 4 * 32 * 32 + 4 * 32);
        CHECK(with_bias.head_dim() == 32 / H);
        MhaConfig c = config(32, H);
        c.bias = false;
        CHECK(MultiHeadAttention<float>(c).parameter_count() == 4 * 32 * 32);
    }
    MhaConfig cross = config(16, 4);
    cross.kdim = 10, cross.vdim = 6;
    CHECK(MultiHeadAttention<double>(cross).parameter_count() == 2 * 16 * 16 + 16 * 10 + 16 * 6 + 4 * 16);
    MhaConfig gqa = config(16, 4, 2);  // k, v project to G*Dh = 8
    CHECK(MultiHeadAttention<double>(gqa).parameter_count() == 2 * 16 * 16 + 2 * 8 * 16 + 2 * 16 + 2 * 8);
}

TEST_CASE("initialisation is Xavier-uniform from the seed, deterministic, biases zero", "[mha][params]") {
    const MultiHeadAttention<double> a(config(16, 4, std::nullopt, 5)), b(config(16, 4, std::nullopt, 5)),
        other(config(16, 4, std::nullopt, 6));
    const auto eq = [](TensorView<const double> x, TensorView<const double> y) {
        return bitwise_equal(Tensor<double>::copy_of(x), Tensor<double>::copy_of(y));
    };
    CHECK(eq(a.q_proj_weight(), b.q_proj_weight()));
    CHECK(eq(a.out_proj_weight(), b.out_proj_weight()));
    CHECK_FALSE(eq(a.q_proj_weight(), other.q_proj_weight()));
    const double packed = std::sqrt(6.0 / (16 + 48)), linear = 1.0 / std::sqrt(16.0);
    double max_in = 0, max_out = 0;
    for (const auto& w : {a.q_proj_weight(), a.k_proj_weight(), a.v_proj_weight()})
        for (Index f = 0; f < w.numel(); ++f) max_in = std::max(max_in, std::fabs(w.data()[f]));
    for (Index f = 0; f < a.out_proj_weight().numel(); ++f) max_out = std::max(max_out, std::fabs(a.out_proj_weight().data()[f]));
    CHECK(max_in <= packed);
    CHECK(max_in > 0.9 * packed);  // 768 uniform draws: P(all below 0.9 a) = 0.9^768 < 1e-35
    CHECK(max_out <= linear);
    for (const auto& bias : {a.q_proj_bias(), a.k_proj_bias(), a.v_proj_bias(), a.out_proj_bias()})
        for (Index f = 0; f < bias.numel(); ++f) CHECK(bias.data()[f] == 0.0);
}

TEST_CASE("grouped-query attention: query head h reads kv head h / (H/G); equals MHA with K/V projections repeated",
          "[mha][gqa]") {
    std::mt19937_64 rng(13);
    const Index B = 2, Tn = 5, E = 16, H = 8, Dh = 2;
    for (const Index G : {4, 2, 1}) {
        CAPTURE(G);
        MultiHeadAttention<double> gqa(config(E, H, G, 3));
        set_random_biases(gqa, rng);
        // The same module with G = H: kv head h of the full module is kv head h / (H/G) of the grouped one.
        MultiHeadAttention<double> full(config(E, H, H, 4));
        full.set_q_proj_weight(gqa.q_proj_weight()), full.set_out_proj_weight(gqa.out_proj_weight());
        full.set_q_proj_bias(gqa.q_proj_bias()), full.set_out_proj_bias(gqa.out_proj_bias());
        Tensor<double> wk({E, E}), wv({E, E}), bk({E}), bv({E});
        for (Index h = 0; h < H; ++h)
            for (Index d = 0; d < Dh; ++d) {
                const Index src = (h / (H / G)) * Dh + d;
                for (Index i = 0; i < E; ++i) {
                    wk({h * Dh + d, i}) = gqa.k_proj_weight()({src, i});
                    wv({h * Dh + d, i}) = gqa.v_proj_weight()({src, i});
                }
                bk({h * Dh + d}) = gqa.k_proj_bias()({src});
                bv({h * Dh + d}) = gqa.v_proj_bias()({src});
            }
        full.set_k_proj_weight(wk), full.set_v_proj_weight(wv), full.set_k_proj_bias(bk), full.set_v_proj_bias(bv);
        const Tensor<double> x = random_tensor<double>({B, Tn, E}, rng);
        MhaOptions options;
        options.weights = MhaWeights::PerHead;
        options.is_causal = true;
        const auto a = gqa.forward_self(x, std::nullopt, options), b = full.forward_self(x, std::nullopt, options);
        const auto ref = testing::ref_mha(testing::ref_module(full),
                                          ref_inputs(x, x, x, testing::expand_allowed(std::nullopt, B, H, Tn, Tn, true, {})),
                                          testing::comparison_unit_roundoff<double>());
        LD worst = 0;
        for (Index f = 0; f < a.output.numel(); ++f)
            worst = std::max(worst, std::fabs(static_cast<LD>(a.output[f]) - b.output[f]) / (2 * ref.output_bound[f]));
        std::printf("mha GQA G=%lld vs repeated K/V (double): max |diff| / (2 bound) = %.3Lg\n", static_cast<long long>(G),
                    worst);
        CHECK(worst <= 1);
    }
    SECTION("the head mapping itself: kv head g carries the constant value g") {
        const Index G = 2;
        MhaConfig c = config(E, H, G);
        MultiHeadAttention<double> m(c);
        // v = bias only: every value row of kv head g is g; out_proj = identity, so output column h*Dh+d is the value
        // head h read (weights sum to 1).
        m.set_v_proj_weight(Tensor<double>({G * Dh, E}, 0.0));
        Tensor<double> bv({G * Dh});
        for (Index g = 0; g < G; ++g)
            for (Index d = 0; d < Dh; ++d) bv({g * Dh + d}) = static_cast<double>(g);
        m.set_v_proj_bias(bv);
        Tensor<double> eye({E, E}, 0.0);
        for (Index i = 0; i < E; ++i) eye({i, i}) = 1.0;
        m.set_out_proj_weight(eye);
        const Tensor<double> x = random_tensor<double>({1, 3, E}, rng);
        const auto r = m.forward_self(x);
        for (Index h = 0; h < H; ++h)
            for (Index t = 0; t < 3; ++t) CHECK(r.output({0, t, h * Dh}) == Approx(static_cast<double>(h / (H / G))).margin(1e-12));
    }
}

TEST_CASE("cross-attention with T_target=4, T_source=7 and kdim != vdim != embed_dim", "[mha][cross]") {
    std::mt19937_64 rng(17);
    MhaConfig c = config(12, 3);
    c.kdim = 10, c.vdim = 6;
    MultiHeadAttention<float> mha(c);
    set_random_biases(mha, rng);
    const Tensor<float> target = random_tensor<float>({2, 4, 12}, rng), keys = random_tensor<float>({2, 7, 10}, rng),
                        values = random_tensor<float>({2, 7, 6}, rng);
    MhaOptions options;
    options.weights = MhaWeights::PerHead;
    const auto r = mha.forward(target, keys, values, std::nullopt, options);
    REQUIRE(r.output.shape() == Shape{2, 4, 12});
    REQUIRE(r.weights->shape() == Shape{2, 3, 4, 7});
    const auto ref = testing::ref_mha(testing::ref_module(mha),
                                      ref_inputs(target, keys, values, testing::expand_allowed(std::nullopt, 2, 3, 4, 7, false, {})),
                                      testing::comparison_unit_roundoff<float>());
    const LD ratio = testing::max_error_ratio(r.output.data(), ref.output, ref.output_bound);
    std::printf("mha cross-attention (float): max error/bound %.3Lg\n", ratio);
    CHECK(ratio <= 1);
    // forward_cross reads keys and values from one memory (kdim == vdim).
    MhaConfig same = config(12, 3);
    same.kdim = 9, same.vdim = 9;
    const MultiHeadAttention<float> m2(same);
    const Tensor<float> memory = random_tensor<float>({2, 7, 9}, rng);
    CHECK(bitwise_equal(m2.forward_cross(target, memory).output, m2.forward(target, memory, memory).output));
}

TEST_CASE("masks: 2-D, 3-D and 4-D forms, key padding and is_causal mean the same as their expanded masks",
          "[mha][masks]") {
    std::mt19937_64 rng(19);
    const Index B = 2, H = 2, Tq = 4, Tk = 6, E = 8;
    MultiHeadAttention<double> mha(config(E, H));
    set_random_biases(mha, rng);
    const Tensor<double> xq = random_tensor<double>({B, Tq, E}, rng), xkv = random_tensor<double>({B, Tk, E}, rng);
    MhaOptions zero;
    zero.empty_rows = EmptyRowPolicy::Zero;
    const auto run = [&](std::optional<TensorView<const bool>> m, const MhaOptions& o) {
        return mha.forward_cross(xq, xkv, m, o).output;
    };
    // 3-D (B, Tq, Tk) broadcasts over heads, as (B, 1, Tq, Tk).
    const Tensor<bool> m3 = random_mask({B, Tq, Tk}, rng);
    const Tensor<bool> m4 = Tensor<bool>::copy_of(m3.view().unsqueeze(1).broadcast_to({B, H, Tq, Tk}, "test", "m"));
    CHECK(bitwise_equal(run(m3.view(), zero), run(m4.view(), zero)));
    // 2-D (Tq, Tk) broadcasts over batch and heads.
    const Tensor<bool> m2 = random_mask({Tq, Tk}, rng);
    const Tensor<bool> m2full = Tensor<bool>::copy_of(m2.view().broadcast_to({B, H, Tq, Tk}, "test", "m"));
    CHECK(bitwise_equal(run(m2.view(), zero), run(m2full.view(), zero)));
    // key padding (B, Tk) equals the mask (B, 1, 1, Tk) and combines with another mask by logical and.
    Tensor<bool> padding({B, Tk}, true);
    padding({0, 5}) = padding({0, 4}) = padding({1, 0}) = false;
    MhaOptions with_padding = zero;
    with_padding.key_padding_allowed = padding.view();
    const Tensor<bool> padding4 = Tensor<bool>::copy_of(padding.view().unsqueeze(1).unsqueeze(1));
    CHECK(bitwise_equal(run(std::nullopt, with_padding), run(padding4.view(), zero)));
    const Tensor<bool> both = logical_and(m4.view(), padding4.view());
    CHECK(bitwise_equal(run(m4.view(), with_padding), run(both.view(), zero)));
    // is_causal equals the explicit causal mask, in both alignments (Tq = 4 < Tk = 6).
    for (const auto alignment : {CausalAlignment::TopLeft, CausalAlignment::BottomRight}) {
        MhaOptions causal;
        causal.is_causal = true, causal.alignment = alignment;
        const Tensor<bool> explicit_mask = causal_allowed_mask(Tq, Tk, alignment);
        CHECK(bitwise_equal(run(std::nullopt, causal), run(explicit_mask.view(), {})));
    }
    // The long-double check with a per-head 4-D mask, key padding and bottom-right causal together.
    const Tensor<bool> per_head = random_mask({B, H, Tq, Tk}, rng, 0.8);
    MhaOptions all = with_padding;
    all.is_causal = true, all.alignment = CausalAlignment::BottomRight, all.weights = MhaWeights::PerHead;
    const auto r = mha.forward_cross(xq, xkv, per_head.view(), all);
    const Tensor<bool> combined = logical_and(per_head.view(), padding4.view());
    const auto ref = testing::ref_mha(
        testing::ref_module(mha),
        ref_inputs(xq, xkv, xkv, testing::expand_allowed(combined.view(), B, H, Tq, Tk, true, CausalAlignment::BottomRight)),
        testing::comparison_unit_roundoff<double>());
    CHECK(testing::max_error_ratio(r.output.data(), ref.output, ref.output_bound) <= 1);
    CHECK(testing::max_error_ratio(r.weights->data(), ref.weights, ref.weights_bound) <= 1);
}

TEST_CASE("blocked and allowed conventions give identical outputs; the blocked form is only the named adapter",
          "[mha][masks]") {
    std::mt19937_64 rng(23);
    const Index B = 2, H = 2, Tn = 5, E = 8;
    const MultiHeadAttention<float> mha(config(E, H));
    const Tensor<float> x = random_tensor<float>({B, Tn, E}, rng);
    const Tensor<bool> allowed = random_mask({B, H, Tn, Tn}, rng);
    Tensor<bool> padding({B, Tn}, true);
    padding({1, 3}) = false;
    MhaOptions options;
    options.empty_rows = EmptyRowPolicy::Zero;
    options.weights = MhaWeights::HeadAverage;
    MhaOptions allowed_options = options;
    allowed_options.key_padding_allowed = padding.view();
    const auto a = mha.forward(x, x, x, allowed.view(), allowed_options);
    const Tensor<bool> blocked = allowed_to_blocked(allowed.view()), padding_blocked = allowed_to_blocked(padding.view());
    const auto b = mha.forward_blocked(x, x, x, blocked.view(), padding_blocked.view(), options);
    CHECK(bitwise_equal(a.output, b.output));
    CHECK(bitwise_equal(*a.weights, *b.weights));
}

TEST_CASE("a causal allowed mask passed where a blocked one is expected is caught: the diagonal must stay visible",
          "[mha][masks]") {
    std::mt19937_64 rng(29);
    const Index Tn = 5;
    const MultiHeadAttention<double> mha(config(8, 2));
    const Tensor<double> x = random_tensor<double>({1, Tn, 8}, rng);
    MhaOptions options;
    options.weights = MhaWeights::PerHead;
    // Right: nn.MultiheadAttention's blocked causal mask is true strictly above the diagonal.
    const Tensor<bool> blocked_future = allowed_to_blocked(causal_allowed_mask(Tn, Tn, CausalAlignment::TopLeft).view());
    const auto right = mha.forward_blocked(x, x, x, blocked_future.view(), std::nullopt, options);
    CHECK(diagonal_visible(*right.weights));
    // Wrong: the allowed (lower-triangular) mask given as blocked hides the diagonal and everything below it.
    const Tensor<bool> causal_allowed = causal_allowed_mask(Tn, Tn, CausalAlignment::TopLeft);
    CHECK_THROWS_AS(mha.forward_blocked(x, x, x, causal_allowed.view(), std::nullopt, options), MaskError);
    MhaOptions zero = options;
    zero.empty_rows = EmptyRowPolicy::Zero;  // the last row then has no key at all; the check must still fail
    const auto wrong = mha.forward_blocked(x, x, x, causal_allowed.view(), std::nullopt, zero);
    CHECK_FALSE(diagonal_visible(*wrong.weights));
}

TEST_CASE("empty rows follow the policy per head, naming batch, head and row", "[mha][contracts]") {
    std::mt19937_64 rng(31);
    const Index B = 2, H = 2, Tn = 3, E = 4;
    MultiHeadAttention<double> mha(config(E, H));
    set_random_biases(mha, rng);
    const Tensor<double> x = random_tensor<double>({B, Tn, E}, rng);
    Tensor<bool> allowed({B, H, Tn, Tn}, true);
    for (Index j = 0; j < Tn; ++j) allowed({1, 1, 2, j}) = false;  // batch 1, head 1, row 2: nothing to read
    const std::string message = error_message([&] { mha.forward_self(x, allowed.view()); });
    CHECK(message.find("MultiHeadAttention::forward_self: query row 2 of batch 1, head 1 has no allowed key") == 0);
    MhaOptions zero;
    zero.empty_rows = EmptyRowPolicy::Zero;
    zero.weights = MhaWeights::PerHead;
    const auto r = mha.forward_self(x, allowed.view(), zero);
    for (Index j = 0; j < Tn; ++j) CHECK((*r.weights)({1, 1, 2, j}) == 0.0);
    const auto ref = testing::ref_mha(testing::ref_module(mha),
                                      ref_inputs(x, x, x, testing::expand_allowed(allowed.view(), B, H, Tn, Tn, false, {})),
                                      testing::comparison_unit_roundoff<double>());
    CHECK(testing::max_error_ratio(r.output.data(), ref.output, ref.output_bound) <= 1);
    // Every head empty for a row: the context row is 0, so the output row is exactly out_proj's bias.
    for (Index h = 0; h < H; ++h)
        for (Index j = 0; j < Tn; ++j) allowed({0, h, 1, j}) = false;
    const auto all_empty = mha.forward_self(x, allowed.view(), zero);
    for (Index e = 0; e < E; ++e) CHECK(all_empty.output({0, 1, e}) == mha.out_proj_bias()({e}));
    MhaOptions nan = zero;
    nan.empty_rows = EmptyRowPolicy::Nan;
    const auto n = mha.forward_self(x, allowed.view(), nan);
    CHECK(std::isnan(n.output({0, 1, 0})));
    CHECK(std::isfinite(n.output({0, 0, 0})));
}

TEST_CASE("padding values never change the output, not even NaN or Inf; read NaNs are named errors", "[mha][contracts]") {
    std::mt19937_64 rng(37);
    const Index B = 2, Tq = 3, Tk = 5, E = 8;
    MultiHeadAttention<float> mha(config(E, 2));
    set_random_biases(mha, rng);
    const Tensor<float> q = random_tensor<float>({B, Tq, E}, rng);
    Tensor<float> memory = random_tensor<float>({B, Tk, E}, rng);
    Tensor<bool> padding({B, Tk}, true);
    padding({0, 4}) = padding({1, 1}) = false;
    MhaOptions options;
    options.key_padding_allowed = padding.view();
    const auto clean = mha.forward_cross(q, memory, std::nullopt, options);
    memory({0, 4, 3}) = std::numeric_limits<float>::quiet_NaN();
    memory({1, 1, 0}) = std::numeric_limits<float>::infinity();
    CHECK(bitwise_equal(clean.output, mha.forward_cross(q, memory, std::nullopt, options).output));
    // The same NaN at a read position is a ValueError naming the tensor and its shape.
    memory({0, 2, 1}) = std::numeric_limits<float>::quiet_NaN();
    const std::string message = error_message([&] { mha.forward_cross(q, memory, std::nullopt, options); });
    CHECK(message.find("MultiHeadAttention::forward_cross: key_states [2,5,8] holds nan at batch index [0], row 2, column 1") == 0);
    CHECK(message.find("key_padding_allowed [2,5]); set options.check_finite to false to allow it") != std::string::npos);
    MhaOptions unchecked = options;
    unchecked.check_finite = false;
    CHECK(std::isnan(mha.forward_cross(q, memory, std::nullopt, unchecked).output({0, 0, 0})));
    // A non-finite parameter is read by every call.
    Tensor<float> wq = Tensor<float>::copy_of(mha.q_proj_weight());
    wq({1, 2}) = std::numeric_limits<float>::infinity();
    mha.set_q_proj_weight(wq);
    CHECK(error_message([&] { mha.forward_self(q); }).find("q_proj_weight [8,8] holds inf at row 1, column 2") != std::string::npos);
}

TEST_CASE("dropout: only in training, kept weights rescaled by 1/(1-p), deterministic given seed and step", "[mha][dropout]") {
    std::mt19937_64 rng(41);
    const Index B = 2, H = 4, Tn = 32, E = 16;
    MhaConfig c = config(E, H);
    c.dropout = 0.25, c.dropout_seed = 99;
    MultiHeadAttention<double> mha(c);
    set_random_biases(mha, rng);
    const Tensor<double> x = random_tensor<double>({B, Tn, E}, rng);
    MhaOptions eval;
    eval.weights = MhaWeights::PerHead;
    const auto plain = mha.forward_self(x, std::nullopt, eval);
    MhaOptions train = eval;
    train.training = true;
    const auto dropped = mha.forward_self(x, std::nullopt, train);
    // Evaluation mode ignores dropout.
    const auto plain_ref = testing::ref_mha(testing::ref_module(mha),
                                            ref_inputs(x, x, x, testing::expand_allowed(std::nullopt, B, H, Tn, Tn, false, {})),
                                            testing::comparison_unit_roundoff<double>());
    CHECK(testing::max_error_ratio(plain.output.data(), plain_ref.output, plain_ref.output_bound) <= 1);
    const double keep_scale = 1.0 / (1.0 - 0.25);
    Index zeros = 0;
    for (Index f = 0; f < plain.weights->numel(); ++f) {
        const double w = (*dropped.weights)[f];
        if (w == 0) {
            ++zeros;
        } else {
            REQUIRE(w == (*plain.weights)[f] * keep_scale);
        }
    }
    // Dropped fraction: n = 8192 Bernoulli(0.25) draws, sd = sqrt(p(1-p)/n) = 0.0048; 6.5 sd (0.031) has a normal
    // tail below 1e-10 (Hoeffding: 2 exp(-2 n 0.031^2) = 3e-7 for a hash that were truly random; the draw is
    // deterministic given the seed, so this can never flake).
    const double fraction = static_cast<double>(zeros) / static_cast<double>(plain.weights->numel());
    std::printf("mha dropout p=0.25: dropped fraction %.4f\n", fraction);
    CHECK(std::fabs(fraction - 0.25) < 0.031);
    // The output is out_proj(merge(dropped weights @ v)): long-double check with the returned weights.
    const std::vector<LD> given = testing::to_ld<double>(dropped.weights->view());
    const auto ref = testing::ref_mha(testing::ref_module(mha),
                                      ref_inputs(x, x, x, testing::expand_allowed(std::nullopt, B, H, Tn, Tn, false, {})),
                                      testing::comparison_unit_roundoff<double>(), std::nullopt, &given);
    CHECK(testing::max_error_ratio(dropped.output.data(), ref.output, ref.output_bound) <= 1);
    // Deterministic: the same seed and step give the same bits, another step another mask.
    CHECK(bitwise_equal(dropped.output, mha.forward_self(x, std::nullopt, train).output));
    MhaOptions next = train;
    next.dropout_step = 1;
    CHECK_FALSE(bitwise_equal(*dropped.weights, *mha.forward_self(x, std::nullopt, next).weights));
}

TEST_CASE("head-average weights are the mean of the per-head weights", "[mha][weights]") {
    std::mt19937_64 rng(43);
    const MultiHeadAttention<double> mha(config(12, 3));
    const Tensor<double> x = random_tensor<double>({2, 4, 12}, rng);
    MhaOptions options;
    options.weights = MhaWeights::HeadAverage;
    options.is_causal = true;
    const auto r = mha.forward_self(x, std::nullopt, options);
    REQUIRE(r.weights->shape() == Shape{2, 4, 4});
    const auto ref = testing::ref_mha(testing::ref_module(mha),
                                      ref_inputs(x, x, x, testing::expand_allowed(std::nullopt, 2, 3, 4, 4, true, {})),
                                      testing::comparison_unit_roundoff<double>());
    CHECK(testing::max_error_ratio(r.weights->data(), ref.average, ref.average_bound) <= 1);
}

TEST_CASE("strided inputs and thread counts do not change the bits", "[mha][determinism]") {
    std::mt19937_64 rng(47);
    const MultiHeadAttention<float> mha(config(8, 2));
    const Tensor<float> xt = random_tensor<float>({2, 8, 6}, rng);  // (B, E, T) in memory
    const TensorView<const float> x = xt.view().transpose(1, 2);    // (B, T, E) with strides (48, 1, 6)
    const Tensor<float> contiguous = Tensor<float>::copy_of(x);
    MhaOptions one, two;
    one.num_threads = 1, two.num_threads = 2;
    const auto a = mha.forward_self(x, std::nullopt, one);
    CHECK(bitwise_equal(a.output, mha.forward_self(contiguous, std::nullopt, one).output));
    CHECK(bitwise_equal(a.output, mha.forward_self(x, std::nullopt, two).output));
    // A broadcast batch (stride 0) is copied once and gives the same rows.
    const TensorView<const float> row0 = contiguous.view().slice(0, 0, 1).broadcast_to({3, 6, 8}, "test", "x");
    const auto r = mha.forward_self(row0);
    const auto single = mha.forward_self(contiguous.view().slice(0, 0, 1));
    for (Index b = 0; b < 3; ++b)
        for (Index f = 0; f < 48; ++f) CHECK(r.output[b * 48 + f] == single.output[f]);
}

TEMPLATE_TEST_CASE("random shapes match the long-double module within the derived bound", "[mha][random]", float, double) {
    std::mt19937_64 rng(53);
    std::uniform_int_distribution<int> coin(0, 1);
    LD worst_out = 0, worst_w = 0;
    // 40 cases: small enough to run in well under a second, varied enough to cover GQA, kdim/vdim, masks, bias.
    for (int iter = 0; iter < 40; ++iter) {
        const Index H = std::uniform_int_distribution<Index>(1, 4)(rng);
        const Index Dh = std::uniform_int_distribution<Index>(1, 6)(rng);
        std::vector<Index> divisors;
        for (Index g = 1; g <= H; ++g)
            if (H % g == 0) divisors.push_back(g);
        const Index G = divisors[std::uniform_int_distribution<std::size_t>(0, divisors.size() - 1)(rng)];
        const Index B = std::uniform_int_distribution<Index>(1, 3)(rng), Tq = std::uniform_int_distribution<Index>(1, 9)(rng),
                    Tk = std::uniform_int_distribution<Index>(1, 9)(rng);
        MhaConfig c = config(H * Dh, H, G, static_cast<std::uint64_t>(iter));
        c.kdim = std::uniform_int_distribution<Index>(1, 10)(rng);
        c.vdim = std::uniform_int_distribution<Index>(1, 10)(rng);
        c.bias = coin(rng);
        MultiHeadAttention<TestType> mha(c);
        set_random_biases(mha, rng);
        const double scale_x = coin(rng) ? 1.0 : 4.0;  // larger logits too
        const Tensor<TestType> xq = random_tensor<TestType>({B, Tq, H * Dh}, rng, -scale_x, scale_x),
                               xk = random_tensor<TestType>({B, Tk, *c.kdim}, rng, -scale_x, scale_x),
                               xv = random_tensor<TestType>({B, Tk, *c.vdim}, rng);
        MhaOptions options;
        options.empty_rows = EmptyRowPolicy::Zero;
        options.weights = MhaWeights::PerHead;
        options.is_causal = coin(rng);
        options.alignment = coin(rng) ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
        const Tensor<bool> allowed = random_mask({B, coin(rng) ? H : 1, Tq, Tk}, rng, 0.75);
        const bool use_mask = coin(rng);
        const auto r = mha.forward(xq, xk, xv, use_mask ? std::optional<TensorView<const bool>>(allowed.view()) : std::nullopt,
                                   options);
        const auto ref = testing::ref_mha(
            testing::ref_module(mha),
            ref_inputs(xq, xk, xv,
                       testing::expand_allowed(use_mask ? std::optional<TensorView<const bool>>(allowed.view()) : std::nullopt,
                                               B, H, Tq, Tk, options.is_causal, options.alignment)),
            testing::comparison_unit_roundoff<TestType>());
        const LD out_ratio = testing::max_error_ratio(r.output.data(), ref.output, ref.output_bound);
        const LD w_ratio = testing::max_error_ratio(r.weights->data(), ref.weights, ref.weights_bound);
        CAPTURE(iter, B, H, G, Dh, Tq, Tk, *c.kdim, *c.vdim, c.bias, options.is_causal, use_mask);
        CHECK(out_ratio <= 1);
        CHECK(w_ratio <= 1);
        worst_out = std::max(worst_out, out_ratio), worst_w = std::max(worst_w, w_ratio);
    }
    std::printf("mha random shapes (%s): max error/bound output %.3Lg, weights %.3Lg\n",
                sizeof(TestType) == 4 ? "float" : "double", worst_out, worst_w);
}

TEST_CASE("mha_sdpa_path equals SDPA and the module with identity projections", "[mha][sdpa_path]") {
    std::mt19937_64 rng(59);
    const Index B = 2, H = 4, Tq = 5, Tk = 7, Dk = 3, Dv = 2;
    const Tensor<double> q = random_tensor<double>({B, H, Tq, Dk}, rng), k = random_tensor<double>({B, H, Tk, Dk}, rng),
                         v = random_tensor<double>({B, H, Tk, Dv}, rng);
    const Tensor<bool> allowed = random_mask({B, H, Tq, Tk}, rng);
    SdpaOptions options;
    options.return_weights = true;
    options.empty_rows = EmptyRowPolicy::Zero;
    const auto direct = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed.view(), options);
    const auto path = mha_sdpa_path(q.view(), k.view(), v.view(), allowed.view(), options);
    CHECK(bitwise_equal(direct.output, path.output));
    CHECK(bitwise_equal(*direct.weights, *path.weights));

    // GQA inputs (G = 2): SDPA with each kv head repeated for its H/G query heads.
    const Tensor<double> kg = random_tensor<double>({B, 2, Tk, Dk}, rng), vg = random_tensor<double>({B, 2, Tk, Dv}, rng);
    Tensor<double> krep({B, H, Tk, Dk}), vrep({B, H, Tk, Dv});
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index j = 0; j < Tk; ++j) {
                for (Index d = 0; d < Dk; ++d) krep({b, h, j, d}) = kg({b, h / 2, j, d});
                for (Index d = 0; d < Dv; ++d) vrep({b, h, j, d}) = vg({b, h / 2, j, d});
            }
    CHECK(bitwise_equal(mha_sdpa_path(q.view(), kg.view(), vg.view(), allowed.view(), options).output,
                        scaled_dot_product_attention(q.view(), krep.view(), vrep.view(), allowed.view(), options).output));

    // The module with identity projections (Dk = Dv = D so that head widths agree): exact, so the same bits.
    const Index D = 3;
    const Tensor<double> vd = random_tensor<double>({B, H, Tk, D}, rng);
    MhaConfig c = config(H * D, H);
    c.bias = false;
    MultiHeadAttention<double> identity(c);
    Tensor<double> eye({H * D, H * D}, 0.0);
    for (Index i = 0; i < H * D; ++i) eye({i, i}) = 1.0;
    identity.set_q_proj_weight(eye), identity.set_k_proj_weight(eye), identity.set_v_proj_weight(eye);
    identity.set_out_proj_weight(eye);
    const auto merge = [&](const Tensor<double>& t, Index Tn) {  // (B, H, T, D) -> (B, T, H*D)
        return Tensor<double>::copy_of(TensorView<const double>(t.data(), {B, Tn, H, D}, {H * Tn * D, D, Tn * D, 1}))
            .reshaped({B, Tn, H * D});
    };
    MhaOptions mo;
    mo.empty_rows = EmptyRowPolicy::Zero;
    const auto module_out = identity.forward(merge(q, Tq), merge(k, Tk), merge(vd, Tk), allowed.view(), mo).output;
    const auto path_out = mha_sdpa_path(q.view(), k.view(), vd.view(), allowed.view(), options).output;
    CHECK(bitwise_equal(module_out, merge(path_out, Tq)));
}

TEST_CASE("mha_sdpa_path keeps SDPA's per-head contracts: a NaN in a head nobody reads does not matter", "[mha][sdpa_path]") {
    std::mt19937_64 rng(61);
    const Index B = 1, H = 2, Tq = 2, Tk = 3, D = 2;
    Tensor<float> q = random_tensor<float>({B, H, Tq, D}, rng), k = random_tensor<float>({B, H, Tk, D}, rng),
                  v = random_tensor<float>({B, H, Tk, D}, rng);
    Tensor<bool> allowed({B, H, Tq, Tk}, true);
    allowed({0, 1, 0, 2}) = allowed({0, 1, 1, 2}) = false;  // head 1 never reads key 2
    const auto clean = mha_sdpa_path(q.view(), k.view(), v.view(), allowed.view());
    k({0, 1, 2, 0}) = std::numeric_limits<float>::quiet_NaN();
    v({0, 1, 2, 1}) = std::numeric_limits<float>::quiet_NaN();
    CHECK(bitwise_equal(clean.output, mha_sdpa_path(q.view(), k.view(), v.view(), allowed.view()).output));
    k({0, 0, 2, 0}) = std::numeric_limits<float>::quiet_NaN();  // head 0 does read key 2
    CHECK_THROWS_AS(mha_sdpa_path(q.view(), k.view(), v.view(), allowed.view()), ValueError);
}

TEST_CASE("impossible configurations are ConfigErrors naming the constructor and the sizes", "[mha][errors]") {
    const auto message = [](const MhaConfig& c) { return error_message([&] { MultiHeadAttention<float> m(c); }); };
    const auto is_config_error = [](const MhaConfig& c) {
        try {
            MultiHeadAttention<double> m(c);
        } catch (const ConfigError&) {
            return true;
        }
        return false;
    };
    CHECK(message(config(30, 4)).find("MultiHeadAttention: embed_dim=30 is not divisible by num_heads=4") == 0);
    CHECK(message(config(32, 8, 3)).find("MultiHeadAttention: num_heads=8 is not a multiple of num_kv_heads=3") == 0);
    CHECK(is_config_error(config(30, 4)));
    CHECK(is_config_error(config(32, 8, 3)));
    CHECK(is_config_error(config(32, 4, 8)));
    CHECK(is_config_error(config(0, 4)));
    CHECK(is_config_error(config(32, 0)));
    CHECK(is_config_error(config(32, 4, 0)));
    CHECK(message(config(0, 4)).find("every size must be >= 1 (embed_dim=0") != std::string::npos);
    MhaConfig c = config(8, 2);
    c.kdim = 0;
    CHECK(is_config_error(c));
    c = config(8, 2);
    c.vdim = -1;
    CHECK(is_config_error(c));
    for (const double p : {-0.1, 1.0, 1.5, std::nan("")}) {
        c = config(8, 2);
        c.dropout = p;
        CHECK(is_config_error(c));
    }
}

TEST_CASE("wrong parameter shapes and unavailable parameters are clear errors", "[mha][errors]") {
    MhaConfig c = config(8, 2, 1);  // GQA: k, v project to G*Dh = 4
    MultiHeadAttention<float> m(c);
    CHECK(error_message([&] { m.set_q_proj_weight(Tensor<float>({8, 4})); }) ==
          "MultiHeadAttention::set_q_proj_weight: q_proj_weight must be [8,8], got [8,4]");
    CHECK_THROWS_AS(m.set_k_proj_weight(Tensor<float>({8, 8})), ShapeError);
    CHECK_THROWS_AS(m.set_v_proj_weight(Tensor<float>({4, 4})), ShapeError);
    CHECK_THROWS_AS(m.set_out_proj_weight(Tensor<float>({8})), ShapeError);
    CHECK_THROWS_AS(m.set_q_proj_bias(Tensor<float>({4})), ShapeError);
    CHECK_THROWS_AS(m.set_k_proj_bias(Tensor<float>({8})), ShapeError);
    CHECK_THROWS_AS(m.set_v_proj_bias(Tensor<float>({8})), ShapeError);
    CHECK_THROWS_AS(m.set_out_proj_bias(Tensor<float>({4})), ShapeError);
    CHECK_THROWS_AS(m.set_in_proj_weight(Tensor<float>({24, 8})), ConfigError);  // GQA has no packed form
    CHECK_THROWS_AS(m.set_in_proj_bias(Tensor<float>({24})), ConfigError);
    MultiHeadAttention<float> packed(config(8, 2));
    CHECK(error_message([&] { packed.set_in_proj_weight(Tensor<float>({16, 8})); }) ==
          "MultiHeadAttention::set_in_proj_weight: in_proj_weight must be [24,8] = (3E, E), got [16,8]");
    CHECK_THROWS_AS(packed.set_in_proj_bias(Tensor<float>({16})), ShapeError);
    // The packed setters split rows [q; k; v] as nn.MultiheadAttention does.
    Tensor<float> in_proj({24, 8});
    for (Index f = 0; f < in_proj.numel(); ++f) in_proj[f] = static_cast<float>(f);
    packed.set_in_proj_weight(in_proj);
    CHECK(packed.q_proj_weight()({0, 0}) == 0.0f);
    CHECK(packed.k_proj_weight()({0, 0}) == 64.0f);
    CHECK(packed.v_proj_weight()({7, 7}) == 191.0f);
    Tensor<float> in_bias({24});
    for (Index f = 0; f < 24; ++f) in_bias[f] = static_cast<float>(f);
    packed.set_in_proj_bias(in_bias);
    CHECK(packed.v_proj_bias()({0}) == 16.0f);
    MhaConfig cross = config(8, 2);
    cross.kdim = 5, cross.vdim = 3;  // the packed bias still fits: each part is E long
    MultiHeadAttention<float> cross_module(cross);
    cross_module.set_in_proj_bias(in_bias);
    CHECK(cross_module.k_proj_bias()({0}) == 8.0f);
    CHECK_THROWS_AS(cross_module.set_in_proj_weight(Tensor<float>({24, 8})), ConfigError);
    MhaConfig nb = config(8, 2);
    nb.bias = false;
    MultiHeadAttention<float> no_bias(nb);
    CHECK(error_message([&] { no_bias.set_q_proj_bias(Tensor<float>({8})); }).find("bias=false") != std::string::npos);
    CHECK_THROWS_AS(no_bias.set_k_proj_bias(Tensor<float>({8})), ConfigError);
    CHECK_THROWS_AS(no_bias.set_v_proj_bias(Tensor<float>({8})), ConfigError);
    CHECK_THROWS_AS(no_bias.set_out_proj_bias(Tensor<float>({8})), ConfigError);
    CHECK_THROWS_AS(no_bias.set_in_proj_bias(Tensor<float>({24})), ConfigError);
    CHECK(no_bias.q_proj_bias().numel() == 0);
}

TEST_CASE("wrong input shapes, masks and options are errors naming the function and every shape", "[mha][errors]") {
    MhaConfig c = config(8, 2);
    c.kdim = 6, c.vdim = 4;
    const MultiHeadAttention<double> m(c);
    const Tensor<double> q({2, 3, 8}), k({2, 5, 6}), v({2, 5, 4});
    CHECK(m.forward(q, k, v).output.shape() == Shape{2, 3, 8});
    CHECK(error_message([&] { m.forward(Tensor<double>({3, 8}), k, v); }) ==
          "MultiHeadAttention::forward: inputs must be (B, T, features) (query_states [3,8], key_states [2,5,6], "
          "value_states [2,5,4])");
    CHECK(error_message([&] { m.forward(q, v, v); }).find("feature widths must be query 8, key 6, value 4") != std::string::npos);
    CHECK_THROWS_AS(m.forward(Tensor<double>({2, 3, 7}), k, v), ShapeError);
    CHECK_THROWS_AS(m.forward(Tensor<double>({1, 3, 8}), k, v), ShapeError);  // B differs
    CHECK(error_message([&] { m.forward(q, k, Tensor<double>({2, 4, 4})); })
              .find("key_states has Tk=5 but value_states has Tk=4") != std::string::npos);
    CHECK_THROWS_AS(m.forward(q, k, Tensor<double>({1, 5, 4})), ShapeError);
    CHECK(error_message([&] { m.forward_cross(q, k); }).find("kdim=6 != vdim=4") != std::string::npos);
    CHECK_THROWS_AS(m.forward_self(q), ShapeError);  // kdim != embed_dim
    // Masks.
    CHECK(error_message([&] { m.forward(q, k, v, Tensor<bool>({5}).view()); })
              .find("allowed_mask must be 2-D (Tq, Tk), 3-D (B, Tq, Tk) or 4-D (B, H, Tq, Tk), got [5]") != std::string::npos);
    CHECK_THROWS_AS(m.forward(q, k, v, Tensor<bool>({1, 2, 2, 3, 5}, true).view()), ShapeError);
    CHECK(error_message([&] { m.forward(q, k, v, Tensor<bool>({3, 4}, true).view()); })
              .find("allowed_mask [3,4] does not broadcast to (B, H, Tq, Tk) = [2,2,3,5]") != std::string::npos);
    CHECK_THROWS_AS(m.forward(q, k, v, Tensor<bool>({3, 3, 5}, true).view()), ShapeError);
    CHECK_THROWS_AS(m.forward(q, k, v, Tensor<bool>({2, 3, 3, 5}, true).view()), ShapeError);
    MhaOptions o;
    const Tensor<bool> bad_padding({2, 4}, true);
    o.key_padding_allowed = bad_padding.view();
    CHECK(error_message([&] { m.forward(q, k, v, std::nullopt, o); })
              .find("key_padding_allowed must be (B, Tk) = [2,5], got [2,4]") != std::string::npos);
    const Tensor<bool> padding({2, 5}, true);
    o.key_padding_allowed = padding.view();
    CHECK(error_message([&] { m.forward_blocked(q, k, v, std::nullopt, padding.view(), o); })
              .find("key padding given twice") != std::string::npos);
    MhaOptions s;
    s.scale = INFINITY;
    CHECK_THROWS_AS(m.forward(q, k, v, std::nullopt, s), ConfigError);
    // A scale finite in double but not in float is refused by the module itself, in SDPA's wording.
    MultiHeadAttention<float> mf(config(8, 2));
    s.scale = 1e300;
    const Tensor<float> x({1, 3, 8});
    CHECK(error_message([&] { mf.forward_self(x, std::nullopt, s); })
              .find("MultiHeadAttention::forward_self: scale must be finite in float (the type the logits are scaled in)") == 0);
    MhaOptions t;
    t.num_threads = -1;
    CHECK_THROWS_AS(m.forward(q, k, v, std::nullopt, t), ConfigError);
}

TEST_CASE("multi_head_sdpa and mha_sdpa_path reject inconsistent inputs", "[mha][errors]") {
    const Tensor<float> q({1, 3, 8}), k({1, 4, 4}), v({1, 4, 4});
    CHECK(multi_head_sdpa(q, k, v, 2, 1).output.shape() == Shape{1, 3, 8});  // Dk = 4, Dv = 4
    CHECK_THROWS_AS(multi_head_sdpa(q, k, v, 2, 3), ConfigError);
    CHECK_THROWS_AS(multi_head_sdpa(q, k, v, 3, 1), ShapeError);  // 8 columns do not split into 3 heads
    CHECK_THROWS_AS(multi_head_sdpa(q, k, v, 2, 0), ConfigError);
    CHECK_THROWS_AS(multi_head_sdpa(q, Tensor<float>({1, 4, 8}), v, 2, 1), ShapeError);
    CHECK_THROWS_AS(multi_head_sdpa(Tensor<float>({1, 3, 7}), k, v, 2, 1), ShapeError);
    CHECK_THROWS_AS(multi_head_sdpa(q, k, Tensor<float>({1, 5, 4}), 2, 1), ShapeError);
    CHECK_THROWS_AS(multi_head_sdpa(q, k, Tensor<float>({1, 4, 3}), 2, 2), ShapeError);
    CHECK_THROWS_AS(multi_head_sdpa(q, k, v, 2, 1, std::nullopt, {}, MhaDropout{1.0, 0}), ConfigError);
    CHECK_THROWS_AS(multi_head_sdpa(Tensor<float>({3, 8}), k, v, 2, 1), ShapeError);
    const Tensor<float> q4({2, 4, 3, 5}), k4({2, 2, 6, 5}), v4({2, 2, 6, 3});
    CHECK(mha_sdpa_path(q4, k4, v4).output.shape() == Shape{2, 4, 3, 3});
    CHECK(error_message([&] { mha_sdpa_path(q4, Tensor<float>({2, 3, 6, 5}), Tensor<float>({2, 3, 6, 3})); })
              .find("mha_sdpa_path: q has H=4 heads, not a multiple of the G=3 kv heads of k") == 0);
    CHECK_THROWS_AS(mha_sdpa_path(q4, Tensor<float>({2, 2, 6, 4}), v4), ShapeError);
    CHECK_THROWS_AS(mha_sdpa_path(q4, k4, Tensor<float>({2, 2, 5, 3})), ShapeError);
    CHECK_THROWS_AS(mha_sdpa_path(Tensor<float>({5}), k4, v4), ShapeError);
    CHECK_THROWS_AS(mha_sdpa_path(q4, Tensor<float>({3, 2, 6, 5}), v4), ShapeError);
    CHECK_THROWS_AS(mha_sdpa_path(q4, k4, v4, Tensor<bool>({1, 1, 1, 3, 6}, true).view()), ShapeError);
    CHECK_THROWS_AS(mha_sdpa_path(q4, k4, v4, Tensor<bool>({3, 5}, true).view()), ShapeError);
}

TEST_CASE("zero-size batches, queries and keys give empty or policy-defined outputs", "[mha][contracts]") {
    std::mt19937_64 rng(67);
    MultiHeadAttention<float> mha(config(4, 2));
    set_random_biases(mha, rng);
    CHECK(mha.forward_self(Tensor<float>({0, 3, 4})).output.shape() == Shape{0, 3, 4});
    CHECK(mha.forward_self(Tensor<float>({2, 0, 4})).output.shape() == Shape{2, 0, 4});
    const Tensor<float> x = random_tensor<float>({2, 3, 4}, rng), no_keys({2, 0, 4});
    CHECK_THROWS_AS(mha.forward_cross(x, no_keys), MaskError);
    MhaOptions zero;
    zero.empty_rows = EmptyRowPolicy::Zero;
    zero.weights = MhaWeights::PerHead;
    const auto r = mha.forward_cross(x, no_keys, std::nullopt, zero);  // every context row is 0: output = out_proj bias
    REQUIRE(r.weights->shape() == Shape{2, 2, 3, 0});
    for (Index f = 0; f < r.output.numel(); ++f) CHECK(r.output[f] == mha.out_proj_bias()({f % 4}));
    SdpaOptions with_weights;
    with_weights.return_weights = true;
    const auto none = mha_sdpa_path(Tensor<float>({2, 0, 3, 4}), Tensor<float>({2, 1, 5, 4}), Tensor<float>({2, 1, 5, 2}),
                                    std::nullopt, with_weights);
    CHECK(none.output.shape() == Shape{2, 0, 3, 2});
    CHECK(none.weights->shape() == Shape{2, 0, 3, 5});
    // An empty batch does not excuse a mask that does not broadcast to the scores (as in SDPA).
    const Tensor<float> q0({1, 0, 1, 1}), k0({1, 0, 1, 1}), v0({1, 0, 1, 4});
    const Tensor<bool> wrong({2, 0, 1, 1});
    CHECK_THROWS_AS(scaled_dot_product_attention(q0.view(), k0.view(), v0.view(), wrong.view()), ShapeError);
    CHECK_THROWS_AS(mha_sdpa_path(q0, k0, v0, wrong.view()), ShapeError);
    // Nor bad options: a NaN scale, a negative thread count or block size, refused by name as SDPA refuses them.
    SdpaOptions nan_scale, negative_threads, negative_block;
    nan_scale.scale = std::numeric_limits<double>::quiet_NaN();
    negative_threads.num_threads = -1;
    negative_block.tiled_key_block = -1;
    for (const auto& [options, name] : {std::pair{nan_scale, "scale"}, std::pair{negative_threads, "num_threads"},
                                        std::pair{negative_block, "tiled_key_block"}}) {
        CHECK_THROWS_AS(scaled_dot_product_attention(q0.view(), k0.view(), v0.view(), std::nullopt, options), ConfigError);
        CHECK_THROWS_WITH(mha_sdpa_path(q0, k0, v0, std::nullopt, options), Catch::Contains(name));
    }
    // A block size reaches the SDPA core through multi_head_sdpa's options too.
    MhaOptions blocks;
    blocks.tiled_query_block = -2;
    CHECK_THROWS_WITH(mha.forward_self(x, std::nullopt, blocks), Catch::Contains("tiled_query_block"));
}

TEST_CASE("mha_sdpa_path takes SDPA's broadcast ranks: unbatched, 3-D, broadcast heads and masks", "[mha][sdpa_path]") {
    std::mt19937_64 rng(71);
    SdpaOptions options;
    options.return_weights = true;
    options.empty_rows = EmptyRowPolicy::Zero;
    const auto same = [&](TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                          std::optional<TensorView<const bool>> allowed_mask) {
        const auto direct = scaled_dot_product_attention(q, k, v, allowed_mask, options);
        const auto path = mha_sdpa_path(q, k, v, allowed_mask, options);
        return bitwise_equal(direct.output, path.output) && bitwise_equal(*direct.weights, *path.weights);
    };
    const Tensor<double> q2 = random_tensor<double>({4, 3}, rng), k2 = random_tensor<double>({6, 3}, rng),
                         v2 = random_tensor<double>({6, 2}, rng);
    const Tensor<bool> m2 = random_mask({4, 6}, rng);
    CHECK(same(q2, k2, v2, std::nullopt));
    CHECK(same(q2, k2, v2, m2.view()));
    // 3-D q (H, Tq, Dk) with one shared kv head (1, Tk, Dk): multi-query by broadcasting.
    const Tensor<double> q3 = random_tensor<double>({3, 4, 3}, rng), k3 = random_tensor<double>({1, 6, 3}, rng),
                         v3 = random_tensor<double>({1, 6, 2}, rng);
    CHECK(same(q3, k3, v3, m2.view()));
    // 5-D with a broadcast batch dim and a per-head mask (1, 1, H, Tq, Tk).
    const Tensor<double> q5 = random_tensor<double>({2, 1, 3, 4, 3}, rng), k5 = random_tensor<double>({1, 2, 3, 6, 3}, rng),
                         v5 = random_tensor<double>({1, 2, 3, 6, 2}, rng);
    const Tensor<bool> m5 = random_mask({1, 1, 3, 4, 6}, rng);
    CHECK(same(q5, k5, v5, m5.view()));
    CHECK(mha_sdpa_path(q5, k5, v5, m5.view(), options).output.shape() == Shape{2, 2, 3, 4, 2});
    CHECK_THROWS_AS(mha_sdpa_path(q3, Tensor<double>({2, 6, 3}), Tensor<double>({2, 6, 2})), ShapeError);  // 3 vs 2 heads
}

TEMPLATE_TEST_CASE("float masks (PyTorch's float attn_mask and key_padding_mask) and ALiBi: every form means its "
                   "written-out bias, -inf blocks as false, bad ones are named errors",
                   "[mha][bias]", float, double) {
    using T = TestType;
    std::mt19937_64 rng(43);
    const Index B = 2, H = 2, Tq = 4, Tk = 6, E = 8;
    const T inf = std::numeric_limits<T>::infinity();
    MultiHeadAttention<T> mha(config(E, H));
    set_random_biases(mha, rng);
    const Tensor<T> xq = random_tensor<T>({B, Tq, E}, rng), xkv = random_tensor<T>({B, Tk, E}, rng);
    MhaOptions zero;
    zero.empty_rows = EmptyRowPolicy::Zero;
    const auto run = [&](const MhaOptions& o, std::optional<TensorView<const bool>> m = std::nullopt) {
        return mha.forward_cross(xq, xkv, m, o).output;
    };
    const auto full = [&](TensorView<const T> x) { return Tensor<T>::copy_of(x.broadcast_to({B, H, Tq, Tk}, "test", "bias")); };

    // A mask written as a bias of 0 (allowed) and -inf (blocked) gives the mask's bits.
    const Tensor<bool> m4 = random_mask({B, H, Tq, Tk}, rng, 0.7);
    Tensor<T> as_bias({B, H, Tq, Tk});
    for (Index f = 0; f < as_bias.numel(); ++f) as_bias[f] = m4[f] ? T(0) : -inf;
    MhaOptions o = zero;
    o.bias = as_bias;
    CHECK(bitwise_equal(run(o), run(zero, m4.view())));

    // 2-D (Tq, Tk) and 3-D (B, Tq, Tk) biases mean their (B, H, Tq, Tk) expansion, as the bool masks do.
    const Tensor<T> bias2 = random_tensor<T>({Tq, Tk}, rng, -3, 3), bias3 = random_tensor<T>({B, Tq, Tk}, rng, -3, 3);
    const Tensor<T> bias2_full = full(bias2.view()), bias3_full = full(bias3.view().unsqueeze(1));
    MhaOptions o2 = zero, o2_full = zero, o3 = zero, o3_full = zero;
    o2.bias = bias2, o2_full.bias = bias2_full, o3.bias = bias3, o3_full.bias = bias3_full;
    const Tensor<T> out3 = run(o3);
    CHECK(bitwise_equal(run(o2), run(o2_full)));
    CHECK(bitwise_equal(out3, run(o3_full)));
    CHECK_FALSE(bitwise_equal(out3, run(zero)));  // the bias is not ignored

    // key_padding_bias (B, Tk) is (B, 1, 1, Tk); with a bias, the bias is their sum in the dtype.
    Tensor<T> padding = random_tensor<T>({B, Tk}, rng, -2, 2);
    padding({0, 5}) = padding({1, 0}) = -inf;
    const Tensor<T> padding_full = full(padding.view().unsqueeze(1).unsqueeze(1));
    MhaOptions op = zero, op_full = zero;
    op.key_padding_bias = padding, op_full.bias = padding_full;
    CHECK(bitwise_equal(run(op), run(op_full)));
    Tensor<T> sum({B, H, Tq, Tk});
    for (Index f = 0; f < sum.numel(); ++f) sum[f] = static_cast<T>(bias3_full[f] + padding_full[f]);
    MhaOptions both = o3, sum_full = zero;
    both.key_padding_bias = padding, sum_full.bias = sum;
    CHECK(bitwise_equal(run(both), run(sum_full)));
    // The padded keys are blocked: their values do not matter, NaN included.
    Tensor<T> xkv_nan = Tensor<T>::copy_of(xkv.view());
    for (Index e = 0; e < E; ++e) xkv_nan({0, 5, e}) = std::numeric_limits<T>::quiet_NaN();
    CHECK(bitwise_equal(mha.forward_cross(xq, xkv_nan, std::nullopt, op).output, run(op)));

    // ALiBi slopes (H) equal their written-out bias -slope * |i + Tk - Tq - j|, bottom-right whatever the alignment.
    Tensor<T> slopes({H});
    slopes[0] = T(0.5), slopes[1] = T(0.125);
    Tensor<T> alibi({B, H, Tq, Tk});
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j)
                    alibi({b, h, i, j}) = -slopes[h] * static_cast<T>(std::abs(static_cast<double>(i + Tk - Tq - j)));
    MhaOptions oa = zero, oa_full = zero;
    oa.alibi_slopes = slopes, oa.is_causal = true, oa_full.bias = alibi, oa_full.is_causal = true;
    CHECK(bitwise_equal(run(oa), run(oa_full)));

    // Errors name the function, the tensor and the shapes.
    const std::string f = "MultiHeadAttention::forward_cross: ";
    const auto message = [&](const MhaOptions& bad, std::optional<TensorView<const bool>> m = std::nullopt) {
        return error_message([&] { run(bad, m); });
    };
    const Tensor<T> long_bias = random_tensor<T>({Tq + 1, Tk}, rng);
    MhaOptions bad = zero;
    bad.bias = long_bias;
    CHECK_THROWS_AS(run(bad), ShapeError);
    CHECK(message(bad).find(f + "bias [5,6] does not broadcast to (B, H, Tq, Tk) = [2,2,4,6]") == 0);
    const Tensor<T> long_padding = random_tensor<T>({B, Tk + 1}, rng);
    bad = zero, bad.key_padding_bias = long_padding;
    CHECK_THROWS_AS(run(bad), ShapeError);
    CHECK(message(bad).find(f + "key_padding_bias must be (B, Tk) = [2,6], got [2,7]") == 0);
    using Other = std::conditional_t<std::is_same_v<T, float>, double, float>;
    const Tensor<Other> other = random_tensor<Other>({Tq, Tk}, rng);
    bad = zero, bad.bias = other;
    CHECK_THROWS_AS(run(bad), ConfigError);
    CHECK(message(bad).find(f + "bias has dtype") == 0);
    // NaN where a query reads is a ValueError naming batch element, head, row and key; where none reads, nothing.
    Tensor<T> nan_bias = Tensor<T>::copy_of(bias3_full.view());
    nan_bias({1, 1, 2, 3}) = std::numeric_limits<T>::quiet_NaN();
    bad = zero, bad.bias = nan_bias;
    CHECK_THROWS_AS(run(bad), ValueError);
    CHECK(message(bad).find(f + "bias [2,2,4,6] holds nan at batch index [1,1], row 2, column 3") == 0);
    Tensor<bool> hide({B, H, Tq, Tk}, true);
    hide({1, 1, 2, 3}) = false;
    Tensor<T> hidden = Tensor<T>::copy_of(bias3_full.view());
    hidden({1, 1, 2, 3}) = T(0);
    MhaOptions hidden_opt = zero;
    hidden_opt.bias = hidden;
    CHECK(bitwise_equal(run(bad, hide.view()), run(hidden_opt, hide.view())));
    // A row blocked everywhere by -inf is an empty row: an error under Throw naming batch, head and row.
    Tensor<T> empty_row = Tensor<T>::copy_of(bias3_full.view());
    for (Index j = 0; j < Tk; ++j) empty_row({0, 1, 3, j}) = -inf;
    MhaOptions throwing;
    throwing.bias = empty_row;
    CHECK_THROWS_AS(run(throwing), MaskError);
    CHECK(message(throwing).find(f + "query row 3 of batch 0, head 1 has no allowed key") == 0);
    // Slopes: one per head (or per batch element and head), each finite.
    const Tensor<T> three_slopes = random_tensor<T>({H + 1}, rng);
    bad = zero, bad.alibi_slopes = three_slopes;
    CHECK_THROWS_AS(run(bad), ShapeError);
    CHECK(message(bad).find(f + "alibi_slopes [3] does not broadcast to the batch shape [2,2]") == 0);
    Tensor<T> nan_slopes = Tensor<T>::copy_of(slopes.view());
    nan_slopes[1] = std::numeric_limits<T>::quiet_NaN();
    bad = zero, bad.alibi_slopes = nan_slopes;
    CHECK_THROWS_AS(run(bad), ValueError);
    CHECK(message(bad).find(f + "alibi_slopes [2] holds nan at batch index [0,1]") == 0);
    // An empty row is reported before a refused slope, in SDPA's order (found by the mha fuzzer: the head path threw
    // the slope's ValueError where SDPA threw the MaskError).
    MhaOptions empty_and_nan_slope = throwing;
    empty_and_nan_slope.alibi_slopes = nan_slopes;
    CHECK_THROWS_AS(run(empty_and_nan_slope), MaskError);
}
