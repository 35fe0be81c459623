// Invariant 8: permuting keys and values together leaves the output unchanged; permuting queries permutes the
// output rows (within the oracle's bound).
#include <numeric>

#include "../checks.hpp"

namespace attn::suite {

namespace {

std::vector<Index> permutation(Index n, Rng& rng) {
    std::vector<Index> p(static_cast<std::size_t>(n));
    std::iota(p.begin(), p.end(), Index{0});
    for (Index i = n - 1; i > 0; --i) std::swap(p[static_cast<std::size_t>(i)], p[rng.below(static_cast<std::uint64_t>(i + 1))]);
    return p;
}

}  // namespace

Property key_permutation_equivariance() {
    Property p;
    p.name = "key_permutation_equivariance";
    p.sentence = "Permuting keys and values together leaves every output row unchanged, and permuting queries permutes "
                 "the output rows, within the oracle's bound.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& drawn) -> Verdict {
        // ALiBi ties a logit to the positions of its query and key, so a case's slopes are dropped here; an explicit
        // bias is expanded to (B, H, Tq, Tk) (the same bits as broadcast) and permuted with the keys and queries.
        SdpaCase c = drawn;
        c.alibi_slopes.reset();
        c.alibi_kind = "none";
        if (c.bias) {
            c.bias = expanded_bias(drawn);
            c.bias_kind = drawn.bias_kind + "-expanded";
        }
        Rng rng(c.aux_seed);
        const std::vector<Index> key_of = permutation(c.Tk, rng), query_of = permutation(c.Tq, rng);
        // Permuted case: key j' holds key key_of[j']; query i' is query query_of[i']; the mask (expanded, with the
        // causal rule folded in) and the bias permuted alike.
        SdpaCase perm = c;
        const Tensor<bool> allowed = expanded_allowed(c);
        Tensor<bool> m({c.B, c.H, c.Tq, c.Tk});
        for (Index bh = 0; bh < c.B * c.H; ++bh)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index j = 0; j < c.Tk; ++j)
                    m[(bh * c.Tq + i) * c.Tk + j] = allowed[(bh * c.Tq + query_of[static_cast<std::size_t>(i)]) * c.Tk +
                                                            key_of[static_cast<std::size_t>(j)]];
        perm.allowed_mask = std::move(m);
        if (c.bias) {
            Tensor<double>& bias = *perm.bias;  // (B, H, Tq, Tk)
            for (Index bh = 0; bh < c.B * c.H; ++bh)
                for (Index i = 0; i < c.Tq; ++i)
                    for (Index j = 0; j < c.Tk; ++j)
                        bias[(bh * c.Tq + i) * c.Tk + j] = (*c.bias)[(bh * c.Tq + query_of[static_cast<std::size_t>(i)]) *
                                                                        c.Tk + key_of[static_cast<std::size_t>(j)]];
            perm.bias_kind = c.bias_kind + "-permuted";
        }
        perm.mask_stride0 = false;
        drop_positional_options(perm);
        perm.mask_kind = c.mask_kind + "-permuted";
        for (Index r = 0; r < c.B * c.kv_heads; ++r)
            for (Index j = 0; j < c.Tk; ++j) {
                const Index from = r * c.Tk + key_of[static_cast<std::size_t>(j)];
                for (Index x = 0; x < c.Dk; ++x) perm.k[(r * c.Tk + j) * c.Dk + x] = c.k[from * c.Dk + x];
                for (Index x = 0; x < c.Dv; ++x) perm.v[(r * c.Tk + j) * c.Dv + x] = c.v[from * c.Dv + x];
            }
        for (Index bh = 0; bh < c.B * c.H; ++bh)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index x = 0; x < c.Dk; ++x)
                    perm.q[(bh * c.Tq + i) * c.Dk + x] = c.q[(bh * c.Tq + query_of[static_cast<std::size_t>(i)]) * c.Dk + x];
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> out = run_impl<T>(impl, c), out_perm = run_impl<T>(impl, perm);  // (B, H, Tq, Dv)
            const oracle::Result<T> o = oracle_for<T>(impl, c);
            // Output rows of the permuted case in the original order; the bound is a sum over keys, so it is the
            // same for the permuted problem.
            Tensor<T> back(out.shape());
            for (Index bh = 0; bh < c.B * c.H; ++bh)
                for (Index i = 0; i < c.Tq; ++i)
                    for (Index x = 0; x < c.Dv; ++x)
                        back[(bh * c.Tq + query_of[static_cast<std::size_t>(i)]) * c.Dv + x] = out_perm[(bh * c.Tq + i) * c.Dv + x];
            return within_two_bounds(c, out, o.output_bound, back, o.output_bound, "original vs permuted keys and queries");
        });
    };
    return p;
}

}  // namespace attn::suite
