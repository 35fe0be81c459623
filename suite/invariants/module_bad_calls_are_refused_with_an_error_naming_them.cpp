// Invariant 20: a MultiHeadAttention call the contract refuses throws the error of its kind, and the message names
// what is wrong. One refusal per case, drawn from: embed_dim not a multiple of num_heads, num_heads not a multiple of
// num_kv_heads, a size of 0, dropout outside [0, 1), a packed in_proj_weight or in_proj_bias on a module whose heads
// or widths do not allow it, a bias set on a module without bias, a setter given the wrong shape, a query whose
// feature width is not embed_dim, forward_cross on a module whose kdim and vdim differ, key padding given in both
// conventions, and a negative tiled block size. bad_calls_are_refused_with_an_error_naming_them does the same for
// SDPA; this one reaches the module's own checks, which the generators of valid calls never do.
#include <functional>

#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

namespace {

enum class Refusal {
    EmbedNotDivisible, HeadsNotMultiple, ZeroSize, DropoutOne, PackedWeight, PackedBias, BiasWithoutBias,
    SetterShape, QueryWidth, CrossWidths, PaddingTwice, NegativeBlock, Count
};

template <class T>
Verdict refusal_check(const SdpaCase& c) {
    Rng rng(c.aux_seed);
    const auto kind = static_cast<Refusal>(rng.below(static_cast<std::uint64_t>(Refusal::Count)));
    const Index H = c.H, G = c.kv_heads, Dh = std::min<Index>(c.Dk, 4), E = H * Dh, B = c.B, Tq = c.Tq, Tk = c.Tk;
    MhaConfig config;
    config.embed_dim = E;
    config.num_heads = H;
    config.num_kv_heads = G;
    config.init_seed = rng.next();
    std::string what, expected_kind, keyword;
    std::function<void()> call;
    // A module of the case's valid configuration, and inputs for it.
    const auto module = [&](const MhaConfig& m) { return MultiHeadAttention<T>(m); };
    const Tensor<T> xq = normal_tensor<T>({B, Tq, E}, rng), xkv = normal_tensor<T>({B, Tk, E}, rng);
    switch (kind) {
        case Refusal::EmbedNotDivisible:
            what = "embed_dim " + std::to_string(E + 1) + " with num_heads " + std::to_string(H + 1);
            config.embed_dim = (H + 1) * Dh + 1, config.num_heads = H + 1, config.num_kv_heads = 1;
            expected_kind = "ConfigError", keyword = "not divisible by num_heads";
            call = [&] { (void)module(config); };
            break;
        case Refusal::HeadsNotMultiple:
            what = "num_heads " + std::to_string(2 * G + 1) + " with num_kv_heads " + std::to_string(2 * G);
            config.num_heads = 2 * G + 1, config.num_kv_heads = 2 * G, config.embed_dim = (2 * G + 1) * Dh;
            expected_kind = "ConfigError", keyword = "num_kv_heads";
            call = [&] { (void)module(config); };
            break;
        case Refusal::ZeroSize:
            what = "embed_dim 0";
            config.embed_dim = 0;
            expected_kind = "ConfigError", keyword = ">= 1";
            call = [&] { (void)module(config); };
            break;
        case Refusal::DropoutOne:
            what = "dropout 1";
            config.dropout = 1.0;
            expected_kind = "ConfigError", keyword = "dropout";
            call = [&] { (void)module(config); };
            break;
        case Refusal::PackedWeight:
            // A packed (3E, E) weight needs num_kv_heads == num_heads and kdim == vdim == embed_dim.
            what = "a packed in_proj_weight with kdim " + std::to_string(E + 1);
            config.kdim = E + 1;
            expected_kind = "ConfigError", keyword = "in_proj_weight";
            call = [&] { module(config).set_in_proj_weight(normal_tensor<T>({3 * E, E}, rng).view()); };
            break;
        case Refusal::PackedBias:
            what = "a packed in_proj_bias with num_kv_heads " + std::to_string(H + 1) + " of num_heads " +
                   std::to_string(2 * (H + 1));
            config.num_heads = 2 * (H + 1), config.num_kv_heads = H + 1, config.embed_dim = 2 * (H + 1) * Dh;
            expected_kind = "ConfigError", keyword = "in_proj_bias";
            call = [&] { module(config).set_in_proj_bias(normal_tensor<T>({3 * config.embed_dim}, rng).view()); };
            break;
        case Refusal::BiasWithoutBias:
            what = "set_q_proj_bias on a module without bias";
            config.bias = false;
            expected_kind = "ConfigError", keyword = "set_q_proj_bias";
            call = [&] { module(config).set_q_proj_bias(normal_tensor<T>({E}, rng).view()); };
            break;
        case Refusal::SetterShape:
            what = "set_out_proj_weight given (" + std::to_string(E) + ", " + std::to_string(E + 1) + ")";
            expected_kind = "ShapeError", keyword = "out_proj_weight";
            call = [&] { module(config).set_out_proj_weight(normal_tensor<T>({E, E + 1}, rng).view()); };
            break;
        case Refusal::QueryWidth:
            what = "query states of width " + std::to_string(E + 1);
            expected_kind = "ShapeError", keyword = "feature widths";
            call = [&] { (void)module(config).forward_self(normal_tensor<T>({B, Tq, E + 1}, rng).view()); };
            break;
        case Refusal::CrossWidths:
            what = "forward_cross with kdim " + std::to_string(E) + " and vdim " + std::to_string(E + 1);
            config.vdim = E + 1;
            expected_kind = "ConfigError", keyword = "forward_cross";
            call = [&] { (void)module(config).forward_cross(xq.view(), xkv.view()); };
            break;
        case Refusal::PaddingTwice: {
            what = "key padding in both conventions";
            expected_kind = "ConfigError", keyword = "key padding given twice";
            call = [&] {
                const Tensor<bool> padding({B, Tk}, false);  // blocked: nothing; allowed: nothing (never reached)
                MhaOptions options;
                options.key_padding_allowed = padding.view();
                (void)module(config).forward_blocked(xq.view(), xkv.view(), xkv.view(), std::nullopt, padding.view(),
                                                     options);
            };
            break;
        }
        case Refusal::NegativeBlock:
            what = "tiled_query_block = -1";
            expected_kind = "ConfigError", keyword = "tiled_query_block";
            call = [&] {
                MhaOptions options;
                options.tiled_query_block = -1;
                (void)module(config).forward_self(xq.view(), std::nullopt, options);
            };
            break;
        case Refusal::Count: break;
    }
    return refused_with(call, what, expected_kind, keyword);
}

}  // namespace

Property module_bad_calls_are_refused_with_an_error_naming_them() {
    Property p;
    p.name = "module_bad_calls_are_refused_with_an_error_naming_them";
    p.sentence = "A MultiHeadAttention configuration, setter or forward call the contract refuses (indivisible heads, "
                 "a size of 0, dropout of 1, a packed projection the module cannot take, a bias it has not, a wrong "
                 "shape, key padding given twice, a negative block size) throws ConfigError or ShapeError with a "
                 "message naming what is wrong.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None, .small = true}); };
    p.applies = [](const Implementation& impl) { return impl.name == "mha"; };
    p.check = [](const Implementation&, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict { return refusal_check<T>(c); });
    };
    return p;
}

}  // namespace attn::suite
