// Invariant: finite inputs whose logits, logits plus bias, output or gradients overflow the compute type are refused
// with a ValueError naming what overflowed, never returned as an infinity or a NaN. One overflow per case, drawn:
// - logit: every q and k element c (k's sign drawn) with scale * c^2 * Dk beyond the largest finite number, so every
//   allowed logit is +-inf: the call must refuse, naming "a logit (scale * q k^T)";
// - logit plus bias: c with every logit near half the largest number, a bias of three quarters of it: each logit and
//   each bias entry is finite, every sum is not: the call must refuse, naming "a logit plus its bias";
//   sdpa_backward, which recomputes the logits, called on its own on the same inputs, must refuse them the same way;
// - output: every value the largest finite number: each output element is a weighted mean of them, whose exact value
//   is finite, but an implementation that sums before it divides overflows: the call either returns finite outputs
//   or refuses naming "the output (weights @ v)"; so must the module's head path with dropout 0.9 in training mode
//   (kept weights are multiplied by 10 before the values; the largest number in each head's first value column),
//   naming multi_head_sdpa and the output that overflowed, with every key readable and with one key per row (where
//   only the dropped-out output can overflow, and the refusal must name the first row whose key dropout kept);
//   and the same values read one key per row (an explicit mask allowing key i mod Tk to query i, no other rule):
//   every weight is exactly 1, so the output is exactly the largest number, which must come back as such (the
//   largest finite number is not an overflow);
// - gradient (implementations with a backward pass): dout of three quarters of the largest number: the gradients
//   either come back finite or the call refuses naming what overflowed; so must the module's head path backward, in
//   evaluation mode and in training mode with dropout 0.9 (kept weights times 10, so dv, the kept weights' sum times
//   dout, overflows where a key's kept weights sum past 2/15), naming multi_head_sdpa_backward.
// The 16-bit float16 cannot overflow a float logit (65504^2 Dk is far below float's range): its logit cases are
// skipped. The generators otherwise keep every input in range, so without this property the library's overflow
// checks (each a throw in a kernel's inner loop) would run under the unit tests only.
#include <cmath>
#include <limits>

#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

