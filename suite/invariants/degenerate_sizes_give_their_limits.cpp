// Invariant 22: the degenerate sizes are calls like any other, with the limits the definition gives: keys of width
// Dk = 0 make every logit 0, so the output is the plain mean of the readable values (within the oracle's bound);
// no keys (Tk = 0) leave every row empty, which the zero policy answers with zeros, exactly; no queries (Tq = 0)
// and an empty batch (B = 0) give an output with no elements, not an error. The generators draw sizes >= 1, so
// without this property none of these paths would run.
#include "../checks.hpp"

namespace attn::suite {

Property degenerate_sizes_give_their_limits() {
    Property p;
    p.name = "degenerate_sizes_give_their_limits";
    p.sentence = "Dk = 0 gives the mean of the readable values, Tk = 0 gives empty rows (zeros under the zero policy), "
                 "and Tq = 0 or B = 0 gives an output with no elements, never an error.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.small = true}); };
    // The library's paths; the test kernels of kernels/ implement only the sizes the generators draw.
    p.applies = is_library_path;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        SdpaCase z = c;
        const auto no_mask = [&] {
            z.allowed_mask.reset();
            z.mask_stride0 = false;
            z.mask_kind = z.options.is_causal || z.options.window ? z.mask_kind : "none";
        };
        const std::uint64_t kind = rng.below(4);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            if (kind == 0) {  // Dk = 0
                z.Dk = 0;
                z.q = Tensor<double>({c.B, c.H, c.Tq, 0});
                z.k = Tensor<double>({c.B, c.kv_heads, c.Tk, 0});
                return guarded("Dk = 0", [&] { return within_bound(run_impl<T>(impl, z), oracle_for<T>(impl, z), "Dk = 0: output vs oracle"); });
            }
            if (kind == 1) {  // Tk = 0: every row is empty
                z.Tk = 0;
                z.k = Tensor<double>({c.B, c.kv_heads, 0, c.Dk});
                z.v = Tensor<double>({c.B, c.kv_heads, 0, c.Dv});
                no_mask();
                z.options.empty_rows = EmptyRowPolicy::Zero;
                return guarded("Tk = 0", [&]() -> Verdict {
                    const Tensor<T> out = run_impl<T>(impl, z);
                    for (Index f = 0; f < out.numel(); ++f)
                        if (!same_bits(out[f], T(0))) return "Tk = 0: output element " + std::to_string(f) + " is " + num(out[f]) + ", not +0";
                    return std::nullopt;
                });
            }
            if (kind == 2) {  // Tq = 0
                z.Tq = 0;
                z.q = Tensor<double>({c.B, c.H, 0, c.Dk});
                no_mask();
            } else {  // B = 0
                z.B = 0;
                z.q = Tensor<double>({0, c.H, c.Tq, c.Dk});
                z.k = Tensor<double>({0, c.kv_heads, c.Tk, c.Dk});
                z.v = Tensor<double>({0, c.kv_heads, c.Tk, c.Dv});
                no_mask();
            }
            return guarded(kind == 2 ? "Tq = 0" : "B = 0", [&]() -> Verdict {
                const Tensor<T> out = run_impl<T>(impl, z);  // checks the element count (none)
                (void)out;
                return std::nullopt;
            });
        });
    };
    return p;
}

}  // namespace attn::suite
