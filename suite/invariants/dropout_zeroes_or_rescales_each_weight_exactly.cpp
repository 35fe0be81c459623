// Invariant 19: dropout in training mode, under an explicit seed and step, zeroes each attention weight or keeps it
// multiplied by exactly 1/(1-p) (the evaluation-mode weight times that factor, bitwise; on 16-bit storage the
// float32 product rounded once); which weights it keeps is
// the documented function of (seed, step, b, h, i, j) (MhaConfig::dropout_seed), recomputed here; the same seed and
// step give the same bits again; and the context is the dropped-out weights times v: with v the identity per kv head, the
// head path's context row is the dropped-out weights row, exactly (x * 1 + 0 rounds to nothing), empty rows per
// policy.
//
// The SDPA mutants have no dropout (dropout_without_rescale models one in SDPA form, killed by rows_sum_to_one), so
// none is killed here: this property guards the module's training-mode contract, which no SDPA property reaches.
#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

namespace {

bool equal_or_both_nan(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

template <class T>
Verdict dropout_check(const SdpaCase& c) {
    Rng rng(c.aux_seed);
    const double probabilities[] = {0.1, 0.5, 0.9};
    const MhaDropout dropout{probabilities[rng.below(3)], rng.next()};
    const std::uint64_t step = rng.below(1000);
    const Index Dh = std::min<Index>(c.Dk, 8), E = c.H * Dh, G = c.kv_heads, plane = c.Tq * c.Tk;
    const std::string what = "dropout p=" + num(dropout.p) + ", seed " + std::to_string(dropout.seed) + ", step " +
                             std::to_string(step);
    const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk), causal folded in
    MhaOptions options;
    options.weights = MhaWeights::PerHead;
    options.backend = Backend::Reference;
    options.empty_rows = c.has_empty_rows() ? (rng.below(2) ? EmptyRowPolicy::Zero : EmptyRowPolicy::Nan)
                                                     : c.options.empty_rows;
    options.num_threads = c.options.num_threads;
    options.dropout_step = step;
    // In the type the module computes in: on 16-bit storage the kept weight is the rounded product.
    using C = compute_t<T>;
    const C keep_scale = static_cast<C>(1.0 / (1.0 - dropout.p));
    const auto kept = [&](T e) { return static_cast<T>(static_cast<C>(e) * keep_scale); };

    // 1. The module: training-mode weights against evaluation-mode weights, and the same call again.
    MhaConfig config;
    config.embed_dim = E;
    config.num_heads = c.H;
    config.num_kv_heads = G;
    config.dropout = dropout.p;
    config.dropout_seed = dropout.seed;
    config.init_seed = rng.next();
    const MultiHeadAttention<T> m(config);
    const Tensor<T> xq = normal_tensor<T>({c.B, c.Tq, E}, rng), xkv = normal_tensor<T>({c.B, c.Tk, E}, rng);
    const MhaResult<T> eval = m.forward(xq.view(), xkv.view(), xkv.view(), allowed.view(), options);
    MhaOptions training = options;
    training.training = true;
    const MhaResult<T> train = m.forward(xq.view(), xkv.view(), xkv.view(), allowed.view(), training);
    const MhaResult<T> again = m.forward(xq.view(), xkv.view(), xkv.view(), allowed.view(), training);
    for (Index f = 0; f < train.weights->numel(); ++f) {
        const T t = (*train.weights)[f], e = (*eval.weights)[f];
        if (!(t == T(0) || same_bits(t, kept(e))) && !(std::isnan(t) && std::isnan(e)))
            return what + ": training weight " + num(t) + " at flat index " + std::to_string(f) +
                   " is neither 0 nor the evaluation weight " + num(e) + " times 1/(1-p) = " + num(kept(e));
        // Where the evaluation weight is a non-zero number, the training weight tells whether it was kept.
        if (e != T(0) && std::isfinite(e) && (t != T(0)) != documented_dropout_keep(dropout, step, f))
            return what + ": weight at flat index " + std::to_string(f) + " was " + (t != T(0) ? "kept" : "dropped") +
                   ", but the documented mask (MhaConfig::dropout_seed) " + (t != T(0) ? "drops" : "keeps") + " it";
        if (!same_bits(t, (*again.weights)[f]))
            return what + ": the same seed and step gave weight " + num(t) + " then " + num((*again.weights)[f]) +
                   " at flat index " + std::to_string(f);
    }
    for (Index f = 0; f < train.output.numel(); ++f)
        if (!same_bits(train.output[f], again.output[f]))
            return what + ": the same seed and step gave output " + num(train.output[f]) + " then " +
                   num(again.output[f]) + " at flat index " + std::to_string(f);

    // 2. The head path with v the identity per kv head: v_projected (B, Tk, G*Tk), v[b, j, g*Tk + j] = 1, so
    // context[b, i, h*Tk + j] (B, Tq, H*Tk) is the dropped-out weight (b, h, i, j).
    const Tensor<T> qp = normal_tensor<T>({c.B, c.Tq, c.H * Dh}, rng), kp = normal_tensor<T>({c.B, c.Tk, G * Dh}, rng);
    Tensor<T> vp({c.B, c.Tk, G * c.Tk}, T(0));
    for (Index b = 0; b < c.B; ++b)
        for (Index j = 0; j < c.Tk; ++j)
            for (Index g = 0; g < G; ++g) vp[(b * c.Tk + j) * G * c.Tk + g * c.Tk + j] = T(1);
    const MhaResult<T> head = multi_head_sdpa(qp.view(), kp.view(), vp.view(), c.H, G, allowed.view(), training, dropout);
    for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h)
            for (Index i = 0; i < c.Tq; ++i) {
                bool empty = true;
                for (Index j = 0; j < c.Tk; ++j) empty = empty && !allowed[((b * c.H + h) * c.Tq + i) * c.Tk + j];
                for (Index j = 0; j < c.Tk; ++j) {
                    const T got = head.output[(b * c.Tq + i) * c.H * c.Tk + h * c.Tk + j];
                    const T want = empty ? (options.empty_rows == EmptyRowPolicy::Nan ? std::numeric_limits<T>::quiet_NaN() : T(0))
                                         : (*head.weights)[(b * c.H + h) * plane + i * c.Tk + j];
                    if (!equal_or_both_nan(got, want))
                        return what + ": head-path context [" + std::to_string(b) + "," + std::to_string(i) + "," +
                               std::to_string(h * c.Tk + j) + "] with identity values is " + num(got) + ", expected " +
                               (empty ? "the empty-row value " : "the dropped-out weight ") + num(want);
                }
            }
    return std::nullopt;
}

}  // namespace

Property dropout_zeroes_or_rescales_each_weight_exactly() {
    Property p;
    p.name = "dropout_zeroes_or_rescales_each_weight_exactly";
    p.sentence = "Dropout in training mode, under an explicit seed and step, zeroes each attention weight or multiplies "
                 "it by exactly 1/(1-p), reproducibly, and the context is the dropped-out weights times v.";
    p.generator = [](Dtype d) {
        return rc::gen::weightedOneOf<SdpaCase>({{3, gen::sdpa_case(d, {.small = true, .softcap = false})},
                                                 {1, gen::sdpa_case(d, {.masks = gen::Masks::EmptyRows, .small = true, .softcap = false})}});
    };
    p.applies = [](const Implementation& impl) { return impl.name == "mha"; };
    p.cost = 2;
    p.check = [](const Implementation&, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict { return dropout_check<T>(c); });
    };
    return p;
}

}  // namespace attn::suite
