// Soft-capping tends to plain attention as the cap grows: |c tanh(s / c) - s| <= |s|^3 / (3 c^2) (tanh y >= y - y^3/3
// for y >= 0), so with every |s_j| <= M each logit moves by at most delta = M^3 / (3 c^2), each weight by a factor
// within e^(+-2 delta), and each output by at most (e^(2 delta) - 1) max_j |v_j - o| <= (e^(2 delta) - 1) 2 max |v|
// (o' - o = sum_j (p'_j - p_j)(v_j - o), |p'_j - p_j| <= p_j (e^(2 delta) - 1)). With c = 2^20 max(M, 1), an output
// under the cap is then within its oracle bound plus that distance of the exact plain output.
#include <cmath>

#include "../checks.hpp"

namespace attn::suite {

Property a_large_softcap_is_plain_attention() {
    Property p;
    p.name = "a_large_softcap_is_plain_attention";
    p.sentence = "With a softcap 2^20 times the largest logit, every output is within its oracle bound, plus the exact "
                 "distance (e^(2 delta) - 1) 2 max|v| that delta = M^3 / (3 c^2) allows, of plain attention's.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.softcap = false, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const double scale = resolved_scale(c.options.scale, c.Dk);
        const Index group = c.H / c.kv_heads;
        double M = 0, v_max = 0;  // M >= every |s_j| (upper ends: sum_d |q_d k_d| in double, widened)
        for (Index b = 0; b < c.B; ++b)
            for (Index h = 0; h < c.H; ++h)
                for (Index i = 0; i < c.Tq; ++i)
                    for (Index j = 0; j < c.Tk; ++j) {
                        double a = 0;
                        for (Index d = 0; d < c.Dk; ++d)
                            a += std::fabs(c.q[((b * c.H + h) * c.Tq + i) * c.Dk + d] *
                                           c.k[((b * c.kv_heads + h / group) * c.Tk + j) * c.Dk + d]);
                        M = std::max(M, std::fabs(scale) * a * (1 + 1e-12));
                    }
        for (Index x = 0; x < c.v.numel(); ++x) v_max = std::max(v_max, std::fabs(c.v[x]));
        SdpaCase capped = c;
        capped.options.softcap = gen::round_to(c.dtype, std::ldexp(std::max(M, 1.0), 20));
        const double cap = capped.options.softcap;
        // No cap 2^20 times the logits fits the type the logits are computed in (float for 16-bit storage).
        const double cap_in_type = c.dtype == Dtype::Double ? cap : static_cast<double>(static_cast<float>(cap));
        if (!std::isfinite(M) || !std::isfinite(v_max) || !std::isfinite(cap_in_type)) return std::nullopt;
        const double delta = M * M * M / (3 * cap * cap);
        const double distance = std::expm1(2 * delta) * 2 * v_max * (1 + 1e-12);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> out = run_impl<T>(impl, capped);
            const oracle::Result<T> oc = oracle_for<T>(impl, capped), plain = oracle_for<T>(impl, c);
            for (Index x = 0; x < out.numel(); ++x) {
                const double exact = static_cast<double>(plain.output_exact[x]);
                const double allowed = oc.output_bound[x] + distance + 1e-300;
                if (!(std::fabs(static_cast<double>(out[x]) - exact) <= allowed * (1 + 1e-12)))
                    return "softcap " + num(cap) + ": output" + index_string(c, x, c.Dv) + " = " + num(out[x]) +
                           " is " + num(std::fabs(static_cast<double>(out[x]) - exact)) + " from plain attention's " +
                           num(exact) + ", beyond its bound " + num(oc.output_bound[x]) + " plus " + num(distance);
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
