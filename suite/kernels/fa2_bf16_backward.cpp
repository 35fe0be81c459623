// A correct forward and backward in FlashAttention-2's 16-bit arithmetic ([FA2] Algorithms 1 and 2), on bfloat16
// (and float16) storage with float32 accumulation, so that the tiled(key_block) model with probabilities_in_storage
// is checked against what it claims to cover (oracle/BOUNDS.md sections 11, 12 and 12b):
//   forward:  fa2_style's arithmetic in float (raw dots, keys in blocks of kKeyBlock, exp2(fma(s, c, -fl(m c))),
//             exp2 rescaling), each exp rounded to storage before P V (the sum of exps stays in float), the output
//             S(acc * fl(1 / l)), and the row's log-sum-exp lse = fl(fl(m scale) + fl(log l)) saved in float;
//   backward: D_i = dO_i . O_i from the saved 16-bit output; P_ij = exp2(fma(s_ij, c, -fl(lse_i log2 e))) from the
//             saved lse; dv_j += S(P_ij) dO_i; dP_ij = dO_i . v_j; dS_ij = P_ij (dP_ij - D_i) in float;
//             dq_i += S(dS_ij) k_j, dk_j += S(dS_ij) q_i; dq and dk times fl(scale) at the end; the batch elements of
//             a broadcast input summed in float; one rounding to storage.
// Plain loops; no soft-cap and no bias (those cases are Unsupported); validation and contracts as the library's.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../mutants/naive.hpp"

