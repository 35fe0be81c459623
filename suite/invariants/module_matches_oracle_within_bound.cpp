// Invariant 18: the MultiHeadAttention module, its parameters set through every setter (one by one or packed,
// biases non-zero or absent, kdim and vdim apart from E, grouped K/V heads), called through every forward (forward,
// forward_blocked, forward_cross, forward_self) with every mask form it takes (2-D, 3-D, 4-D, key padding from a
// tensor or from token ids, causal),
// float masks (bias, key padding bias) and ALiBi slopes,
// every empty-row policy and both SDPA backends, in every dtype (16-bit storage included), matches the oracle's
// multi-head attention within its bound; the head-average weights are the per-head weights summed in head order
// (in the compute type) over H, bitwise.
//
// No SDPA mutant reaches the module (it calls the library's SDPA), so none is killed here: this property guards the
// module's own contract (projections, biases, setters, mask forms) against the oracle's independent module.
#include <limits>

#include "../checks.hpp"
#include "attn/mask.hpp"
#include "attn/mha.hpp"
#include "attn/oracle/mha.hpp"

namespace attn::suite {

namespace {

template <class T>
Tensor<T> random_tensor(const Shape& shape, double amplitude, Rng& rng) {
    Tensor<T> t(shape);
    for (Index f = 0; f < t.numel(); ++f) t[f] = static_cast<T>(rng.uniform(-amplitude, amplitude));
    return t;
}

// The module of the case (from aux_seed): head_dim min(Dk, 8) keeps the oracle's projections cheap.
template <class T>
MultiHeadAttention<T> module_for(const SdpaCase& c, Rng& rng, std::string& setters) {
    MhaConfig config;
    const Index Dh = std::min<Index>(c.Dk, 8), E = c.H * Dh, G = c.kv_heads;
    config.embed_dim = E;
    config.num_heads = c.H;
    config.num_kv_heads = G;
    const int widths = static_cast<int>(rng.below(3));  // kdim = vdim = E, kdim = vdim != E, kdim != vdim
    config.kdim = widths == 0 ? E : 1 + static_cast<Index>(rng.below(12));
    config.vdim = widths == 0 ? E : widths == 1 ? *config.kdim : 1 + static_cast<Index>(rng.below(12));
    config.bias = rng.below(4) != 0;
    config.init_seed = rng.next();
    MultiHeadAttention<T> m(config);
    const Index KV = G * Dh, kdim = m.kdim(), vdim = m.vdim();
    if (rng.below(5) == 0) {  // the constructor's initialisation as it is
        setters = "init";
        return m;
    }
    const double a = 1.0 / std::sqrt(static_cast<double>(E));
    if (G == c.H && kdim == E && vdim == E && rng.below(2)) {
        const Tensor<T> packed = random_tensor<T>({3 * E, E}, a, rng);  // (3E, E) = [q; k; v]
        m.set_in_proj_weight(packed.view());
        for (Index x = 0; x < E * E; ++x)
            if (!same_bits(m.q_proj_weight().data()[x], packed[x]) || !same_bits(m.k_proj_weight().data()[x], packed[E * E + x]) ||
                !same_bits(m.v_proj_weight().data()[x], packed[2 * E * E + x]))
                throw ValueError("set_in_proj_weight: rows of the packed weight not where the getters read them");
        setters = "in_proj_weight";
    } else {
        m.set_q_proj_weight(random_tensor<T>({E, E}, a, rng).view());
        m.set_k_proj_weight(random_tensor<T>({KV, kdim}, 1.0 / std::sqrt(static_cast<double>(kdim)), rng).view());
        m.set_v_proj_weight(random_tensor<T>({KV, vdim}, 1.0 / std::sqrt(static_cast<double>(vdim)), rng).view());
        setters = "q/k/v_proj_weight";
    }
    m.set_out_proj_weight(random_tensor<T>({E, E}, a, rng).view());
    if (m.has_bias()) {
        if (G == c.H && rng.below(2)) {
            const Tensor<T> packed = random_tensor<T>({3 * E}, 0.5, rng);  // (3E) = [q; k; v]
            m.set_in_proj_bias(packed.view());
            for (Index x = 0; x < E; ++x)
                if (!same_bits(m.q_proj_bias().data()[x], packed[x]) || !same_bits(m.k_proj_bias().data()[x], packed[E + x]) ||
                    !same_bits(m.v_proj_bias().data()[x], packed[2 * E + x]))
                    throw ValueError("set_in_proj_bias: parts of the packed bias not where the getters read them");
            setters += ", in_proj_bias";
        } else {
            m.set_q_proj_bias(random_tensor<T>({E}, 0.5, rng).view());
            m.set_k_proj_bias(random_tensor<T>({KV}, 0.5, rng).view());
            m.set_v_proj_bias(random_tensor<T>({KV}, 0.5, rng).view());
            setters += ", q/k/v_proj_bias";
        }
        m.set_out_proj_bias(random_tensor<T>({E}, 0.5, rng).view());
    }
    return m;
}

// The call: states, the mask in one of the forms the module takes, options.
template <class T>
struct ModuleCall {
    Tensor<T> xq, xk, xv;
    std::optional<Tensor<bool>> mask, padding;
    MhaOptions options;
    int forward = 0;  // 0 forward, 1 forward_blocked, 2 forward_cross, 3 forward_self
    std::string what;
    // The float masks and ALiBi slopes (MhaOptions::bias, key_padding_bias, alibi_slopes), owned here.
    std::optional<Tensor<T>> bias, padding_bias, slopes;
    // `o` with views of them: the module and the oracle get the same tensors.
    MhaOptions with_bias(MhaOptions o) const {
        if (bias) o.bias = *bias;
        if (padding_bias) o.key_padding_bias = *padding_bias;
        if (slopes) o.alibi_slopes = *slopes;
        return o;
    }
};

// The case's bias in a form the module takes: (Tq, Tk) as 2-D, (B, H, Tq, Tk) as 4-D, any other written out to
// (B, H, Tq, Tk) (the module reads a 3-D bias as (B, Tq, Tk), not NumPy's (H, Tq, Tk)); one call in two a float key
// padding (B, Tk) on top (the merge of the two is a shape computation of its own), with a -inf for one key in eight (summed with the bias in the dtype, as PyTorch does);
// the case's ALiBi slopes, (H) or (B, H), as they are.
template <class T>
std::string draw_bias(const SdpaCase& c, ModuleCall<T>& call, Rng& rng) {
    std::string what;
    if (c.bias) {
        const Index rank = c.bias->rank();
        const bool as_is = (rank == 2 && c.bias->dim(0) == c.Tq) || rank == 4;
        call.bias = cast_tensor<T>(as_is ? *c.bias : expanded_bias(c));
        what += ", bias " + to_string(call.bias->shape());
    }
    if (rng.below(2) == 0 && (c.bias || c.alibi_slopes)) {
        Tensor<T> padding({c.B, c.Tk});
        for (Index f = 0; f < padding.numel(); ++f)
            padding[f] = static_cast<T>(rng.below(8) == 0 ? -std::numeric_limits<double>::infinity() : rng.uniform(-2, 2));
        call.padding_bias = std::move(padding);
        what += ", key_padding_bias";
    }
    if (c.alibi_slopes) {
        call.slopes = cast_tensor<T>(*c.alibi_slopes);
        what += ", alibi_slopes " + to_string(call.slopes->shape());
    }
    return what;
}

template <class T>
ModuleCall<T> call_for(const SdpaCase& c, const MultiHeadAttention<T>& m, Rng& rng) {
    ModuleCall<T> call;
    const double amplitudes[] = {0.5, 1.0, 3.0};
    const double amplitude = amplitudes[rng.below(3)];
    call.xq = random_tensor<T>({c.B, c.Tq, m.embed_dim()}, amplitude, rng);
    call.xk = random_tensor<T>({c.B, c.Tk, m.kdim()}, amplitude, rng);
    call.xv = random_tensor<T>({c.B, c.Tk, m.vdim()}, amplitude, rng);
    call.forward = static_cast<int>(rng.below(4));
    if (call.forward == 2 && m.kdim() != m.vdim()) call.forward = 0;
    if (call.forward == 3 && (c.Tq != c.Tk || m.kdim() != m.embed_dim() || m.vdim() != m.embed_dim())) call.forward = 0;
    if (call.forward == 2) call.xv = call.xk;
    if (call.forward == 3) call.xk = call.xq, call.xv = call.xq;
    // The mask: 4-D (B, H, Tq, Tk) with the causal rule folded in, its head-0 slice as 3-D (B, Tq, Tk), or the
    // case's own form (2-D or 4-D tensor, padding as key_padding_allowed (B, Tk), the causal option).
    MhaOptions& o = call.options;
    o.softcap = c.options.softcap;  // soft-capping of every head, whatever the mask's form
    const bool masked = c.allowed_mask || c.options.is_causal || c.options.window;
    const int form = masked ? static_cast<int>(rng.below(3)) : 3;
    const Tensor<bool> full = expanded_allowed(c);  // (B, H, Tq, Tk)
    if (form == 0) {
        call.mask = full;
    } else if (form == 1) {
        Tensor<bool> head0({c.B, c.Tq, c.Tk});
        for (Index b = 0; b < c.B; ++b)
            for (Index f = 0; f < c.Tq * c.Tk; ++f) head0[b * c.Tq * c.Tk + f] = full[b * c.H * c.Tq * c.Tk + f];
        call.mask = std::move(head0);
    } else if (form == 2) {
        o.is_causal = c.options.is_causal;
        o.alignment = c.options.alignment;
        o.window = c.options.window;
        if (c.allowed_mask && c.mask_kind == "padding") {
            Tensor<bool> pad({c.B, c.Tk});
            for (Index f = 0; f < pad.numel(); ++f) pad[f] = (*c.allowed_mask)[f];  // (B, 1, 1, Tk) in the same order
            call.padding = std::move(pad);
        } else if (c.allowed_mask && c.allowed_mask->rank() != 3) {
            call.mask = *c.allowed_mask;
        } else if (c.allowed_mask) {
            call.mask = full, o.is_causal = false, o.window.reset();
        }
    }
    if (!call.padding && rng.below(4) == 0) {
        // Key padding from token ids (key_padding_allowed_mask; no id is the pad id, so every key stays real), and-ed
        // with the mask.
        Tensor<std::int64_t> token_ids({c.B, c.Tk});
        for (Index f = 0; f < token_ids.numel(); ++f) token_ids[f] = 1 + static_cast<std::int64_t>(rng.below(100));
        call.padding = key_padding_allowed_mask(token_ids.view(), 0).reshaped({c.B, c.Tk});
    }
    o.empty_rows = c.options.empty_rows;
    if (c.has_empty_rows()) {
        const int policy = static_cast<int>(rng.below(3));
        o.empty_rows = policy == 0 ? EmptyRowPolicy::Throw : policy == 1 ? EmptyRowPolicy::Zero : EmptyRowPolicy::Nan;
    }
    o.scale = c.options.scale;
    o.num_threads = c.options.num_threads;
    o.backend = rng.below(2) ? Backend::Reference : Backend::Tiled;
    if (o.backend == Backend::Reference) {
        const int w = static_cast<int>(rng.below(3));
        o.weights = w == 0 ? MhaWeights::None : w == 1 ? MhaWeights::PerHead : MhaWeights::HeadAverage;
    }
    const std::string bias = draw_bias(c, call, rng);
    static const char* forwards[] = {"forward", "forward_blocked", "forward_cross", "forward_self"};
    call.what = std::string(forwards[call.forward]) + ", mask form " + std::to_string(form) +
                (call.padding ? " + key padding" : "") + bias + ", backend " + to_string(o.backend) + ", empty rows " +
                to_string(o.empty_rows);
    return call;
}

template <class T>
MhaResult<T> run_module(const MultiHeadAttention<T>& m, const ModuleCall<T>& call, const MhaOptions& options) {
    std::optional<TensorView<const bool>> mask;
    if (call.mask) mask = call.mask->view();
    MhaOptions o = call.with_bias(options);
    if (call.forward == 1) {
        std::optional<Tensor<bool>> blocked, padding_blocked;
        if (call.mask) blocked = allowed_to_blocked(call.mask->view());
        if (call.padding) padding_blocked = allowed_to_blocked(call.padding->view());
        std::optional<TensorView<const bool>> bv, pv;
        if (blocked) bv = blocked->view();
        if (padding_blocked) pv = padding_blocked->view();
        return m.forward_blocked(call.xq.view(), call.xk.view(), call.xv.view(), bv, pv, o);
    }
    if (call.padding) o.key_padding_allowed = call.padding->view();
    if (call.forward == 2) return m.forward_cross(call.xq.view(), call.xk.view(), mask, o);
    if (call.forward == 3) return m.forward_self(call.xq.view(), mask, o);
    return m.forward(call.xq.view(), call.xk.view(), call.xv.view(), mask, o);
}

template <class T>
Verdict module_check(const SdpaCase& c) {
    Rng rng(c.aux_seed);
    std::string setters;
    const MultiHeadAttention<T> m = module_for<T>(c, rng, setters);
    const ModuleCall<T> call = call_for<T>(c, m, rng);
    const std::string what = "MultiHeadAttention (" + setters + "; " + call.what + ")";
    std::optional<TensorView<const bool>> mask;
    if (call.mask) mask = call.mask->view();
    MhaOptions oracle_options = call.with_bias(call.options);
    if (call.padding) oracle_options.key_padding_allowed = call.padding->view();
    oracle::OracleOptions oo;
    // The tiled backend is covered by the conservative generic model (as in oracle/tests/mha_oracle_test.cpp).
    oo.model = call.options.backend == Backend::Reference ? oracle::reference_model() : oracle::generic_model();
    std::optional<oracle::Result<T>> expected;
    std::optional<MhaResult<T>> got;
    std::string oracle_error, module_error;
    try {
        expected = oracle::multi_head_attention<T>(m, call.xq.view(), call.xk.view(), call.xv.view(), mask, oracle_options, oo);
    } catch (const MaskError& e) {
        oracle_error = e.what();
    }
    try {
        got = run_module(m, call, call.options);
    } catch (const MaskError& e) {
        module_error = e.what();
    }
    // An empty row under EmptyRowPolicy::Throw: both reject the call.
    if (oracle_error.empty() != module_error.empty())
        return what + ": the oracle " + (oracle_error.empty() ? "accepted the call" : "threw: " + oracle_error) +
               " but the module " + (module_error.empty() ? "accepted it" : "threw: " + module_error);
    if (!expected) return std::nullopt;
    if (Verdict v = within_bound(got->output, *expected, what + " vs oracle::multi_head_attention")) return v;
    if (call.forward == 0) {
        // The output must not depend on the states' strides (the module copies a layout BLIS cannot take as it is):
        // the query states as a column-major view, (B, Tq, E) over (B, E, Tq) storage, give bitwise the same output.
        const Index E = m.embed_dim();
        Tensor<T> columns({c.B, E, c.Tq});
        for (Index b = 0; b < c.B; ++b)
            for (Index t = 0; t < c.Tq; ++t)
                for (Index e = 0; e < E; ++e) columns[(b * E + e) * c.Tq + t] = call.xq[(b * c.Tq + t) * E + e];
        const TensorView<const T> strided(columns.data(), {c.B, c.Tq, E}, {E * c.Tq, 1, c.Tq});
        MhaOptions o = call.with_bias(call.options);
        if (call.padding) o.key_padding_allowed = call.padding->view();
        const MhaResult<T> again = m.forward(strided, call.xk.view(), call.xv.view(), mask, o);
        if (Verdict v = bitwise_equal(c, again.output, got->output, what + ", column-major query states vs contiguous"))
            return v;
    }
    if (call.options.weights == MhaWeights::HeadAverage) {
        MhaOptions per_head = call.options;
        per_head.weights = MhaWeights::PerHead;
        const MhaResult<T> heads = run_module(m, call, per_head);
        const Index H = c.H, plane = c.Tq * c.Tk;
        for (Index b = 0; b < c.B; ++b)
            for (Index f = 0; f < plane; ++f) {
                using C = compute_t<T>;  // summed in the type the module computes in, rounded to T once
                C sum = 0;
                for (Index h = 0; h < H; ++h) sum += static_cast<C>((*heads.weights)[(b * H + h) * plane + f]);
                const T want = static_cast<T>(sum / static_cast<C>(H));
                const T average = (*got->weights)[b * plane + f];
                if (!same_bits(average, want))
                    return what + ": head-average weight " + num(average) + " at batch " + std::to_string(b) +
                           ", flat index " + std::to_string(f) + " is not the per-head sum over H " + num(want);
            }
    }
    return std::nullopt;
}

}  // namespace

Property module_matches_oracle_within_bound() {
    Property p;
    p.name = "module_matches_oracle_within_bound";
    p.sentence = "MultiHeadAttention, its parameters set through every setter and called through every forward, mask "
                 "form, float mask, ALiBi, empty-row policy and backend, matches the oracle's multi-head attention within its bound; "
                 "query states in a column-major layout give bitwise the same output.";
    p.generator = [](Dtype d) {
        return rc::gen::weightedOneOf<SdpaCase>(
            {{3, gen::sdpa_case(d, {.small = true, .bias = true})},
             {1, gen::sdpa_case(d, {.masks = gen::Masks::EmptyRows, .small = true, .bias = true})}});
    };
    p.applies = [](const Implementation& impl) { return impl.name == "mha"; };
    p.cost = 3;
    p.check = [](const Implementation&, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict { return module_check<T>(c); });
    };
    return p;
}

}  // namespace attn::suite
