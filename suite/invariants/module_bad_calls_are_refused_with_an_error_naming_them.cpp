// Invariant 20: a MultiHeadAttention call the contract refuses throws the error of its kind, and the message names
// what is wrong. One refusal per case, drawn from: embed_dim not a multiple of num_heads, num_heads not a multiple of
// num_kv_heads, any of the five sizes 0, dropout outside [0, 1), a packed in_proj_weight or in_proj_bias on a module
// whose heads or widths do not allow it or of the wrong shape, a bias set on a module without bias, a setter given
// the wrong shape, a query whose feature width is not embed_dim, forward_cross on a module whose kdim and vdim
// differ, key padding given in both conventions, a negative tiled block size, a parameter holding NaN or Inf with
// check_finite on (named with its shape, the value and its row and column, or its index for a bias), and the head
// path (multi_head_sdpa) given projected states whose shapes or head counts disagree, or a negative block size, and
// its backward a dout of another shape than the context's; a
// forward given states of rank 2, of different B or different Tk in keys and values, a mask of rank 5 or one that does
// not broadcast to (B, H, Tq, Tk), or key padding that is not (B, Tk).
// bad_calls_are_refused_with_an_error_naming_them does the same for SDPA; this one reaches the module's own checks,
// which the generators of valid calls never do.
#include <functional>

#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

