// Invariant: a key (and its value) that no query may read gets dk = dv = 0 exactly, whatever it holds.
#include "../checks.hpp"

namespace attn::suite {

Property keys_no_query_reads_get_zero_gradients() {
    Property p;
    p.name = "keys_no_query_reads_get_zero_gradients";
    p.sentence = "A key position that no query of the batch elements reading it may read (by the mask, the causal "
                 "rule, the window or a -inf bias) gets dk = 0 and dv = 0 exactly, whatever its k and v hold.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::UnreadableKeys, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const std::optional<BackwardRun<T>> run = run_backward_unless_overflow<T>(impl, c, c.options);
            if (!run) return std::nullopt;
            const BackwardRun<T>& r = *run;
            // Key j of K/V head g (query heads g * R .. g * R + R - 1) in batch b: read by any of them?
            const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk)
            const Index G = c.kv_heads, R = c.H / G;
            if (r.grads.dk.numel() != c.B * G * c.Tk * c.Dk || r.grads.dv.numel() != c.B * G * c.Tk * c.Dv)
                return "dk " + to_string(r.grads.dk.shape()) + " or dv " + to_string(r.grads.dv.shape()) +
                       " is not of k's and v's shape";
            for (Index b = 0; b < c.B; ++b)
                for (Index g = 0; g < G; ++g)
                    for (Index j = 0; j < c.Tk; ++j) {
                        bool read = false;
                        for (Index h = g * R; h < (g + 1) * R && !read; ++h)
                            for (Index i = 0; i < c.Tq && !read; ++i)
                                read = allowed[((b * c.H + h) * c.Tq + i) * c.Tk + j];
                        if (read) continue;
                        const Index row = (b * G + g) * c.Tk + j;
                        for (Index d = 0; d < c.Dk; ++d)
                            if (r.grads.dk[row * c.Dk + d] != T(0))
                                return "dk of key " + std::to_string(j) + " (batch " + std::to_string(b) + ", K/V head " +
                                       std::to_string(g) + "), which no query reads, is " +
                                       num(static_cast<double>(r.grads.dk[row * c.Dk + d]));
                        for (Index d = 0; d < c.Dv; ++d)
                            if (r.grads.dv[row * c.Dv + d] != T(0))
                                return "dv of key " + std::to_string(j) + " (batch " + std::to_string(b) + ", K/V head " +
                                       std::to_string(g) + "), which no query reads, is " +
                                       num(static_cast<double>(r.grads.dv[row * c.Dv + d]));
                    }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
