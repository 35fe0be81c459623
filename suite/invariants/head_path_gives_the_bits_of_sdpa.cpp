// Invariant 24: MultiHeadAttention's head path (split into heads by strides, the SDPA core, merge) is a relayout and
// nothing else: under an explicitly chosen backend, reference or tiled, it gives bitwise the output of
// scaled_dot_product_attention with the same options. So the module runs the kernel it is asked for, with the
// caller's options, and the head split and merge move values without touching them.
#include "../checks.hpp"

namespace attn::suite {

Property head_path_gives_the_bits_of_sdpa() {
    Property p;
    p.name = "head_path_gives_the_bits_of_sdpa";
    p.sentence = "The module's head path under an explicit backend gives bitwise the output of scaled_dot_product_attention "
                 "with the same options: the head split and merge are a relayout, and the backend is the one asked for.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.name == "mha"; };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        SdpaOptions o = c.options;
        o.backend = rng.below(2) == 0 ? Backend::Reference : Backend::Tiled;
        o.return_weights = false;
        const Implementation& direct = implementation(o.backend == Backend::Reference ? "reference" : "tiled");
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return guarded("head path", [&] {
                return bitwise_equal(c, run_impl<T>(impl, c, o), run_impl<T>(direct, c, o),
                                     std::string("head path vs scaled_dot_product_attention, backend ") + to_string(o.backend));
            });
        });
    };
    return p;
}

}  // namespace attn::suite
