// Mutants: the ALiBi mistakes real ports make. Each replaces ALiBi's term of the naive computation (naive.hpp,
// SdpaProblem::bias_at) with its wrong one; the explicit bias and everything else is correct.
#include <cstdlib>

#include "naive.hpp"

namespace attn::suite::mutant {
namespace {

enum class AlibiMistake {
    WrongSign,  // +m |i + Tk - Tq - j|: far keys favoured
    TopLeft,    // -m |i - j|: the distance measured top-left, wrong whenever Tq != Tk
};

template <AlibiMistake M>
struct WrongAlibi {
    template <class T>
    static void weights(const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
        w = scores(p, b, default_scale(p));
        cap_scores(p, w);
        for (Index i = 0; i < p.Tq; ++i)
            for (Index j = 0; j < p.Tk; ++j) {
                T& x = w[static_cast<std::size_t>(i * p.Tk + j)];
                if (p.bias) x += p.explicit_bias(b, i, j);
                if (!p.alibi) continue;
                const Index d = M == AlibiMistake::TopLeft ? std::abs(i - j) : p.alibi_distance(i, j);
                const T term = p.alibi_slope(b) * static_cast<T>(d);
                x += M == AlibiMistake::WrongSign ? term : -term;
            }
        mask_scores(p, b, w);
        softmax_rows(w, p.Tq, p.Tk);
    }
};

}  // namespace

Implementation alibi_wrong_sign() {
    return weights_mutant<WrongAlibi<AlibiMistake::WrongSign>, true>(
        "alibi_wrong_sign", "ALiBi adds +slope |i + Tk - Tq - j|, favouring far keys");
}
Implementation alibi_top_left() {
    return weights_mutant<WrongAlibi<AlibiMistake::TopLeft>, true>(
        "alibi_top_left", "ALiBi measures the distance top-left, |i - j|, instead of |i + Tk - Tq - j|");
}

}  // namespace attn::suite::mutant