namespace attn::suite::kernels {
namespace {

constexpr Index kKeyBlock = 16;  // small, so that the suite's cases span several blocks
constexpr float kLog2e = 1.4426950408889634f;

// Where fl(x) has lost the exponent's units (|x| >= 2^17 in float), the FMA form's error u |x| would overflow exp2:
// such rows take the difference form exp2(fl(fl(a - b) c)) (fa2_style does the same), which the model covers too.
bool fma_form(float shift) { return std::fabs(shift) < 1 / (64 * std::numeric_limits<float>::epsilon()); }

template <class S>
float dot(const S* a, Index sa, const S* b, Index sb, Index n) {
    float acc = 0;
    for (Index d = 0; d < n; ++d) acc += static_cast<float>(a[d * sa]) * static_cast<float>(b[d * sb]);
    return acc;
}

template <class S>
struct Forward {
    Tensor<S> output;        // (batch..., Tq, Dv)
    std::vector<float> lse;  // (batch, Tq); -inf on rows with no allowed key
};

template <class S>
Forward<S> forward(const std::string& name, const SdpaProblem<S>& p, const std::vector<Readability>& readable,
                   const SdpaOptions& options) {
    if (p.softcap != 0 || p.has_bias()) throw Unsupported(name + " has no soft-cap and adds no bias to its logits");
    constexpr float inf = std::numeric_limits<float>::infinity();
    const float scale = static_cast<float>(p.scale), c = scale * kLog2e;
    const bool flip = c < 0;  // the largest logit has the smallest raw dot product
    const auto above = [flip](float a, float b) { return flip ? a < b : a > b; };
    Forward<S> f{Tensor<S>(p.output_shape()), std::vector<float>(static_cast<std::size_t>(p.batch * p.Tq), -inf)};
    std::vector<float> s(static_cast<std::size_t>(p.Tk)), acc(static_cast<std::size_t>(p.Dv));
    for (Index b = 0; b < p.batch; ++b)
        for (Index i = 0; i < p.Tq; ++i) {
            S* out = f.output.data() + (b * p.Tq + i) * p.Dv;
            if (!readable[static_cast<std::size_t>(b)].row_nonempty[static_cast<std::size_t>(i)]) {
                const float fill = options.empty_rows == EmptyRowPolicy::Nan ? std::numeric_limits<float>::quiet_NaN() : 0;
                std::fill_n(out, p.Dv, S(fill));
                continue;
            }
            float m = flip ? inf : -inf, l = 0;
            bool started = false;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (Index j0 = 0; j0 < p.Tk; j0 += kKeyBlock) {
                const Index j1 = std::min(p.Tk, j0 + kKeyBlock);
                float m_new = m;
                bool any = false;
                for (Index j = j0; j < j1; ++j) {
                    if (!p.allowed(b, i, j)) continue;
                    s[static_cast<std::size_t>(j)] = dot(p.q_row(b, i), p.q.stride(-1), p.k_row(b, j), p.k.stride(-1), p.Dk);
                    const float sj = s[static_cast<std::size_t>(j)];
                    if (std::isnan(sj) || above(sj, m_new)) m_new = sj;  // a NaN stays: the row comes out NaN
                    any = true;
                }
                if (!any) continue;
                if (started && m_new != m) {
                    const float alpha = std::exp2((m - m_new) * c);
                    l *= alpha;
                    for (float& a : acc) a *= alpha;
                }
                const float max_scaled = m_new * c;
                for (Index j = j0; j < j1; ++j) {
                    if (!p.allowed(b, i, j)) continue;
                    const float sj = s[static_cast<std::size_t>(j)];
                    const float e = std::exp2(fma_form(max_scaled) ? std::fma(sj, c, -max_scaled) : (sj - m_new) * c);
                    l += e;
                    const float e_stored = static_cast<float>(S(e));  // P in storage before P V
                    const S* vj = p.v_row(b, j);
                    for (Index d = 0; d < p.Dv; ++d)
                        acc[static_cast<std::size_t>(d)] += e_stored * static_cast<float>(vj[d * p.v.stride(-1)]);
                }
                m = m_new;
                started = true;
            }
            const float inv = 1 / l;
            for (Index d = 0; d < p.Dv; ++d) out[d] = S(acc[static_cast<std::size_t>(d)] * inv);
            f.lse[static_cast<std::size_t>(b * p.Tq + i)] = m * scale + std::log(l);
        }
    return f;
}

template <class S>
SdpaResult<S> run(const std::string& name, TensorView<const S> q, TensorView<const S> k, TensorView<const S> v,
                  std::optional<TensorView<const bool>> mask, const SdpaOptions& options) {
    const SdpaProblem<S> p = make_sdpa_problem<S>(name, q, k, v, mask, options);
    const std::vector<Readability> readable = check_contracts(p, options);
    Forward<S> f = forward(name, p, readable, options);
    SdpaResult<S> r{std::move(f.output), std::nullopt};
    if (options.return_lse) {
        Shape shape = p.output_shape();
        shape.pop_back();
        r.lse = Tensor<float>(shape);
        std::copy(f.lse.begin(), f.lse.end(), r.lse->data());
    }
    return r;
}

template <class S>
SdpaGradients<S> backward(const std::string& name, TensorView<const S> q, TensorView<const S> k, TensorView<const S> v,
                          TensorView<const S> dout, std::optional<TensorView<const bool>> mask,
                          const SdpaOptions& options) {
    const SdpaProblem<S> p = make_sdpa_problem<S>(name, q, k, v, mask, options);
    const std::vector<Readability> readable = check_contracts(p, options);
    const Forward<S> f = forward(name, p, readable, options);
    const attn::detail::SavedRows<S> g(name, "dout", dout, p.output_shape(), p.batch_shape, p.shapes);
    const Index B = p.batch, Tq = p.Tq, Tk = p.Tk, Dk = p.Dk, Dv = p.Dv;
    const float scale = static_cast<float>(p.scale), c = scale * kLog2e;
    std::vector<float> dq(static_cast<std::size_t>(B * Tq * Dk), 0.0f), dk(static_cast<std::size_t>(B * Tk * Dk), 0.0f),
        dv(static_cast<std::size_t>(B * Tk * Dv), 0.0f);
    for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Tq; ++i) {
            float* dq_i = dq.data() + (b * Tq + i) * Dk;
            if (!readable[static_cast<std::size_t>(b)].row_nonempty[static_cast<std::size_t>(i)]) {
                if (options.empty_rows == EmptyRowPolicy::Nan) std::fill_n(dq_i, Dk, std::numeric_limits<float>::quiet_NaN());
                continue;
            }
            const S* gi = g.row(b, i);
            const S* oi = f.output.data() + (b * Tq + i) * Dv;
            const float D = dot(gi, g.col_stride, oi, Index(1), Dv);
            const float lse = f.lse[static_cast<std::size_t>(b * Tq + i)];
            const float lse_scaled = lse * kLog2e;  // rounded on its own, as FlashAttention-2's backward does
            for (Index j = 0; j < Tk; ++j) {
                if (!p.allowed(b, i, j)) continue;
                const float sj = dot(p.q_row(b, i), p.q.stride(-1), p.k_row(b, j), p.k.stride(-1), Dk);
                const float P = std::exp2(fma_form(lse_scaled) ? std::fma(sj, c, -lse_scaled) : (sj * scale - lse) * kLog2e);
                const float P_stored = static_cast<float>(S(P));
                const float dP = dot(gi, g.col_stride, p.v_row(b, j), p.v.stride(-1), Dv);
                const float dS_stored = static_cast<float>(S(P * (dP - D)));
                float* dk_j = dk.data() + (b * Tk + j) * Dk;
                float* dv_j = dv.data() + (b * Tk + j) * Dv;
                for (Index d = 0; d < Dk; ++d) {
                    dq_i[d] += dS_stored * static_cast<float>(p.k_row(b, j)[d * p.k.stride(-1)]);
                    dk_j[d] += dS_stored * static_cast<float>(p.q_row(b, i)[d * p.q.stride(-1)]);
                }
                for (Index d = 0; d < Dv; ++d) dv_j[d] += P_stored * static_cast<float>(gi[d * g.col_stride]);
            }
        }
    for (float& x : dq) x *= scale;
    for (float& x : dk) x *= scale;
    const auto stored = [](const Tensor<float>& t) {
        Tensor<S> out(t.shape());
        for (Index x = 0; x < t.numel(); ++x) out.data()[x] = S(t.data()[x]);
        return out;
    };
    return {stored(mutant::into_shape(dq, q.shape(), p.batch_shape, Tq, Dk, false)),
            stored(mutant::into_shape(dk, k.shape(), p.batch_shape, Tk, Dk, false)),
            stored(mutant::into_shape(dv, v.shape(), p.batch_shape, Tk, Dv, false))};
}

}  // namespace

