// Invariant 14: rows with no allowed key follow the chosen policy: Throw names the row (the library's message also
// the sizes and the causal rule and window that apply), Zero gives zeros, never a silent NaN; NaN inputs still propagate under Zero; Nan gives NaN rows there and the oracle's values elsewhere.
// An implementation may implement Zero or Nan only (an external kernel declares which): each policy it supports is
// judged, and the case is skipped only when it supports neither.
#include <cmath>
#include <functional>

#include "../checks.hpp"

namespace attn::suite {

Property empty_rows_follow_the_policy() {
    Property p;
    p.name = "empty_rows_follow_the_policy";
    p.sentence = "Rows with no allowed key follow the policy: Throw names the first such row (and the library's "
                 "message its sizes and position rules), Zero gives zero rows and "
                 "the oracle's values elsewhere with no NaN, a NaN input still propagates under Zero, and Nan gives "
                 "NaN rows and the oracle's values elsewhere; returned weights follow the policy row by row.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::EmptyRows, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Tensor<bool> allowed = expanded_allowed(c);
        std::vector<char> empty(static_cast<std::size_t>(c.B * c.H * c.Tq), 1);
        for (Index r = 0; r < c.B * c.H * c.Tq; ++r)
            for (Index j = 0; j < c.Tk; ++j)
                if (allowed[r * c.Tk + j]) empty[static_cast<std::size_t>(r)] = 0;
        Index first = -1;
        for (Index r = 0; r < c.B * c.H * c.Tq && first < 0; ++r)
            if (empty[static_cast<std::size_t>(r)]) first = r % c.Tq;
        if (first < 0) return "generator error: no empty row";
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            // Throw: a MaskError naming the first empty row.
            SdpaCase throwing = c;
            throwing.options.empty_rows = EmptyRowPolicy::Throw;
            try {
                run_impl<T>(impl, throwing);
                return std::string("Throw policy: no error although query row ") + std::to_string(first) + " is empty";
            } catch (const MaskError& e) {
                const std::string what = e.what();
                if (what.find("query row " + std::to_string(first)) == std::string::npos)
                    return "Throw policy: the MaskError does not name query row " + std::to_string(first) + ": " + what;
                // The library's message states the sizes and the position rules that emptied the row.
                if (is_library_path(impl)) {
                    std::string rule = "(Tq=" + std::to_string(c.Tq) + ", Tk=" + std::to_string(c.Tk);
                    if (c.options.is_causal) rule += std::string(", causal ") + to_string(c.options.alignment);
                    if (c.options.window) rule += ", " + to_string(*c.options.window);
                    if (what.find(rule + ";") == std::string::npos)
                        return "Throw policy: the MaskError does not state '" + rule + ";': " + what;
                }
            }
            // The weights too, where the implementation returns them: an empty row's are the policy's fill (0 or
            // NaN) in every column; every other row's are never NaN, and exactly 0 where its key is blocked.
            const auto weights_follow = [&](SdpaCase policy_case, bool nan) -> Verdict {
                if (!impl.returns_weights) return std::nullopt;
                policy_case.options.return_weights = true;
                const CaseInputs<T> in = make_inputs<T>(policy_case);
                const SdpaResult<T> r = impl.run<T>(in.q_view, in.k_view, in.v_view, in.allowed_view,
                                                    in.with_bias(policy_case.options));
                const std::string policy = nan ? "Nan policy" : "Zero policy";
                if (!r.weights || r.weights->numel() != allowed.numel())
                    return policy + ": the weights asked for are " +
                           (r.weights ? "of shape " + to_string(r.weights->shape()) : std::string("missing"));
                for (Index x = 0; x < allowed.numel(); ++x) {
                    const T w = (*r.weights)[x];
                    const bool is_empty = empty[static_cast<std::size_t>(x / c.Tk)];
                    const bool right = is_empty ? (nan ? std::isnan(w) : w == T(0))
                                                : !std::isnan(w) && (allowed[x] || w == T(0));
                    if (!right)
                        return policy + ": weight" + index_string(c, x, c.Tk) + " is " + num(w) + " in " +
                               (is_empty ? "an empty row" : allowed[x] ? "a row with allowed keys" : "a blocked column");
                }
                return std::nullopt;
            };
            const auto zero_policy = [&]() -> Verdict {
                // Zero: empty rows exactly 0, the rest within the oracle's bound, nothing NaN.
                SdpaCase zero = c;
                zero.options.empty_rows = EmptyRowPolicy::Zero;
                const Tensor<T> out = run_impl<T>(impl, zero);  // (B, H, Tq, Dv)
                for (Index x = 0; x < out.numel(); ++x) {
                    if (std::isnan(out[x])) return "Zero policy: NaN at output" + index_string(c, x, c.Dv);
                    if (empty[static_cast<std::size_t>(x / c.Dv)] && out[x] != 0)
                        return "Zero policy: empty row gives " + num(out[x]) + " at output" + index_string(c, x, c.Dv);
                }
                if (Verdict v = within_bound(out, oracle_for<T>(impl, zero), "Zero policy vs oracle")) return v;
                if (Verdict v = weights_follow(zero, false)) return v;
                // A NaN in the q row of a non-empty row still reaches that row's output under Zero.
                Index victim = -1;
                for (Index r = 0; r < c.B * c.H * c.Tq && victim < 0; ++r)
                    if (!empty[static_cast<std::size_t>(r)]) victim = r;
                if (victim < 0) return std::nullopt;  // every row empty: nothing to propagate to
                SdpaCase poisoned = zero;
                poisoned.options.check_finite = false;
                poisoned.q[victim * c.Dk] = std::numeric_limits<double>::quiet_NaN();
                const Tensor<T> bad = run_impl<T>(impl, poisoned);
                for (Index d = 0; d < c.Dv; ++d)
                    if (!std::isnan(bad[victim * c.Dv + d]))
                        return "Zero policy: q NaN in row" + index_string(c, victim * c.Dv, c.Dv) +
                               " did not propagate: output" + index_string(c, victim * c.Dv + d, c.Dv) + " is " +
                               num(bad[victim * c.Dv + d]);
                return std::nullopt;
            };
            const auto nan_policy = [&]() -> Verdict {
                // Nan: empty rows NaN in every column, the rest the oracle's (within the bound, none NaN).
                SdpaCase nan = c;
                nan.options.empty_rows = EmptyRowPolicy::Nan;
                const Tensor<T> out = run_impl<T>(impl, nan);
                for (Index x = 0; x < out.numel(); ++x) {
                    const bool is_empty = empty[static_cast<std::size_t>(x / c.Dv)];
                    if (is_empty && !std::isnan(out[x]))
                        return "Nan policy: empty row gives " + num(out[x]) + " at output" + index_string(c, x, c.Dv);
                    if (!is_empty && std::isnan(out[x]))
                        return "Nan policy: NaN in a row with allowed keys at output" + index_string(c, x, c.Dv);
                }
                if (Verdict v = within_bound(out, oracle_for<T>(impl, nan), "Nan policy vs oracle")) return v;
                return weights_follow(nan, true);
            };
            // Each policy the implementation supports is judged; only one supporting neither skips the case.
            std::optional<std::string> unsupported;
            int judged = 0;
            for (const auto& policy : {std::function<Verdict()>(zero_policy), std::function<Verdict()>(nan_policy)}) {
                try {
                    if (Verdict v = policy()) return v;
                    ++judged;
                } catch (const Unsupported& e) {
                    unsupported = e.what();
                }
            }
            if (judged == 0 && unsupported) throw Unsupported(*unsupported);
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
