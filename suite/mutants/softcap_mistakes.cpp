// Mutants: the soft-capping mistakes real ports make. Each replaces the cap of the naive computation
// (naive.hpp, cap_scores) with its wrong one; everything else is correct.
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {

enum class CapMistake {
    AfterMask,        // the cap applied after the mask: a blocked key's -inf becomes -c, a weight above 0
    NoDivision,       // c tanh(s) instead of c tanh(s / c)
    BeforeScale,      // the raw dot product capped, then scaled: scale c tanh(q.k / c)
};

template <CapMistake M>
struct WrongCap {
    template <class T>
    static void weights(const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
        const T c = static_cast<T>(p.softcap), scale = default_scale(p);
        w = scores(p, b, M == CapMistake::BeforeScale ? T(1) : scale);
        if (M == CapMistake::AfterMask) mask_scores(p, b, w);
        if (c != 0)
            for (T& x : w) {
                if (M == CapMistake::NoDivision) x = c * std::tanh(x);
                else x = c * std::tanh(x / c);
                if (M == CapMistake::BeforeScale) x *= scale;
            }
        if (c == 0 && M == CapMistake::BeforeScale)
            for (T& x : w) x *= scale;
        if (M != CapMistake::AfterMask) mask_scores(p, b, w);
        softmax_rows(w, p.Tq, p.Tk);
    }
};

}  // namespace

Implementation softcap_after_mask() {
    return weights_mutant<WrongCap<CapMistake::AfterMask>, false>(
        "softcap_after_mask", "the softcap is applied after the mask, so a blocked key gets the logit -softcap");
}
Implementation softcap_without_division() {
    return weights_mutant<WrongCap<CapMistake::NoDivision>, false>(
        "softcap_without_division", "the softcap computes c tanh(s) instead of c tanh(s / c)");
}
Implementation softcap_before_scale() {
    return weights_mutant<WrongCap<CapMistake::BeforeScale>, false>(
        "softcap_before_scale", "the softcap caps the raw dot product and scales after it");
}

}  // namespace attn::suite::mutant