Implementation fa2_bf16_backward() {
    Implementation impl;
    impl.name = "fa2_bf16_backward";
    impl.description = "FlashAttention-2's 16-bit forward and backward: float accumulation, P (and dS) rounded to "
                       "storage before their products, P from the saved lse, D from the saved output; checked under "
                       "tiled(16) with probabilities_in_storage";
    impl.error_model = oracle::tiled_model(kKeyBlock);
    impl.error_model.probabilities_in_storage = true;
    const std::string name = impl.name;
    impl.run_bfloat16 = [name](TensorView<const bfloat16> q, TensorView<const bfloat16> k, TensorView<const bfloat16> v,
                               std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return run<bfloat16>(name, q, k, v, m, o);
    };
    impl.run_float16 = [name](TensorView<const float16> q, TensorView<const float16> k, TensorView<const float16> v,
                              std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return run<float16>(name, q, k, v, m, o);
    };
    impl.backward_bfloat16 = [name](TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                    TensorView<const bfloat16> v, TensorView<const bfloat16> dout,
                                    std::optional<TensorView<const bool>> m,
                                    const SdpaOptions& o) { return backward<bfloat16>(name, q, k, v, dout, m, o); };
    impl.backward_float16 = [name](TensorView<const float16> q, TensorView<const float16> k, TensorView<const float16> v,
                                   TensorView<const float16> dout, std::optional<TensorView<const bool>> m,
                                   const SdpaOptions& o) { return backward<float16>(name, q, k, v, dout, m, o); };
    impl.returns_weights = false;
    impl.bias_unsupported = impl.name + " adds no bias to its logits (SdpaOptions::bias, alibi_slopes)";
    return impl;
}

}  // namespace attn::suite::kernels
