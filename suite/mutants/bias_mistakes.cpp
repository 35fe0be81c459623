// Mutants: the additive-bias mistakes real ports make. Each replaces the bias of the naive computation (naive.hpp,
// bias_scores) with its wrong one; everything else is correct.
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {

enum class BiasMistake {
    BeforeScale,   // the bias added to the raw dot product, then scaled: scale (q.k + bias)
    FirstRowOnly,  // the bias broadcast over the wrong axis: query 0's row of it used for every query
};

template <BiasMistake M>
struct WrongBias {
    template <class T>
    static void weights(const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
        const T scale = default_scale(p);
        w = scores(p, b, M == BiasMistake::BeforeScale ? T(1) : scale);
        if (M == BiasMistake::BeforeScale) {
            bias_scores(p, b, w);
            for (T& x : w) x *= scale;
        }
        cap_scores(p, w);
        if (M == BiasMistake::FirstRowOnly && p.has_bias())
            for (Index i = 0; i < p.Tq; ++i)
                for (Index j = 0; j < p.Tk; ++j) w[static_cast<std::size_t>(i * p.Tk + j)] += p.bias_at(b, 0, j);
        mask_scores(p, b, w);
        softmax_rows(w, p.Tq, p.Tk);
    }
};

}  // namespace

Implementation bias_before_scale() {
    return weights_mutant<WrongBias<BiasMistake::BeforeScale>, true>(
        "bias_before_scale", "the bias is added to the raw dot product, which is scaled after it");
}
Implementation bias_broadcast_over_queries() {
    return weights_mutant<WrongBias<BiasMistake::FirstRowOnly>, true>(
        "bias_broadcast_over_queries", "the bias of query 0 is used for every query (broadcast over the wrong axis)");
}

}  // namespace attn::suite::mutant
