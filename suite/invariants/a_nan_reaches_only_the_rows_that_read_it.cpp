// Invariant: with check_finite off, a NaN in one key or value element reaches exactly the outputs that read it
// (pytorch#101967: a NaN in one sequence's K/V poisoned the whole batch). Every other output element stays finite
// and within two bounds of what it is without the NaN (not bitwise: the reference backend sums rows one by one once
// a value it reads is not finite, so that 0 * NaN in its gemm cannot reach rows that may not read it). Kills
// masked_nan_poisons_output, nan_inputs_zeroed and mask_after_softmax; reaches the backends' check_finite-off paths,
// which no other property does.
#include <cmath>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property a_nan_reaches_only_the_rows_that_read_it() {
    Property p;
    p.name = "a_nan_reaches_only_the_rows_that_read_it";
    p.sentence = "With check_finite off, a NaN in one element of k makes every output of exactly the query rows that "
                 "may read that key NaN, a NaN in one element of v that column of those rows, and every other output "
                 "stays finite and within the oracle's bound of what it is without the NaN.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Causal, .bias = true}); };
    p.cost = 3;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk), the causal rule folded in
        const Index group = c.H / c.kv_heads;
        // A (query row, key) pair that is allowed: the key the NaN goes into, so that some row reads it.
        std::vector<Index> pairs;
        for (Index e = 0; e < allowed.numel(); ++e)
            if (allowed[e]) pairs.push_back(e);
        if (pairs.empty()) return std::nullopt;  // every row empty: nothing can read anything (the policy's job)
        Rng rng(c.aux_seed);
        const Index pick = pairs[static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(pairs.size())))];
        const Index j = pick % c.Tk, bh = pick / (c.Tq * c.Tk), b = bh / c.H, g = (bh % c.H) / group;
        const bool in_k = rng.below(2) == 0;
        const Index col = static_cast<Index>(rng.below(static_cast<std::uint64_t>(in_k ? c.Dk : c.Dv)));
        SdpaCase clean = c, dirty = c;
        clean.options.check_finite = dirty.options.check_finite = false;
        const Index kv_row = (b * c.kv_heads + g) * c.Tk + j;
        (in_k ? dirty.k[kv_row * c.Dk + col] : dirty.v[kv_row * c.Dv + col]) = std::numeric_limits<double>::quiet_NaN();
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> a = run_impl<T>(impl, clean), n = run_impl<T>(impl, dirty);
            const Tensor<double> bound = oracle_for<T>(impl, clean).output_bound;  // (B, H, Tq, Dv)
            const auto close = [&](Index at) {
                const double x = static_cast<double>(n[at]), y = static_cast<double>(a[at]);
                return std::isfinite(x) && std::fabs(x - y) <= 2 * bound[at];
            };
            const std::string where = std::string("NaN in ") + (in_k ? "k" : "v") + "[b=" + std::to_string(b) +
                                      ",kv_head=" + std::to_string(g) + ",key=" + std::to_string(j) + ",col=" +
                                      std::to_string(col) + "]: ";
            for (Index hh = 0; hh < c.H; ++hh)
                for (Index i = 0; i < c.Tq; ++i) {
                    const bool reads = hh / group == g && allowed[((b * c.H + hh) * c.Tq + i) * c.Tk + j];
                    for (Index d = 0; d < c.Dv; ++d) {
                        const Index at = ((b * c.H + hh) * c.Tq + i) * c.Dv + d;
                        const bool poisoned = reads && (in_k || d == col);
                        if (poisoned && !std::isnan(n[at]))
                            return where + "output" + index_string(c, at, c.Dv) + " = " + num(n[at]) + " reads it but is not NaN";
                        if (!poisoned && !close(at))
                            return where + "output" + index_string(c, at, c.Dv) + " moved from " + num(a[at]) + " to " +
                                   num(n[at]) + ", more than two bounds (" + num(bound[at]) + "), without reading it";
                    }
                }
            // Every other batch element is untouched too.
            for (Index e = 0; e < a.numel(); ++e) {
                if (e / (c.H * c.Tq * c.Dv) == b) continue;
                if (!close(e))
                    return where + "another batch element's output" + index_string(c, e, c.Dv) + " moved from " +
                           num(a[e]) + " to " + num(n[e]);
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
