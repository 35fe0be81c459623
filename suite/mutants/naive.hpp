// suite/mutants/naive.hpp: the plain-loop SDPA every mutant starts from; each mutant replaces one step with
// its own wrong math. Built only for the suite; never part of the library.
//
// Per batch element b (flat over the broadcast batch dims), with the validated problem p:
//   1. scores  s (Tq, Tk) = scale * q k^T                 (naive dot products in T), soft-capped (options.softcap)
//              and biased (options.bias, added after the cap)
//   2. mask    s[i, j] = -inf where query i may not read key j
//   3. softmax over keys, per row: max, exp(s - max), sum, divide
//   4. mix     out (Tq, Dv) = w (Tq, Tk) @ v (Tk, Dv), over the allowed keys only
// Rows with no allowed key are written per options.empty_rows after step 4.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attn/oracle/oracle.hpp"
#include "attn/detail/problem.hpp"
#include "attn/suite/registry.hpp"

namespace attn::suite::mutant {

template <class T>
struct Steps {
    // Steps 1-3: the weights (Tq, Tk) of batch element b, row-major.
    std::function<void(const SdpaProblem<T>&, Index b, const SdpaOptions&, std::vector<T>& w)> weights;
    // Step 4: out (Tq, Dv) of batch element b from its weights.
    std::function<void(const SdpaProblem<T>&, Index b, const SdpaOptions&, const std::vector<T>& w, T* out)> mix;
    bool write_empty_rows = true;  // apply options.empty_rows to rows with no allowed key
    // Custom steps that handle SdpaOptions::softcap themselves; other custom weights or mixes (which may recompute the
    // logits, as kernels/ does) are Unsupported on a capped case: their mistake is elsewhere, and a kernel that ignored
    // the cap would be caught for that instead.
    bool soft_caps = false;
    // The same for SdpaOptions::bias: custom steps that add it themselves.
    bool adds_bias = false;
    // After everything: the whole output (batch..., Tq, Dv), for mutants that scramble it.
    std::function<void(const SdpaProblem<T>&, T* output)> post;
};

// 1. scores (Tq, Tk) = scale * q k^T.
template <class T>
std::vector<T> scores(const SdpaProblem<T>& p, Index b, T scale) {
    std::vector<T> s(static_cast<std::size_t>(p.Tq * p.Tk));
    for (Index i = 0; i < p.Tq; ++i)
        for (Index j = 0; j < p.Tk; ++j) {
            T dot = 0;
            for (Index d = 0; d < p.Dk; ++d) dot += p.q_row(b, i)[d * p.q.stride(-1)] * p.k_row(b, j)[d * p.k.stride(-1)];
            s[static_cast<std::size_t>(i * p.Tk + j)] = scale * dot;
        }
    return s;
}

// 2. blocked logits become `blocked` (-inf when correct).
template <class T>
void mask_scores(const SdpaProblem<T>& p, Index b, std::vector<T>& s, T blocked = -std::numeric_limits<T>::infinity()) {
    for (Index i = 0; i < p.Tq; ++i)
        for (Index j = 0; j < p.Tk; ++j)
            if (!p.allowed(b, i, j)) s[static_cast<std::size_t>(i * p.Tk + j)] = blocked;
}

// 3. stable softmax over keys, per row (rows of all -inf become 0).
template <class T>
void softmax_rows(std::vector<T>& s, Index Tq, Index Tk) {
    for (Index i = 0; i < Tq; ++i) {
        T* row = s.data() + i * Tk;
        T row_max = -std::numeric_limits<T>::infinity();
        bool any = false;  // a key that is not -inf (NaN counts: it must propagate, not vanish as an empty row)
        for (Index j = 0; j < Tk; ++j) {
            any |= row[j] != -std::numeric_limits<T>::infinity();
            row_max = std::max(row_max, row[j]);
        }
        if (!any) {
            std::fill_n(row, Tk, T(0));
            continue;
        }
        T sum = 0;
        for (Index j = 0; j < Tk; ++j) sum += (row[j] = std::exp(row[j] - row_max));
        for (Index j = 0; j < Tk; ++j) row[j] /= sum;
    }
}

// 1b. soft-capping (SdpaOptions::softcap): every logit s becomes c tanh(s / c), before the mask.
template <class T>
void cap_scores(const SdpaProblem<T>& p, std::vector<T>& s) {
    if (p.softcap == 0) return;
    const T c = static_cast<T>(p.softcap);
    for (T& x : s) x = c * std::tanh(x / c);
}

// 1c. the bias (SdpaOptions::bias and ALiBi's, SdpaProblem::bias_at), added after the cap, before the mask (a -inf bias is blocked by the mask).
template <class T>
void bias_scores(const SdpaProblem<T>& p, Index b, std::vector<T>& s) {
    if (!p.has_bias()) return;
    for (Index i = 0; i < p.Tq; ++i)
        for (Index j = 0; j < p.Tk; ++j) s[static_cast<std::size_t>(i * p.Tk + j)] += p.bias_at(b, i, j);
}

template <class T>
T default_scale(const SdpaProblem<T>& p) {
    return static_cast<T>(p.scale);
}

template <class T>
void correct_weights(const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
    w = scores(p, b, default_scale(p));
    cap_scores(p, w);
    bias_scores(p, b, w);
    mask_scores(p, b, w);
    softmax_rows(w, p.Tq, p.Tk);
}

// 4. out (Tq, Dv) = w @ v over allowed keys (values nobody may read never enter a product).
template <class T>
void correct_mix(const SdpaProblem<T>& p, Index b, const SdpaOptions&, const std::vector<T>& w, T* out) {
    for (Index i = 0; i < p.Tq; ++i)
        for (Index d = 0; d < p.Dv; ++d) {
            T acc = 0;
            for (Index j = 0; j < p.Tk; ++j)
                if (p.allowed(b, i, j)) acc += w[static_cast<std::size_t>(i * p.Tk + j)] * p.v_row(b, j)[d * p.v.stride(-1)];
            out[i * p.Dv + d] = acc;
        }
}

// The driver: validation and contracts as the library (make_sdpa_problem, check_contracts), then the steps.
template <class T>
SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                  std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options, Steps<T> steps) {
    if (options.softcap != 0 && (steps.weights || steps.mix) && !steps.soft_caps)
        throw Unsupported(name + " does not soft-cap its logits (SdpaOptions::softcap)");
    if ((options.bias || options.alibi_slopes) && (steps.weights || steps.mix) && !steps.adds_bias)
        throw Unsupported(name + " does not add a bias to its logits (SdpaOptions::bias, alibi_slopes)");
    if (!steps.weights) steps.weights = correct_weights<T>;
    if (!steps.mix) steps.mix = correct_mix<T>;
    const SdpaProblem<T> p = make_sdpa_problem<T>(name, q, k, v, allowed_mask, options);
    const std::vector<Readability> readable = check_contracts(p, options);
    SdpaResult<T> r{Tensor<T>(p.output_shape()), std::nullopt};
    if (options.return_weights) r.weights = Tensor<T>(p.weights_shape());
    std::vector<T> w;
    for (Index b = 0; b < p.batch; ++b) {
        steps.weights(p, b, options, w);
        T* out = r.output.data() + b * p.Tq * p.Dv;
        steps.mix(p, b, options, w, out);
        for (Index i = 0; i < p.Tq; ++i) {
            if (!steps.write_empty_rows || readable[static_cast<std::size_t>(b)].row_nonempty[static_cast<std::size_t>(i)])
                continue;
            const T fill = options.empty_rows == EmptyRowPolicy::Nan ? std::numeric_limits<T>::quiet_NaN() : T(0);
            std::fill_n(out + i * p.Dv, p.Dv, fill);
            std::fill_n(w.begin() + i * p.Tk, p.Tk, fill);
        }
        if (r.weights) std::copy(w.begin(), w.end(), r.weights->data() + b * p.Tq * p.Tk);
    }
    if (steps.post) steps.post(p, r.output.data());
    return r;
}