namespace {

enum class Overflow { Logit, LogitPlusBias, Output, Gradient, Count };

// The case's message when the call returned something that is not finite (a silent overflow), else nullopt.
template <class T>
Verdict all_finite(const Tensor<T>& t, const char* name, const std::string& what) {
    for (Index x = 0; x < t.numel(); ++x)
        if (!std::isfinite(static_cast<double>(t[x])))
            return what + ": the call returned " + num(static_cast<double>(t[x])) + " in " + name + " at flat index " +
                   std::to_string(x) + " without refusing the case";
    return std::nullopt;
}

// all_finite of the three gradients, named dq, dk, dv with `suffix`.
template <class T>
Verdict finite_gradients(const Tensor<T>& dq, const Tensor<T>& dk, const Tensor<T>& dv, const std::string& suffix,
                         const std::string& what) {
    if (Verdict v = all_finite(dq, ("dq" + suffix).c_str(), what)) return v;
    if (Verdict v = all_finite(dk, ("dk" + suffix).c_str(), what)) return v;
    return all_finite(dv, ("dv" + suffix).c_str(), what);
}

// A refusal naming what overflowed: a ValueError that says so, and that the inputs were finite.
Verdict overflow_refusal(const std::string& message, const std::string& kind, const std::string& named,
                         const std::string& what) {
    if (kind != "ValueError") return what + ": expected a ValueError, got " + kind + ": " + message;
    for (const std::string& word : {named, std::string("overflowed"), std::string("although every readable input is finite")})
        if (message.find(word) == std::string::npos)
            return what + ": the message does not say '" + word + "': " + message;
    return std::nullopt;
}

// The output case's values read one key per row: the call must return exactly `top` everywhere.
template <class T>
Verdict largest_value_read_alone(const Implementation& impl, const SdpaCase& o, double top, const std::string& what) {
    if (o.Tk == 0) return std::nullopt;  // no key to read
    SdpaCase one = o;
    one.options.is_causal = false;
    one.options.window.reset();
    Tensor<bool> allowed({o.Tq, o.Tk}, false);
    for (Index i = 0; i < o.Tq; ++i) allowed[i * o.Tk + i % o.Tk] = true;
    one.allowed_mask = std::move(allowed), one.mask_kind = "one-key-per-row", one.mask_stride0 = false;
    const std::string one_what = what + ", one key per row";
    Tensor<T> out;
    const auto [kind, message] = thrown([&] { out = run_impl<T>(impl, one, one.options); });
    if (!kind.empty()) return one_what + ": every weight is 1 and the output the largest number, yet the call refused: " +
                              kind + ": " + message;
    for (Index x = 0; x < out.numel(); ++x)
        if (static_cast<double>(out[x]) != top)
            return one_what + ": output element " + std::to_string(x) + " is " + num(static_cast<double>(out[x])) +
                   ", not the value it alone reads (" + num(top) + ")";
    return std::nullopt;
}

// The module's head path in training mode (dropout 0.9) on values whose first column of each head is the largest
// number `top` (the others 1), whatever the plain call did with them: the weights kept are multiplied by
// 1/(1 - p) = 10 before the values, so a row whose kept weights sum past 1/10 overflows in that column (the heads'
// attention forms the plain mean too, which may round past the largest number). The refusal names the function
// called, whichever of the two overflowed. Then with one key per row: the heads' own output is exactly the values
// read, so only the dropped-out one can overflow, exactly in the rows whose one key dropout kept; on one thread, the
// refusal must name the first of them (batch element, head, query row in turn), which the same call without
// check_finite shows as the first infinite output.
template <class T>
Verdict dropped_out_head_path(const SdpaCase& c, double top, const std::string& what) {
    Rng draws(c.aux_seed ^ 0x5eed);
    const Tensor<T> qp = normal_tensor<T>({c.B, c.Tq, c.H * c.Dk}, draws);
    const Tensor<T> kp = normal_tensor<T>({c.B, c.Tk, c.kv_heads * c.Dk}, draws);
    Tensor<T> vp({c.B, c.Tk, c.kv_heads * c.Dv}, T(1));
    for (Index x = 0; c.Dv > 0 && x < vp.numel(); x += c.Dv) vp[x] = static_cast<T>(top);
    MhaOptions head_options;
    head_options.empty_rows = EmptyRowPolicy::Zero;
    head_options.training = true;
    head_options.num_threads = 1;
    Tensor<bool> one_key({c.Tq, c.Tk}, false);
    for (Index i = 0; c.Tk > 0 && i < c.Tq; ++i) one_key[i * c.Tk + i % c.Tk] = true;
    for (const bool one_key_per_row : {false, true}) {
        std::optional<TensorView<const bool>> mask;
        if (one_key_per_row) mask = one_key.view();
        std::optional<MhaResult<T>> dropped;
        const auto [kind, message] = thrown([&] {
            dropped = multi_head_sdpa(qp.view(), kp.view(), vp.view(), c.H, c.kv_heads, mask, head_options,
                                      MhaDropout{0.9, c.aux_seed});
        });
        const std::string dropout_what = what + ", dropout 0.9" + (one_key_per_row ? ", one key per row" : "");
        if (kind.empty()) {
            if (Verdict v = all_finite(dropped->output, "the dropped-out output", dropout_what)) return v;
            continue;
        }
        if (message.rfind("multi_head_sdpa: ", 0) != 0)
            return dropout_what + ": the refusal does not name multi_head_sdpa: " + message;
        const bool plain = !one_key_per_row && message.find("the output (weights @ v)") != std::string::npos;
        if (Verdict v = overflow_refusal(message, kind,
                                         plain ? "the output (weights @ v)" : "the output (dropped-out weights @ v)",
                                         dropout_what))
            return v;
        if (!one_key_per_row) continue;
        // Which row: the first infinite output of the same call without the check, in (b, h, i) order.
        MhaOptions unchecked = head_options;
        unchecked.check_finite = false;
        const MhaResult<T> raw = multi_head_sdpa(qp.view(), kp.view(), vp.view(), c.H, c.kv_heads, mask, unchecked,
                                                 MhaDropout{0.9, c.aux_seed});
        std::string first;
        for (Index b = 0; b < c.B && first.empty(); ++b)
            for (Index h = 0; h < c.H && first.empty(); ++h)
                for (Index i = 0; i < c.Tq && first.empty(); ++i)
                    for (Index d = 0; d < c.Dv && first.empty(); ++d)
                        if (!std::isfinite(static_cast<double>(raw.output[(b * c.Tq + i) * c.H * c.Dv + h * c.Dv + d])))
                            first = "at batch index [" + std::to_string(b) + "," + std::to_string(h) + "], query row " +
                                    std::to_string(i) + " ";
        if (first.empty())
            return dropout_what + ": the call refused although without the check no output is infinite: " + message;
        if (message.find(first) == std::string::npos)
            return dropout_what + ": the refusal does not name the first row that overflows ('" + first + "'): " + message;
    }
    return std::nullopt;
}

// The module's head path backward, in evaluation mode and in training mode (dropout 0.9), with dout of 3/4 of the
// largest number `top` on projected inputs drawn from the case's aux seed: the gradients come back finite or the call
// refuses, naming multi_head_sdpa_backward (the function called, not the split heads' sdpa_backward) and what
// overflowed.
template <class T>
Verdict head_path_backward(const Implementation& impl, const SdpaCase& c, double top, const std::string& what) {
    Rng draws(c.aux_seed ^ 0xbac4);
    const Tensor<T> qp = normal_tensor<T>({c.B, c.Tq, c.H * c.Dk}, draws);
    const Tensor<T> kp = normal_tensor<T>({c.B, c.Tk, c.kv_heads * c.Dk}, draws);
    const Tensor<T> vp = normal_tensor<T>({c.B, c.Tk, c.kv_heads * c.Dv}, draws);
    const Tensor<T> dout({c.B, c.Tq, c.H * c.Dv}, static_cast<T>(0.75 * top));
    for (const bool training : {false, true}) {
        MhaOptions options;
        options.empty_rows = EmptyRowPolicy::Zero;
        options.training = training;
        options.num_threads = c.options.num_threads;
        std::optional<MhaGradients<T>> g;
        const auto [kind, message] = thrown([&] {
            g = impl.head_backward<T>(qp.view(), kp.view(), vp.view(), dout.view(), c.H, c.kv_heads, std::nullopt,
                                      options, MhaDropout{0.9, c.aux_seed});
        });
        const std::string mode_what = what + ", head path backward, " + (training ? "dropout 0.9" : "evaluation mode");
        const Verdict v =
            kind.empty() ? finite_gradients(g->dq_projected, g->dk_projected, g->dv_projected, "_projected", mode_what)
            : message.rfind("multi_head_sdpa_backward: ", 0) != 0
                ? mode_what + ": the refusal does not name multi_head_sdpa_backward: " + message
                : overflow_refusal(message, kind, "", mode_what);
        if (v) return v;
    }
    return std::nullopt;
}

}  // namespace

