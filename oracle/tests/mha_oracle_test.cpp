// The multi-head attention oracle against attn::MultiHeadAttention: the module's float and double outputs lie
// within the bound over random configurations, the bound is not vacuous, and an element moved past it is caught.
#include <catch2/catch.hpp>

#include "error_message.hpp"

#include <array>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/mha.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/mha.hpp"

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace oracle = attn::oracle;

namespace {

template <class T>
Tensor<T> uniform(const Shape& shape, double amplitude, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> dist(-amplitude, amplitude);
    Tensor<T> t(shape);
    for (Index f = 0; f < t.numel(); ++f) t[f] = static_cast<T>(dist(rng));
    return t;
}

Tensor<bool> random_flags(const Shape& shape, double p_true, std::mt19937_64& rng) {
    std::bernoulli_distribution keep(p_true);
    Tensor<bool> t(shape);
    for (Index f = 0; f < t.numel(); ++f) t[f] = keep(rng);
    return t;
}

// One random module call: sizes (H, G, kdim != vdim != E), biases, masks of rank 2/3/4, key padding, causal
// alignments; the SDPA backend and the error model that describes it.
template <class T>
struct Case {
    attn::MultiHeadAttention<T> module;
    Tensor<T> xq, xk, xv;
    std::optional<Tensor<bool>> allowed, padding;
    std::optional<Tensor<T>> bias, padding_bias, slopes;  // float masks and ALiBi (MhaOptions)
    attn::MhaOptions options;
    oracle::OracleOptions oracle_options;
    std::string label;
};

template <class T>
Case<T> random_case(std::mt19937_64& rng, int n) {
    const auto pick = [&](Index lo, Index hi) { return std::uniform_int_distribution<Index>(lo, hi)(rng); };
    attn::MhaConfig config;
    const Index G = pick(1, 2), R = pick(1, 3), Dh = pick(1, 4);
    config.num_heads = G * R;
    config.num_kv_heads = G;
    config.embed_dim = config.num_heads * Dh;
    config.kdim = n % 3 == 0 ? config.embed_dim : pick(1, 9);
    config.vdim = n % 3 == 0 ? config.embed_dim : pick(1, 9);
    config.bias = (n / 2) % 2 == 0;
    config.init_seed = rng();
    Case<T> c{attn::MultiHeadAttention<T>(config), {}, {}, {}, std::nullopt, std::nullopt, std::nullopt,
              std::nullopt, std::nullopt, {}, {}, {}};
    const Index E = config.embed_dim, KV = G * Dh;
    if (config.bias) {
        c.module.set_q_proj_bias(uniform<T>({E}, 0.5, rng).view());
        c.module.set_k_proj_bias(uniform<T>({KV}, 0.5, rng).view());
        c.module.set_v_proj_bias(uniform<T>({KV}, 0.5, rng).view());
        c.module.set_out_proj_bias(uniform<T>({E}, 0.5, rng).view());
    }
    const Index B = pick(1, 2), Tq = pick(1, 6), Tk = pick(1, 6);
    const double amplitude = n % 4 < 2 ? 1.0 : 6.0;  // larger inputs sharpen the softmax
    c.xq = uniform<T>({B, Tq, E}, amplitude, rng);
    c.xk = uniform<T>({B, Tk, *config.kdim}, amplitude, rng);
    c.xv = uniform<T>({B, Tk, *config.vdim}, amplitude, rng);
    const int mask_rank = static_cast<int>(pick(0, 4));  // 0 and 1: no mask
    if (mask_rank == 2) c.allowed = random_flags({Tq, Tk}, 0.75, rng);
    if (mask_rank == 3) c.allowed = random_flags({B, Tq, Tk}, 0.75, rng);
    if (mask_rank == 4) c.allowed = random_flags({n % 2 ? B : 1, config.num_heads, Tq, Tk}, 0.75, rng);
    if (n % 5 == 1) c.padding = random_flags({B, Tk}, 0.8, rng);
    if (c.padding) c.options.key_padding_allowed = c.padding->view();
    // Float masks and ALiBi from a generator of their own (the draws above stay those of the cases without them):
    // a bias of rank 2, 3 or 4 with a -inf in one entry of eight, a float key padding, the standard slopes.
    std::mt19937_64 bias_rng(static_cast<std::uint64_t>(n) * 7919 + 1);
    const auto with_minus_inf = [&](Tensor<T> t) {
        std::bernoulli_distribution block(0.125);
        for (Index f = 0; f < t.numel(); ++f)
            if (block(bias_rng)) t[f] = static_cast<T>(-std::numeric_limits<double>::infinity());
        return t;
    };
    if (n % 3 == 2) {
        const Shape forms[] = {{Tq, Tk}, {B, Tq, Tk}, {B, config.num_heads, Tq, Tk}};
        c.bias = with_minus_inf(uniform<T>(forms[(n / 3) % 3], 3.0, bias_rng));
        c.options.bias = *c.bias;
    }
    if (n % 5 == 3) {
        c.padding_bias = with_minus_inf(uniform<T>({B, Tk}, 2.0, bias_rng));
        c.options.key_padding_bias = *c.padding_bias;
    }
    if (n % 4 == 1) {
        const std::vector<double> standard = attn::alibi_slopes(config.num_heads);
        c.slopes = Tensor<T>({config.num_heads});
        for (Index h = 0; h < config.num_heads; ++h) (*c.slopes)[h] = static_cast<T>(standard[static_cast<std::size_t>(h)]);
        c.options.alibi_slopes = *c.slopes;
    }
    c.options.is_causal = n % 3 != 1;
    c.options.alignment = (n / 4) % 2 ? attn::CausalAlignment::BottomRight : attn::CausalAlignment::TopLeft;
    c.options.empty_rows = attn::EmptyRowPolicy::Zero;  // random masks and causal Tq > Tk leave rows empty
    if (n % 7 == 3) c.options.scale = 0.75;
    // The reference backend has its own model; the tiled one is covered by the conservative generic model.
    c.options.backend = n % 2 ? attn::Backend::Reference : attn::Backend::Tiled;
    c.oracle_options.model = n % 2 ? oracle::reference_model() : oracle::generic_model();
    c.label = "case " + std::to_string(n) + ": B=" + std::to_string(B) + " Tq=" + std::to_string(Tq) +
              " Tk=" + std::to_string(Tk) + " E=" + std::to_string(E) + " H=" + std::to_string(config.num_heads) +
              " G=" + std::to_string(G) + " kdim=" + std::to_string(*config.kdim) + " vdim=" +
              std::to_string(*config.vdim) + " bias=" + std::to_string(config.bias) + " mask rank " +
              std::to_string(mask_rank) + (c.bias ? " bias " + attn::to_string(c.bias->shape()) : "") +
              (c.padding_bias ? " key_padding_bias" : "") + (c.slopes ? " alibi" : "") +
              " causal=" + std::to_string(c.options.is_causal) + " model " +
              c.oracle_options.model.name;
    return c;
}

template <class T>
std::optional<TensorView<const bool>> mask_of(const Case<T>& c) {
    if (!c.allowed) return std::nullopt;
    return c.allowed->view();
}

template <class T>
attn::MhaResult<T> run_module(const Case<T>& c) {
    return c.module.forward(c.xq.view(), c.xk.view(), c.xv.view(), mask_of(c), c.options);
}

template <class T>
oracle::Result<T> run_oracle(const Case<T>& c) {
    return oracle::multi_head_attention<T>(c.module, c.xq.view(), c.xk.view(), c.xv.view(), mask_of(c), c.options,
                                           c.oracle_options);
}

template <class T>
std::vector<double> sweep(const char* dtype, int cases) {
    std::mt19937_64 rng(20261130);
    std::vector<double> tightness;
    double worst_self = 0;
    for (int n = 0; n < cases; ++n) {
        const Case<T> c = random_case<T>(rng, n);
        INFO(c.label);
        const attn::MhaResult<T> got = run_module(c);
        const oracle::Result<T> want = run_oracle(c);
        const oracle::Comparison cmp = oracle::compare_output<T>(got.output.view(), want);
        INFO(cmp.summary());
        CHECK(cmp.pass());
        CHECK(cmp.unbounded == 0);
        CHECK(want.oracle_error_ratio <= oracle::max_oracle_error_ratio);
        tightness.push_back(cmp.max_tightness);
        worst_self = std::max(worst_self, want.oracle_error_ratio);
    }
    std::vector<double> sorted = tightness;
    std::sort(sorted.begin(), sorted.end());
    std::printf("mha oracle (%s, %d cases): worst tightness %.3g, median %.3g, oracle self-error ratio <= %.2g\n",
                dtype, cases, sorted.back(), sorted[sorted.size() / 2], worst_self);
    return sorted;
}

// The next T above (up) or below x, finite x: std::nextafter, or the neighbouring bit pattern of a 16-bit type.
template <class T>
T next(T x, bool up) {
    if constexpr (attn::is_half_v<T>) {
        const float f = x;
        if (f == 0) return up ? std::numeric_limits<T>::denorm_min() : T(-static_cast<float>(std::numeric_limits<T>::denorm_min()));
        const bool away = (f > 0) == up;  // away from zero: the magnitude's bits grow
        return T::from_bits(static_cast<std::uint16_t>(away ? x.bits + 1 : x.bits - 1));
    } else {
        return std::nextafter(x, up ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
    }
}

// The largest T on the far side of exact + bound (error just over the bound), or the one just inside.
template <class T>
T just_past(long double exact, long double exact_lo, double bound, bool past) {
    const auto err = [&](T x) { return (static_cast<long double>(x) - exact) - exact_lo; };
    T x = static_cast<T>(exact + exact_lo + bound);
    while (err(x) <= bound) x = next(x, true);
    while (err(next(x, false)) > bound) x = next(x, false);
    return past ? x : next(x, false);
}

template <class T>
void moved_element_is_caught() {
    std::mt19937_64 rng(7);
    const Case<T> c = random_case<T>(rng, 4);
    INFO(c.label);
    const attn::MhaResult<T> got = run_module(c);
    const oracle::Result<T> want = run_oracle(c);
    REQUIRE(oracle::compare_output<T>(got.output.view(), want).pass());
    const Index f = got.output.numel() / 2;
    const double bound = want.output_bound[f];
    REQUIRE(std::isfinite(bound));
    REQUIRE(bound > 0);

    Tensor<T> moved = Tensor<T>::copy_of(got.output.view());
    moved[f] = just_past<T>(want.output_exact[f], want.output_exact_lo[f], bound, true);
    const oracle::Comparison over = oracle::compare_output<T>(moved.view(), want);
    INFO(over.summary());
    CHECK(over.violations == 1);
    CHECK(over.worst_flat == f);
    CHECK(over.max_tightness > 1);

    // One step back towards the exact value, the element is within its bound again.
    moved[f] = just_past<T>(want.output_exact[f], want.output_exact_lo[f], bound, false);
    CHECK(oracle::compare_output<T>(moved.view(), want).pass());
}

}  // namespace

TEST_CASE("the module's output lies within the MHA oracle's bound, which is not vacuous", "[oracle][mha]") {
    const std::vector<double> f = sweep<float>("float", 60);
    const std::vector<double> d = sweep<double>("double", 60);
    // Not vacuous: somewhere the module's error reaches 1/100 of the bound.
    CHECK(f.back() >= 1e-2);
    CHECK(d.back() >= 1e-2);
}

TEST_CASE("the 16-bit module's output lies within the MHA oracle's bound, which is nearly reached",
          "[oracle][mha][half]") {
    // Each projection, the context and the output are rounded to the storage type once: its u_S is most of the
    // bound (BOUNDS.md section 9, "16-bit storage"), and the rounding of the output alone nearly reaches it.
    const std::vector<double> h = sweep<attn::float16>("float16", 60);
    const std::vector<double> b = sweep<attn::bfloat16>("bfloat16", 60);
    CHECK(h.back() >= 0.25);
    CHECK(b.back() >= 0.25);
}

TEST_CASE("a 16-bit MHA output element moved just past its bound is caught and named", "[oracle][mha][half]") {
    moved_element_is_caught<attn::float16>();
    moved_element_is_caught<attn::bfloat16>();
}

TEST_CASE("MHA oracle: roundings to storage inside the SDPA core are SDPA-only", "[oracle][mha][errors]") {
    std::mt19937_64 rng(3);
    Case<attn::bfloat16> c = random_case<attn::bfloat16>(rng, 2);
    c.oracle_options.model.probabilities_in_storage = true;
    CHECK_THROWS_WITH(run_oracle(c), Catch::Contains("oracle.mha") && Catch::Contains("derived for SDPA only"));
}

TEST_CASE("an MHA output element moved just past its bound is caught and named", "[oracle][mha]") {
    moved_element_is_caught<float>();
    moved_element_is_caught<double>();
}

TEST_CASE("MHA oracle: an empty row is worded as the module words it, causal alignment included",
          "[oracle][mha][errors]") {
    attn::MhaConfig config;
    config.embed_dim = 4, config.num_heads = 2;
    const attn::MultiHeadAttention<float> m(config);
    std::mt19937_64 rng(5);
    const Tensor<float> xq = uniform<float>({1, 3, 4}, 1.0, rng), xk = uniform<float>({1, 2, 4}, 1.0, rng);
    attn::MhaOptions causal;  // bottom-right with Tq=3 > Tk=2: row 0 reads nothing
    causal.is_causal = true;
    causal.alignment = attn::CausalAlignment::BottomRight;
    const auto message = [](auto&& f) { return attn::test::error_message<attn::MaskError>(f); };
    const std::string from_oracle = message([&] {
        oracle::multi_head_attention<float>(m, xq.view(), xk.view(), xk.view(), std::nullopt, causal);
    });
    const std::string from_module = message([&] { m.forward(xq.view(), xk.view(), xk.view(), std::nullopt, causal); });
    // Both name the same row and the causal rule; only the function and the listed shapes differ.
    const std::string what = "query row 0 of batch 0, head 0 has no allowed key (Tq=3, Tk=2, causal bottom-right; ";
    CHECK_THAT(from_oracle, Catch::Contains(what));
    CHECK_THAT(from_module, Catch::Contains(what));
    CHECK_THAT(from_oracle, Catch::EndsWith("set options.empty_rows to EmptyRowPolicy::Zero or EmptyRowPolicy::Nan to allow empty rows"));
}

TEST_CASE("MHA oracle: bad input states are refused in the module's words (one shape contract)",
          "[oracle][mha][errors]") {
    attn::MhaConfig config;
    config.embed_dim = 4, config.num_heads = 2;
    const attn::MultiHeadAttention<float> m(config);
    std::mt19937_64 rng(9);
    const Tensor<float> x = uniform<float>({2, 3, 4}, 1.0, rng), wide = uniform<float>({2, 3, 5}, 1.0, rng),
                        other_b = uniform<float>({1, 3, 4}, 1.0, rng), other_t = uniform<float>({2, 5, 4}, 1.0, rng),
                        flat = uniform<float>({3, 4}, 1.0, rng);
    const auto shape_error = [](auto&& f) {
        const std::string what = attn::test::error_message<attn::ShapeError>(f);
        return what.substr(what.find(": "));  // without the function's name
    };
    const std::vector<std::array<const Tensor<float>*, 3>> calls = {
        {&x, &wide, &x}, {&x, &other_b, &other_b}, {&x, &x, &other_t}, {&flat, &x, &x}};
    for (const auto& [q, k, v] : calls) {
        const std::string from_oracle = shape_error([&] {
            oracle::multi_head_attention<float>(m, q->view(), k->view(), v->view(), std::nullopt, {});
        });
        const std::string from_module = shape_error([&] { m.forward(q->view(), k->view(), v->view()); });
        CHECK(from_oracle == from_module);
        CHECK_THAT(from_oracle, Catch::Contains("query_states " + attn::to_string(q->shape())));
    }
}

TEST_CASE("MHA oracle: the module's contracts and what it does not cover", "[oracle][mha][errors]") {
    attn::MhaConfig config;
    config.embed_dim = 4, config.num_heads = 2, config.dropout = 0.5;
    const attn::MultiHeadAttention<float> m(config);
    std::mt19937_64 rng(3);
    const Tensor<float> x = uniform<float>({1, 3, 4}, 1.0, rng);
    attn::MhaOptions training;
    training.training = true;
    CHECK_THROWS_AS(oracle::multi_head_attention<float>(m, x.view(), x.view(), x.view(), std::nullopt, training),
                    attn::ConfigError);
    const Tensor<float> wide = uniform<float>({1, 3, 5}, 1.0, rng);
    CHECK_THROWS_AS(oracle::multi_head_attention<float>(m, x.view(), wide.view(), x.view(), std::nullopt, {}),
                    attn::ShapeError);
    Tensor<bool> none({3, 3});  // all false: every row is empty
    CHECK_THROWS_AS(oracle::multi_head_attention<float>(m, x.view(), x.view(), x.view(), none.view(), {}),
                    attn::MaskError);
    attn::MhaOptions nan_rows;
    nan_rows.empty_rows = attn::EmptyRowPolicy::Nan;
    const oracle::Result<float> r = oracle::multi_head_attention<float>(m, x.view(), x.view(), x.view(), none.view(), nan_rows);
    CHECK(std::isnan(r.output[0]));
    const attn::MhaResult<float> module_nan = m.forward(x.view(), x.view(), x.view(), none.view(), nan_rows);
    CHECK(oracle::compare_output<float>(module_nan.output.view(), r).pass());
    Tensor<float> bad = Tensor<float>::copy_of(x.view());
    bad[1] = NAN;
    CHECK_THROWS_AS(oracle::multi_head_attention<float>(m, bad.view(), x.view(), x.view(), std::nullopt, {}),
                    attn::ValueError);
    // Worded as the module words it (one function words every non-finite value); only the reason differs.
    const auto value_error = [](auto&& f) { return attn::test::error_message<attn::ValueError>(f); };
    const std::string where = ": query_states [1,3,4] holds nan at batch index [0], row 0, column 1, a position some "
                              "query reads (";
    attn::MhaOptions eval;  // dropout off: the module and the oracle compute the same thing
    const attn::MultiHeadAttention<float> plain([] {
        attn::MhaConfig c;
        c.embed_dim = 4, c.num_heads = 2;
        return c;
    }());
    CHECK_THAT(value_error([&] { oracle::multi_head_attention<float>(plain, bad.view(), x.view(), x.view(), std::nullopt, eval); }),
               Catch::Contains(where) && Catch::EndsWith("(the oracle needs finite inputs there)"));
    CHECK_THAT(value_error([&] { plain.forward(bad.view(), x.view(), x.view(), std::nullopt, eval); }),
               Catch::Contains(where));
}

TEST_CASE("MHA oracle: with identity projections, float masks and ALiBi give the SDPA oracle's exact result",
          "[oracle][mha][bias]") {
    // Two oracles written apart (oracle/src/mha.cpp's head pass, the SDPA engine) must agree on the exact output
    // of the same heads: q, k, v are the states' columns, the bias and slopes the same tensors.
    std::mt19937_64 rng(41);
    const Index B = 2, H = 2, Dh = 3, E = H * Dh, Tq = 4, Tk = 5;
    attn::MhaConfig config;
    config.embed_dim = E, config.num_heads = H, config.bias = false;
    attn::MultiHeadAttention<double> m(config);
    Tensor<double> eye({E, E}, 0.0);
    for (Index e = 0; e < E; ++e) eye({e, e}) = 1.0;
    m.set_q_proj_weight(eye.view()), m.set_k_proj_weight(eye.view()), m.set_v_proj_weight(eye.view());
    m.set_out_proj_weight(eye.view());
    const Tensor<double> xq = uniform<double>({B, Tq, E}, 2.0, rng), xk = uniform<double>({B, Tk, E}, 2.0, rng),
                         xv = uniform<double>({B, Tk, E}, 2.0, rng);
    Tensor<double> bias = uniform<double>({B, H, Tq, Tk}, 3.0, rng);
    bias({0, 1, 2, 3}) = bias({1, 0, 0, 0}) = -std::numeric_limits<double>::infinity();
    Tensor<double> slopes({H});
    slopes[0] = 0.5, slopes[1] = 0.0625;
    // The states as SDPA's heads: (B, T, H*Dh) -> (B, H, T, Dh) by strides.
    const auto heads = [&](const Tensor<double>& x) {
        return TensorView<const double>(x.data(), {B, H, x.dim(1), Dh}, {x.dim(1) * E, Dh, E, 1});
    };
    for (int variant = 0; variant < 3; ++variant) {
        INFO("variant " << variant << " (0 bias, 1 ALiBi, 2 both)");
        attn::MhaOptions mo;
        attn::SdpaOptions so;
        mo.empty_rows = so.empty_rows = attn::EmptyRowPolicy::Zero;
        if (variant != 1) mo.bias = bias, so.bias = bias;
        if (variant != 0) mo.alibi_slopes = slopes, so.alibi_slopes = slopes;
        const oracle::Result<double> mha = oracle::multi_head_attention<double>(m, xq.view(), xk.view(), xv.view(),
                                                                                 std::nullopt, mo);
        const oracle::Result<double> sdpa =
            oracle::scaled_dot_product_attention<double>(heads(xq), heads(xk), heads(xv), std::nullopt, so);
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h)
                for (Index i = 0; i < Tq; ++i)
                    for (Index d = 0; d < Dh; ++d) {
                        INFO("b=" << b << " h=" << h << " i=" << i << " d=" << d);
                        CHECK(mha.output({b, i, h * Dh + d}) == sdpa.output({b, h, i, d}));
                        CHECK(std::isfinite(mha.output_bound({b, i, h * Dh + d})));
                    }
    }
}
