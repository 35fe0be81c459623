// Mutants: the sliding-window mistakes real ports make. Each turns the window option into an explicit mask built with
// its wrong rule (and-ed with the caller's mask), so everything else is the correct naive computation.
#include "attn/mask.hpp"
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {

enum class WindowMistake {
    LeftOffByOne,      // i + d - left - 1 <= j: one more past key
    RightOffByOne,     // j <= i + d + right + 1: one more future key
    RightSideIgnored,  // the right side read as -1 (unbounded): a causal-style window leaks the future
    TopLeftAlways,     // d = 0 whatever the alignment (JAX's rule where FlashAttention's was asked)
};

template <WindowMistake M>
struct WrongWindow {
    template <class T>
    struct Steps {
        static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
            if (!o.window) return mutant::run<T>(name, q, k, v, m, o, {});
            const Index Tq = q.dim(-2), Tk = k.dim(-2);
            const SlidingWindow w = *o.window;
            Tensor<bool> rule({Tq, Tk});
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j) {
                    const bool top_left = w.alignment == CausalAlignment::TopLeft || M == WindowMistake::TopLeftAlways;
                    const Index d = top_left ? i : i + Tk - Tq;
                    const Index left = w.left + (M == WindowMistake::LeftOffByOne && w.left >= 0 ? 1 : 0);
                    const Index right = M == WindowMistake::RightSideIgnored ? -1
                                        : w.right + (M == WindowMistake::RightOffByOne && w.right >= 0 ? 1 : 0);
                    rule[i * Tk + j] = (left < 0 || d - left <= j) && (right < 0 || j <= d + right);
                }
            SdpaOptions wrong = o;
            wrong.window.reset();
            if (!m) return mutant::run<T>(name, q, k, v, rule.view(), wrong, {});
            const Tensor<bool> both = logical_and(*m, rule.view());
            return mutant::run<T>(name, q, k, v, both.view(), wrong, {});
        }
    };
};

}  // namespace

Implementation window_left_off_by_one() {
    return make_mutant<WrongWindow<WindowMistake::LeftOffByOne>::Steps>(
        "window_left_off_by_one", "the sliding window's left edge lets each query read one past key too many");
}
Implementation window_right_off_by_one() {
    return make_mutant<WrongWindow<WindowMistake::RightOffByOne>::Steps>(
        "window_right_off_by_one", "the sliding window's right edge lets each query read one future key too many");
}
Implementation window_right_side_ignored() {
    return make_mutant<WrongWindow<WindowMistake::RightSideIgnored>::Steps>(
        "window_right_side_ignored", "the sliding window's right side is ignored (read as unbounded)");
}
Implementation window_always_top_left() {
    return make_mutant<WrongWindow<WindowMistake::TopLeftAlways>::Steps>(
        "window_always_top_left", "a bottom-right sliding window is applied top-left (JAX's alignment)");
}

}  // namespace attn::suite::mutant
