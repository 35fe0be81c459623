// Invariant: with check_finite off, a NaN in one element of k or v reaches the gradients exactly through the rows
// that read it: every dq element of a query row that reads the key is NaN, and every gradient that no such row
// touches (dq of the other rows, dk and dv of the keys none of them reads, every other batch element) is within the
// clean run's bound plus the dirty run's of the clean run's (the dirty run's: the larger of the model's and the
// reference structure's, which the library's tiled backward falls back to where a readable value is not finite), as in the forward's a_nan_reaches_only_the_rows_that_read_it. It reaches the
// backward's path for non-finite readable inputs (products over allowed pairs only), which the bound properties,
// run on finite inputs, never take.
#include <limits>

#include "../checks.hpp"
#include "attn/oracle/backward.hpp"

namespace attn::suite {

Property a_nan_reaches_only_the_gradients_that_read_it() {
    Property p;
    p.name = "a_nan_reaches_only_the_gradients_that_read_it";
    p.sentence = "With check_finite off, a NaN in one element of k or v makes dq of exactly the query rows that read "
                 "its key NaN, and leaves every gradient those rows do not touch within the two runs' bounds of the clean run's.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Causal, .small = true, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.cost = 3;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk)
        const Index group = c.H / c.kv_heads;
        std::vector<Index> pairs;
        for (Index e = 0; e < allowed.numel(); ++e)
            if (allowed[e]) pairs.push_back(e);
        if (pairs.empty()) return std::nullopt;  // nothing reads anything
        Rng rng(c.aux_seed ^ 0x5bd1e995u);
        const Index pick = pairs[static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(pairs.size())))];
        const Index j = pick % c.Tk, bh = pick / (c.Tq * c.Tk), b = bh / c.H, g = (bh % c.H) / group;
        const bool in_k = rng.below(2) == 0;
        const Index col = static_cast<Index>(rng.below(static_cast<std::uint64_t>(in_k ? c.Dk : c.Dv)));
        SdpaCase clean = c, dirty = c;
        clean.options.check_finite = dirty.options.check_finite = false;
        const Index kv_row = (b * c.kv_heads + g) * c.Tk + j;
        (in_k ? dirty.k[kv_row * c.Dk + col] : dirty.v[kv_row * c.Dv + col]) = std::numeric_limits<double>::quiet_NaN();
        // The rows that read the NaN, and the keys (b, kv head g, j') any of them reads: their gradients get it.
        const auto reads = [&](Index bb, Index h, Index i) {
            return bb == b && h / group == g && allowed[((bb * c.H + h) * c.Tq + i) * c.Tk + j];
        };
        std::vector<char> key_touched(static_cast<std::size_t>(c.Tk), 0);
        for (Index h = 0; h < c.H; ++h)
            for (Index i = 0; i < c.Tq; ++i)
                if (reads(b, h, i))
                    for (Index jj = 0; jj < c.Tk; ++jj)
                        if (allowed[((b * c.H + h) * c.Tq + i) * c.Tk + jj]) key_touched[static_cast<std::size_t>(jj)] = 1;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const std::optional<BackwardRun<T>> a = run_backward_unless_overflow<T>(impl, clean, clean.options);
            if (!a) return std::nullopt;
            const BackwardRun<T> n = run_backward<T>(impl, dirty, dirty.options, &a->dout);
            // The clean run is within the bound of the implementation's model; a batch element with a NaN may run
            // another structure (the library's tiled backward falls back to its reference one there): the dirty run
            // is within the larger of the two bounds.
            const auto bounds = [&](const oracle::ErrorModel& model) {
                oracle::OracleOptions oo;
                oo.model = model;
                return oracle::sdpa_backward<T>(a->in.q_view, a->in.k_view, a->in.v_view, a->dout.view(),
                                                a->in.allowed_view, a->options, oo);
            };
            oracle::Gradients<T> exact = bounds(impl.error_model);
            if (impl.error_model.name != "reference") {
                const oracle::Gradients<T> ref = bounds(oracle::reference_model());
                for (auto [mine, other] : {std::pair{&exact.dq_bound, &ref.dq_bound}, std::pair{&exact.dk_bound, &ref.dk_bound},
                                           std::pair{&exact.dv_bound, &ref.dv_bound}})
                    for (Index x = 0; x < mine->numel(); ++x)
                        (*mine)[x] = ((*mine)[x] + std::max((*mine)[x], (*other)[x])) / 2;
            }
            const std::string where = std::string("NaN in ") + (in_k ? "k" : "v") + "[b=" + std::to_string(b) +
                                      ",kv_head=" + std::to_string(g) + ",key=" + std::to_string(j) + ",col=" +
                                      std::to_string(col) + "]: ";
            const auto close = [](T x, T y, double bound) {
                const double dx = static_cast<double>(x), dy = static_cast<double>(y);
                return std::isfinite(dx) && std::fabs(dx - dy) <= 2 * bound;
            };
            for (Index bb = 0; bb < c.B; ++bb)
                for (Index h = 0; h < c.H; ++h)
                    for (Index i = 0; i < c.Tq; ++i)
                        for (Index d = 0; d < c.Dk; ++d) {
                            const Index at = ((bb * c.H + h) * c.Tq + i) * c.Dk + d;
                            const T x = n.grads.dq[at], y = a->grads.dq[at];
                            if (reads(bb, h, i) && !std::isnan(static_cast<double>(x)))
                                return where + "dq" + index_string(c, at, c.Dk) + " = " + num(x) +
                                       ": its row reads the NaN but it is not NaN";
                            if (!reads(bb, h, i) && !close(x, y, exact.dq_bound[at]))
                                return where + "dq" + index_string(c, at, c.Dk) + " moved from " + num(y) + " to " +
                                       num(x) + ", more than the two runs' bounds (" + num(exact.dq_bound[at]) +
                                       "), though its row does not read it";
                        }
            for (Index bb = 0; bb < c.B; ++bb)
                for (Index gg = 0; gg < c.kv_heads; ++gg)
                    for (Index jj = 0; jj < c.Tk; ++jj) {
                        if (bb == b && gg == g && key_touched[static_cast<std::size_t>(jj)]) continue;
                        const Index row = (bb * c.kv_heads + gg) * c.Tk + jj;
                        for (Index d = 0; d < c.Dk; ++d)
                            if (!close(n.grads.dk[row * c.Dk + d], a->grads.dk[row * c.Dk + d],
                                       exact.dk_bound[row * c.Dk + d]))
                                return where + "dk of kv row " + std::to_string(row) + ", column " + std::to_string(d) +
                                       " moved from " + num(a->grads.dk[row * c.Dk + d]) + " to " +
                                       num(n.grads.dk[row * c.Dk + d]) + ", though no row reading the NaN reads it";
                        for (Index d = 0; d < c.Dv; ++d)
                            if (!close(n.grads.dv[row * c.Dv + d], a->grads.dv[row * c.Dv + d],
                                       exact.dv_bound[row * c.Dv + d]))
                                return where + "dv of kv row " + std::to_string(row) + ", column " + std::to_string(d) +
                                       " moved from " + num(a->grads.dv[row * c.Dv + d]) + " to " +
                                       num(n.grads.dv[row * c.Dv + d]) + ", though no row reading the NaN reads it";
                    }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
