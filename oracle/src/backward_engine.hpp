// Internal: the oracle's exact attention gradients of one batch element, in 261-bit arithmetic (attn/oracle/backward.hpp).
#pragma once

#include <vector>

#include "attn/detail/problem.hpp"
#include "types.hpp"

namespace attn::oracle::detail {

using Mp = Mpfr261;

// One batch element's exact problem: row-major q (Tq, Dk), k (Tk, Dk), v (Tk, Dv), dout (Tq, Dv); the additive term
// of each allowed (query, key) pair, exact (bias (Tq, Tk), 0 without one); allowed (Tq, Tk) the positional rule, the
// mask and the -inf bias together; cap 0 = no soft-capping.
struct ExactHead {
    Index Tq = 0, Tk = 0, Dk = 0, Dv = 0;
    std::vector<Mp> q, k, v, dout, bias;
    std::vector<char> allowed;
    Mp scale, cap;
    // Multipliers of the weights (Tq, Tk), e.g. dropout's 0 or 1/(1-p): the output is sum_j mult_ij P_ij v_j.
    // Empty: all 1.
    std::vector<Mp> mult;
};

// Batch element b of a checked problem, dout's rows from `dout` (rows of queries with no allowed key are 0).
template <class T>
ExactHead exact_head(const SdpaProblem<T>& p, const Readability& r, Index b, const attn::detail::SavedRows<T>& dout);

// The exact output (Tq, Dv), with the multipliers; a row with no allowed key is 0.
std::vector<Mp> exact_output(const ExactHead& h);

// What the gradient bound (oracle/BOUNDS.md section 12) needs beyond the exact values: the forward's rigorous bound
// on each computed weight (Tq, Tk) for the declared model, the compute type's unit roundoff, its underflow units per
// product and per addition (section 0, assumption 1), and the roundings of the scale.
struct BoundInputs {
    const double* weights_bound = nullptr;
    double u = 0;
    long double eta_mul = 0, eta_add = 0;
    Index scale_roundings = 1;
    // Section 12b, a backward of FlashAttention-2's structure: weights Exp(fl(s - lse_hat)) with the forward's logit
    // errors (Tq, Tk) and its saved lse_hat bounded from the forward's model (the rest of the fields), D from its
    // saved output, within the forward's output bound (Tq, Dv).
    bool weights_from_lse = false, d_from_output = false;
    const double* logits_bound = nullptr;
    const double* output_bound = nullptr;
    double exp_ulps = 0, log_ulps = 0, stale_max = 0;
    Index shift_roundings = 1, rescalings = 0;
    bool rounded_max_shift = false, split_kv = false;
    long double min_normal = 0;
    // ErrorModel::probabilities_in_storage in the backward: each weight and each dS rounded to the storage type
    // (unit roundoff u_storage, half its smallest subnormal half_denorm_storage) before the products it enters.
    bool in_storage = false;
    double u_storage = 0, half_denorm_storage = 0;
};

struct ExactGradients {
    std::vector<Mp> dq, dk, dv;  // (Tq, Dk), (Tk, Dk), (Tk, Dv); 0 at rows with no allowed key and keys nobody reads
    // With BoundInputs: section 12's bound on |computed - exact| of each element, before the batch sums.
    std::vector<long double> dq_bound, dk_bound, dv_bound;
};
ExactGradients exact_gradients(const ExactHead& h, const BoundInputs* bound = nullptr);

// gamma_k = k u / (1 - k u) (oracle/BOUNDS.md section 1); infinite when k u >= 1.
long double gamma(Index k, double u);

}  // namespace attn::oracle::detail
