// Invariant 23: the layout of q, k and v in memory is not part of the input: views with every stride doubled
// (gaps between elements) or with their last two dims transposed (column-major matrices) give bitwise the output of
// the contiguous tensors, and a NaN in them is refused with the same message (naming the same position). The generators pass contiguous tensors, so without this property the kernels' strided
// reads (the element stride of a row, the row stride) would be unchecked.
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property strided_inputs_give_the_bits_of_contiguous_ones() {
    Property p;
    p.name = "strided_inputs_give_the_bits_of_contiguous_ones";
    p.sentence = "q, k and v as strided views (gaps between elements, or column-major matrices) give bitwise the output "
                 "of the same values stored contiguously, and a NaN among them the same refusal.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.bias = true}); };
    p.applies = is_library_path;
    p.check = [](const Implementation& impl, const SdpaCase& c0) -> Verdict {
        Rng rng(c0.aux_seed);
        const int lq = static_cast<int>(rng.below(3)), lk = static_cast<int>(rng.below(3)), lv = static_cast<int>(rng.below(3));
        if (lq + lk + lv == 0) return std::nullopt;  // all contiguous: nothing to compare
        // One case in three holds a NaN somewhere in q, k or v, with check_finite on: the strided call must then be
        // refused with the very message of the contiguous one (the position it names included), or both accepted.
        SdpaCase c = c0;
        std::string poisoned;
        if (rng.below(3) == 0) {
            const std::uint64_t which = rng.below(3);
            Tensor<double>& t = which == 0 ? c.q : which == 1 ? c.k : c.v;
            const Index f = static_cast<Index>(rng.below(static_cast<std::uint64_t>(std::max<Index>(1, t.numel()))));
            if (t.numel() > 0) t[f] = std::numeric_limits<double>::quiet_NaN();
            c.options.check_finite = true;
            poisoned = std::string(", a NaN in ") + (which == 0 ? "q" : which == 1 ? "k" : "v") + " at flat index " + std::to_string(f);
        }
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const CaseInputs<T> in = make_inputs<T>(c);
            std::vector<T> sq, sk, sv;
            const TensorView<const T> q = relaid(in.q_view, lq, sq), k = relaid(in.k_view, lk, sk), v = relaid(in.v_view, lv, sv);
            const char* names[] = {"contiguous", "strides doubled", "transposed"};
            const std::string what = std::string("q ") + names[lq] + ", k " + names[lk] + ", v " + names[lv] + poisoned;
            // Each call's output, or its error message.
            const auto outcome = [&](TensorView<const T> a, TensorView<const T> b, TensorView<const T> d, std::optional<SdpaResult<T>>& r) {
                return thrown_message([&] { r = impl.run<T>(a, b, d, in.allowed_view, in.with_bias(c.options)); });
            };
            std::optional<SdpaResult<T>> strided, plain;
            const std::string strided_error = outcome(q, k, v, strided), plain_error = outcome(in.q_view, in.k_view, in.v_view, plain);
            if (strided_error != plain_error)
                return what + ": the strided call " + (strided_error.empty() ? "was accepted" : "threw: " + strided_error) +
                       "; the contiguous one " + (plain_error.empty() ? "was accepted" : "threw: " + plain_error);
            if (!plain) return std::nullopt;  // both refused, with the same message
            return bitwise_equal(c, strided->output, plain->output, what + " vs contiguous");
        });
    };
    return p;
}

}  // namespace attn::suite