// The per-batch gradients (batch, rows, cols) of one input summed into its own shape (stride 0 on broadcast dims),
// in increasing batch order; with `assign`, each batch element overwrites instead (GqaNotSummed).
template <class T>
Tensor<T> into_shape(const std::vector<T>& parts, const Shape& shape, const Shape& batch_shape, Index rows, Index cols,
                     bool assign) {
    Tensor<T> out(shape);
    Shape full = batch_shape;
    full.push_back(rows);
    full.push_back(cols);
    const TensorView<const T> target = TensorView<const T>(out.data(), shape).broadcast_to(full, "mutant", "gradient");
    const std::vector<Index> offsets =
        attn::detail::batch_offsets(target, static_cast<Index>(batch_shape.size()), batch_shape);
    const Index batch = numel(batch_shape);
    for (Index b = 0; b < batch && out.numel() > 0; ++b)
        for (Index i = 0; i < rows; ++i)
            for (Index c = 0; c < cols; ++c) {
                T& dst = out.data()[offsets[static_cast<std::size_t>(b)] + i * target.stride(-2) + c * target.stride(-1)];
                const T x = parts[static_cast<std::size_t>((b * rows + i) * cols + c)];
                dst = assign ? x : dst + x;
            }
    return out;
}

// An Implementation entry for a mutant: both dtypes run `make_steps<T>()` through the driver. Mutants declare
// the conservative generic error model: they must be caught by their wrong math, not by a tight bound.
template <template <class> class MakeSteps>
Implementation make_mutant(const std::string& name, const std::string& description) {
    Implementation impl;
    impl.name = name;
    impl.description = description;
    impl.is_mutant = true;
    impl.error_model = oracle::generic_model();
    impl.run_float = [name](TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                            std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return MakeSteps<float>::run(name, q, k, v, m, o);
    };
    impl.run_double = [name](TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return MakeSteps<double>::run(name, q, k, v, m, o);
    };
    return impl;
}

// A mutant whose mistake is in steps 1-3: Mistake::weights<T> replaces them and soft-caps the logits itself; with
// AddsBias it adds the bias and ALiBi's term itself too (otherwise a biased case is Unsupported for it).
template <class Mistake, bool AddsBias>
struct WeightsMistake {
    template <class T>
    struct Steps {
        static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
            mutant::Steps<T> steps;
            steps.weights = Mistake::template weights<T>;
            steps.soft_caps = true;
            steps.adds_bias = AddsBias;
            return mutant::run<T>(name, q, k, v, m, o, steps);
        }
    };
};
template <class Mistake, bool AddsBias>
Implementation weights_mutant(const std::string& name, const std::string& description) {
    return make_mutant<WeightsMistake<Mistake, AddsBias>::template Steps>(name, description);
}

// Every mutant (a file each under suite/mutants/, or one per family of mistakes).
std::vector<Implementation> all();
// The low-precision mistakes, on 16-bit storage only (suite/mutants/sixteen_bit.cpp).
std::vector<Implementation> sixteen_bit();

}  // namespace attn::suite::mutant