namespace {

enum class Refusal {
    EmbedNotDivisible, HeadsNotMultiple, ZeroSize, DropoutOne, PackedWeight, PackedBias, BiasWithoutBias,
    SetterShape, PackedShape, HeadPathShape, QueryWidth, CrossWidths, PaddingTwice, NegativeBlock, NonFiniteParameter,
    StatesShape, Count
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
        case Refusal::ZeroSize: {
            // Any of the five sizes.
            const char* const sizes[] = {"embed_dim", "num_heads", "num_kv_heads", "kdim", "vdim"};
            const std::size_t which = rng.below(5);
            what = std::string(sizes[which]) + " 0";
            // kdim and vdim given, so that they do not default to the zero embed_dim (which would refuse it too).
            if (which == 0) config.embed_dim = 0, config.kdim = E, config.vdim = E;
            if (which == 1) config.num_heads = 0;
            if (which == 2) config.num_kv_heads = 0;
            if (which == 3) config.kdim = 0;
            if (which == 4) config.vdim = 0;
            expected_kind = "ConfigError", keyword = "every size must be >= 1 (";
            keyword += "embed_dim=" + std::to_string(config.embed_dim) + ", num_heads=" + std::to_string(config.num_heads) +
                       ", num_kv_heads=" + std::to_string(config.num_kv_heads.value_or(config.num_heads)) +
                       ", kdim=" + std::to_string(config.kdim.value_or(config.embed_dim)) +
                       ", vdim=" + std::to_string(config.vdim.value_or(config.embed_dim)) + ")";
            call = [&] { (void)module(config); };
            break;
        }
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
        case Refusal::PackedShape: {
            // A packed weight or bias one column or element off, on a module that takes packed parameters.
            config.num_kv_heads = H;
            const bool weight = rng.below(2) == 0;
            what = weight ? "set_in_proj_weight given (" + std::to_string(3 * E) + ", " + std::to_string(E + 1) + ")"
                          : "set_in_proj_bias given (" + std::to_string(3 * E + 1) + ")";
            expected_kind = "ShapeError";
            keyword = weight ? "in_proj_weight must be [" + std::to_string(3 * E) + "," + std::to_string(E) + "] = (3E, E), got [" +
                                   std::to_string(3 * E) + "," + std::to_string(E + 1) + "]"
                             : "in_proj_bias must be [" + std::to_string(3 * E) + "] = (3E), got [" + std::to_string(3 * E + 1) + "]";
            call = [&, weight] {
                if (weight) module(config).set_in_proj_weight(normal_tensor<T>({3 * E, E + 1}, rng).view());
                else module(config).set_in_proj_bias(normal_tensor<T>({3 * E + 1}, rng).view());
            };
            break;
        }
        case Refusal::HeadPathShape: {
            // multi_head_sdpa, the head path on projected states, given inconsistent shapes: one of six.
            Shape qs{B, Tq, H * Dh}, ks{B, Tk, G * Dh}, vs{B, Tk, G * Dh};
            Index heads = H, kv_heads = G;
            const std::uint64_t which = rng.below(9);
            MhaOptions head_options;
            expected_kind = "ShapeError";
            if (which == 0) {
                heads = G == 1 ? 3 : G + 1, kv_heads = G == 1 ? 2 : G;
                expected_kind = "ConfigError";
                keyword = "num_heads=" + std::to_string(heads) + " must be a positive multiple of num_kv_heads=" + std::to_string(kv_heads);
            }
            if (which == 1) qs = {B, Tq * H * Dh}, keyword = "must be (B, T, heads*D)";
            if (which == 2) vs[0] = B + 1, keyword = "must have the same B";
            if (which == 3) vs[1] = Tk + 1, keyword = "k_projected has Tk=" + std::to_string(Tk) + " but v_projected has Tk=" + std::to_string(Tk + 1);
            if (which == 4) ks[2] = G * Dh + 1, keyword = "k_projected width must be num_kv_heads * Dk = " + std::to_string(G) + "*" +
                                                        std::to_string(Dh) + ", got " + std::to_string(G * Dh + 1);
            if (which == 5) vs[2] = G * Dh + 1,
                            keyword = "v_projected width " + std::to_string(G * Dh + 1) + " is not a multiple of num_kv_heads=" + std::to_string(G);
            if (which == 5 && G == 1) vs[2] = 2 * Dh + 1, heads = kv_heads = 2, ks[2] = 2 * Dh, qs[2] = 2 * Dh,
                                      keyword = "v_projected width " + std::to_string(2 * Dh + 1) + " is not a multiple of num_kv_heads=2";
            if (which == 7) {
                // q_projected one column wider than num_heads heads of Dh (two heads at least, so that it does not
                // divide).
                if (H == 1) heads = kv_heads = 2, ks[2] = vs[2] = 2 * Dh;
                qs[2] = heads * Dh + 1;
                keyword = "q_projected width " + std::to_string(qs[2]) + " is not a multiple of num_heads=" + std::to_string(heads);
            }
            if (which == 6) head_options.tiled_key_block = -1, expected_kind = "ConfigError",
                            keyword = "tiled_query_block and tiled_key_block must be >= 0";
            // 8: the backward given a dout one column wider than the context (B, Tq, num_heads*Dv).
            const bool backward = which == 8;
            if (backward) keyword = "dout must have the context's shape (B, Tq, num_heads*Dv)";
            what = std::string(which == 6 ? "tiled_key_block -1: " : "") + (backward ? "multi_head_sdpa_backward, dout one column wide too many, " : "") +
                   "multi_head_sdpa with q_projected " + to_string(qs) + ", k_projected " + to_string(ks) + ", v_projected " +
                   to_string(vs) + ", num_heads " + std::to_string(heads) + ", num_kv_heads " + std::to_string(kv_heads);
            call = [&, qs, ks, vs, heads, kv_heads, head_options, backward] {
                const Tensor<T> q = normal_tensor<T>(qs, rng), k = normal_tensor<T>(ks, rng), v = normal_tensor<T>(vs, rng);
                if (!backward) {
                    (void)multi_head_sdpa(q.view(), k.view(), v.view(), heads, kv_heads, std::nullopt, head_options);
                    return;
                }
                const Tensor<T> dout = normal_tensor<T>({qs[0], qs[1], heads * Dh + 1}, rng);
                (void)multi_head_sdpa_backward(q.view(), k.view(), v.view(), dout.view(), heads, kv_heads, std::nullopt,
                                               head_options);
            };
            break;
        }
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
        case Refusal::NonFiniteParameter: {
            // One of the eight parameters, a NaN or an Inf at a random place of it.
            const char* const names[] = {"q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj_weight",
                                         "q_proj_bias",   "k_proj_bias",   "v_proj_bias",   "out_proj_bias"};
            const std::size_t which = rng.below(8);
            const bool nan = rng.below(2) == 0;
            const T bad = nan ? std::numeric_limits<T>::quiet_NaN() : std::numeric_limits<T>::infinity();
            // k and v project to the kv heads' width G * Dh; the others to E. Every input width is E.
            const Index rows = which % 4 == 1 || which % 4 == 2 ? G * Dh : E;
            const Index place = static_cast<Index>(rng.below(static_cast<std::uint64_t>(which < 4 ? rows * E : rows)));
            const std::string shape = which < 4 ? "[" + std::to_string(rows) + "," + std::to_string(E) + "]" : "[" + std::to_string(rows) + "]";
            const std::string where = which < 4 ? "row " + std::to_string(place / E) + ", column " + std::to_string(place % E)
                                                : "index " + std::to_string(place);
            what = std::string("a ") + (nan ? "NaN" : "Inf") + " in " + names[which] + " at " + where;
            expected_kind = "ValueError";
            keyword = std::string("MultiHeadAttention::forward_self: ") + names[which] + " " + shape + " holds " +
                      (nan ? "nan" : "inf") + " at " + where;
            call = [&, which, bad, place] {
                MultiHeadAttention<T> m = module(config);
                const auto set = [&](TensorView<const T> current, auto setter) {
                    Tensor<T> p = Tensor<T>::copy_of(current);
                    p[place] = bad;
                    (m.*setter)(p.view());
                };
                using M = MultiHeadAttention<T>;
                switch (which) {
                    case 0: set(m.q_proj_weight(), &M::set_q_proj_weight); break;
                    case 1: set(m.k_proj_weight(), &M::set_k_proj_weight); break;
                    case 2: set(m.v_proj_weight(), &M::set_v_proj_weight); break;
                    case 3: set(m.out_proj_weight(), &M::set_out_proj_weight); break;
                    case 4: set(m.q_proj_bias(), &M::set_q_proj_bias); break;
                    case 5: set(m.k_proj_bias(), &M::set_k_proj_bias); break;
                    case 6: set(m.v_proj_bias(), &M::set_v_proj_bias); break;
                    default: set(m.out_proj_bias(), &M::set_out_proj_bias); break;
                }
                (void)m.forward_self(xq.view());
            };
            break;
        }
        case Refusal::StatesShape: {
            // forward's states or masks of a shape the module cannot take: one of six.
            const std::uint64_t which = rng.below(6);
            Shape qs{B, Tq, E}, ks{B, Tk, E}, vs{B, Tk, E};
            std::optional<Shape> mask_shape, padding_shape;
            expected_kind = "ShapeError";
            if (which == 0) qs = {B * Tq, E}, keyword = "inputs must be (B, T, features)";
            if (which == 1) vs[0] = B + 1, keyword = "query, key and value states must have the same B";
            if (which == 2) vs[1] = Tk + 1, keyword = "key_states has Tk=" + std::to_string(Tk) + " but value_states has Tk=" + std::to_string(Tk + 1);
            if (which == 3) mask_shape = Shape{1, B, H, Tq, Tk}, keyword = "must be 2-D (Tq, Tk), 3-D (B, Tq, Tk) or 4-D (B, H, Tq, Tk)";
            if (which == 4) mask_shape = Shape{Tq + 1, Tk}, keyword = "does not broadcast to (B, H, Tq, Tk)";
            if (which == 5) padding_shape = Shape{B, Tk + 1}, keyword = "key_padding_allowed must be (B, Tk)";
            what = "forward with query " + to_string(qs) + ", key " + to_string(ks) + ", value " + to_string(vs) +
                   (mask_shape ? ", mask " + to_string(*mask_shape) : "") +
                   (padding_shape ? ", key padding " + to_string(*padding_shape) : "");
            call = [&, qs, ks, vs, mask_shape, padding_shape] {
                const Tensor<T> q = normal_tensor<T>(qs, rng), k = normal_tensor<T>(ks, rng), v = normal_tensor<T>(vs, rng);
                const Tensor<bool> mask(mask_shape.value_or(Shape{Tq, Tk}), true);
                const Tensor<bool> padding(padding_shape.value_or(Shape{B, Tk}), true);
                MhaOptions options;
                if (padding_shape) options.key_padding_allowed = padding.view();
                std::optional<TensorView<const bool>> allowed;
                if (mask_shape) allowed = mask.view();
                (void)module(config).forward(q.view(), k.view(), v.view(), allowed, options);
            };
            break;
        }
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
                 "shape of a parameter, a state, a mask or key padding, key padding given twice, a negative block size, a "
                 "non-finite parameter) throws ConfigError or ShapeError with a "
                 "message naming what is wrong.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None, .small = true, .softcap = false}); };
    p.applies = [](const Implementation& impl) { return impl.name == "mha"; };
    p.breadth = 16;  // many refusals (and kinds within them), one per case, each cheap: every kind drawn in every run
    p.check = [](const Implementation&, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict { return refusal_check<T>(c); });
    };
    return p;
}

}  // namespace attn::suite