Property an_overflow_is_refused_by_name() {
    Property p;
    p.name = "an_overflow_is_refused_by_name";
    p.sentence = "Finite inputs whose logits, logits plus bias, output or gradients overflow are refused with a "
                 "ValueError naming what overflowed (every logit overflowing must be refused), never returned as an "
                 "infinity or a NaN.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {}); };
    // The library's own paths: the test kernels of kernels/ and a user's kernel need not check for overflow.
    p.applies = [](const Implementation& impl) { return is_library_path(impl); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        const auto kind = static_cast<Overflow>(rng.below(static_cast<std::uint64_t>(Overflow::Count)));
        if (kind == Overflow::Gradient && !impl.has_backward() && !impl.has_head_backward()) return std::nullopt;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            using C = compute_t<T>;
            const double top = static_cast<double>(std::numeric_limits<T>::max());
            const bool logit_can_overflow = top * top > static_cast<double>(std::numeric_limits<C>::max());
            if ((kind == Overflow::Logit || kind == Overflow::LogitPlusBias) && (!logit_can_overflow || c.Dk == 0))
                return std::nullopt;
            // The case with every row allowed to be empty (a refusal for an empty row would come first), no soft cap
            // (it would bound the logits), no ALiBi and only this property's bias.
            SdpaCase o = c;
            o.options.empty_rows = EmptyRowPolicy::Zero;
            o.options.check_finite = true;
            o.options.softcap = 0;
            o.options.return_weights = o.options.return_lse = false;
            o.alibi_slopes.reset(), o.alibi_kind = "none";
            o.bias.reset(), o.bias_kind = "none";
            o.seed.reset(), o.distribution = "overflow";  // the values below are this property's, not the recipe's
            const double scale = resolved_scale(o.options.scale, c.Dk);
            const double c_max = static_cast<double>(std::numeric_limits<C>::max());
            std::string named, what;
            switch (kind) {
                case Overflow::Logit: {
                    // c^2 * scale * Dk at least 4 times C's largest number, c itself finite in T.
                    const double cq =
                        std::min(2 * std::sqrt(c_max) / std::sqrt(scale * static_cast<double>(c.Dk)), top);
                    const double sign = rng.below(2) == 0 ? 1.0 : -1.0;
                    std::fill_n(o.q.data(), o.q.numel(), cq);
                    std::fill_n(o.k.data(), o.k.numel(), sign * cq);
                    named = "a logit (scale * q k^T)", what = std::string("every logit ") + (sign > 0 ? "+inf" : "-inf");
                    break;
                }
                case Overflow::LogitPlusBias: {
                    // q.k = Dk c^2 = c_max / 2 (no partial sum overflows), the logit scale c_max / 2, the bias T's
                    // largest number, both of one drawn sign (the sum overflows upward or downward). T's rounding of
                    // c moves the logit by under 1%: the case is kept only where the sum overflows and the logit
                    // does not with 10% to spare.
                    const double cq = std::sqrt(c_max) / std::sqrt(2 * static_cast<double>(c.Dk));
                    const double logit = scale * c_max / 2;
                    const C low_sum = static_cast<C>(static_cast<C>(top) + static_cast<C>(0.9 * logit));
                    if (!(cq < top) || !(1.1 * logit < c_max) || !std::isinf(low_sum)) return std::nullopt;
                    const double sign = rng.below(2) == 0 ? 1.0 : -1.0;
                    std::fill_n(o.q.data(), o.q.numel(), cq);
                    std::fill_n(o.k.data(), o.k.numel(), sign * cq);
                    o.bias = Tensor<double>({c.Tq, c.Tk}, sign * top), o.bias_kind = "constant";
                    named = "a logit plus its bias";
                    what = std::string("logits of ") + (sign > 0 ? "" : "-") + "scale * c_max / 2 plus a bias of the " +
                           (sign > 0 ? "largest number" : "lowest number");
                    break;
                }
                case Overflow::Output:
                    std::fill_n(o.v.data(), o.v.numel(), top);
                    named = "the output (weights @ v)", what = "every value the largest finite number";
                    break;
                case Overflow::Gradient:
                case Overflow::Count: what = "dout of 3/4 of the largest finite number"; break;
            }
            what += " (" + impl.name + ")";

            if (kind == Overflow::Output)
                if (Verdict v = largest_value_read_alone<T>(impl, o, top, what)) return v;
            if (kind != Overflow::Gradient) {
                Tensor<T> out;
                const auto [error_kind, message] = thrown([&] { out = run_impl<T>(impl, o, o.options); });
                if (error_kind.empty()) {
                    // Accepted: only the output's overflow may be absent (a mean of finite values is finite).
                    if (kind != Overflow::Output) {
                        const Tensor<bool> allowed = expanded_allowed(o);
                        for (Index x = 0; x < allowed.numel(); ++x)
                            if (allowed[x]) return what + ": the call was accepted although every allowed logit overflows";
                        return std::nullopt;  // no allowed pair: no logit is computed
                    }
                    if (Verdict v = all_finite(out, "the output", what)) return v;
                    return impl.name == "mha" ? dropped_out_head_path<T>(c, top, what) : std::nullopt;
                }
                if (Verdict v = overflow_refusal(message, error_kind, named, what)) return v;
                if (kind == Overflow::Output)
                    return impl.name == "mha" ? dropped_out_head_path<T>(c, top, what) : std::nullopt;
                if (impl.name != "reference" && impl.name != "tiled") return std::nullopt;
                // The backward recomputes the logits: called on its own (a zero output and lse stand in for the
                // forward's, which refused), it must refuse them the same way.
                const CaseInputs<T> in = make_inputs<T>(o);
                SdpaOptions backward_options = in.with_bias(o.options);
                backward_options.backend = impl.name == "reference" ? Backend::Reference : Backend::Tiled;
                Shape out_shape = in.q_view.shape();
                out_shape.back() = c.Dv;
                const Shape lse_shape(out_shape.begin(), out_shape.end() - 1);
                const Tensor<T> zero_out(out_shape, T(0)), dout(out_shape, T(1));
                const Tensor<C> zero_lse(lse_shape, C(0));
                const auto [backward_kind, backward_message] = thrown([&] {
                    (void)sdpa_backward(in.q_view, in.k_view, in.v_view, zero_out.view(), zero_lse.view(), dout.view(),
                                        in.allowed_view, backward_options);
                });
                if (backward_kind.empty()) return what + ", sdpa_backward: the call was accepted";
                return overflow_refusal(backward_message, backward_kind, named, what + ", sdpa_backward");
            }
            // Gradient: dout in the output's shape and layout, every element 3/4 of T's largest number.
            if (!impl.has_backward()) return head_path_backward<T>(impl, c, top, what);  // the module's head path
            const CaseInputs<T> in = make_inputs<T>(o);
            Shape out_shape = in.q_view.shape();
            out_shape.back() = c.Dv;
            const Tensor<T> dout(out_shape, static_cast<T>(0.75 * top));
            std::optional<BackwardRun<T>> run;
            const auto [error_kind, message] = thrown([&] { run = run_backward<T>(impl, o, o.options, &dout); });
            if (error_kind.empty()) return finite_gradients(run->grads.dq, run->grads.dk, run->grads.dv, "", what);
            return overflow_refusal(message, error_kind, "", what);
        });
    };
    return p;
}

}  // namespace attn::suite
