// Invariant 25: with check_finite off, a query row whose every readable logit is -inf (a -inf in q against keys that
// are all positive in that column: the logits overflow although the row has keys) has no softmax: its outputs are
// NaN, in every column, and the other rows stay finite. The tiled kernel reaches this only through a running sum of
// exactly 0, a branch of its own that no other property enters. A finite bias (or ALiBi) changes none of this: -inf
// plus a finite number is -inf; with one, the tiled kernel adds it by its unchecked path.
#include <cmath>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property a_row_of_minus_infinite_logits_is_nan() {
    Property p;
    p.name = "a_row_of_minus_infinite_logits_is_nan";
    p.sentence = "With check_finite off, a query row whose every readable logit is -inf gives NaN in every output "
                 "column, whatever finite bias is added, and every other row stays finite.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None, .softcap = false, .bias = true}); };
    p.applies = is_library_path;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        const Index b = static_cast<Index>(rng.below(static_cast<std::uint64_t>(c.B)));
        const Index h = static_cast<Index>(rng.below(static_cast<std::uint64_t>(c.H)));
        const Index i = static_cast<Index>(rng.below(static_cast<std::uint64_t>(c.Tq)));
        const Index g = h / (c.H / c.kv_heads);
        SdpaCase z = c;
        z.options.check_finite = false;
        z.q[((b * c.H + h) * c.Tq + i) * c.Dk] = -std::numeric_limits<double>::infinity();
        for (Index j = 0; j < c.Tk; ++j) {
            double& kj = z.k[((b * c.kv_heads + g) * c.Tk + j) * c.Dk];
            kj = std::abs(kj) + 1;  // positive: -inf * k = -inf, whatever the other dims add
        }
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return guarded("a row of -inf logits", [&]() -> Verdict {
                const Tensor<T> out = run_impl<T>(impl, z);  // (B, H, Tq, Dv)
                for (Index bb = 0; bb < c.B; ++bb)
                    for (Index hh = 0; hh < c.H; ++hh)
                        for (Index ii = 0; ii < c.Tq; ++ii)
                            for (Index d = 0; d < c.Dv; ++d) {
                                const double x = static_cast<double>(out[((bb * c.H + hh) * c.Tq + ii) * c.Dv + d]);
                                const bool the_row = bb == b && hh == h && ii == i;
                                if (the_row && !std::isnan(x))
                                    return "output [" + std::to_string(b) + "," + std::to_string(h) + "," + std::to_string(i) +
                                           "," + std::to_string(d) + "] of the row whose logits are all -inf is " + num(x) + ", not NaN";
                                if (!the_row && !std::isfinite(x))
                                    return "output [" + std::to_string(bb) + "," + std::to_string(hh) + "," + std::to_string(ii) +
                                           "," + std::to_string(d) + "] of another row is " + num(x);
                            }
                return std::nullopt;
            });
        });
    };
    return p;
}

}  // namespace attn::suite
