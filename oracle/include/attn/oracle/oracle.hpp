// attn/oracle/oracle.hpp: exact-input, high-precision attention with a rigorous per-element forward error bound.
#pragma once

#include <optional>
#include <string>

#include "attn/sdpa.hpp"
#include "attn/tiled.hpp"
#include "attn/tensor.hpp"

namespace attn::oracle {

// How an implementation computes, as far as its rounding errors are concerned. Enters the bound; the derivation
// and the meaning of every field are in oracle/BOUNDS.md. The defaults are the generic model (generic_model()):
// the weakest assumptions, covering every kernel structure BOUNDS.md section 3 derives.
struct ErrorModel {
    std::string name = "generic";  // "generic", "reference", "tiled", ...
    double exp_ulps = 4.0;         // max error of the implementation's exp, in ulps of the result
    Index rescalings = -1;         // online-softmax rescalings per row (one per key block); -1 = unknown, assume Tk
    bool scale_folded_into_q = true;  // the scale may be applied to q before the dot product (one more rounding)
    Index key_block = 0;           // when rescalings == -1 and key_block > 0: ceil(Tk / key_block) rescalings
    // With key_block > 0: each key block's sums (of the exps and of the exps times values) are formed apart from the
    // running sums, in any order, and joined to them by one addition each (not accumulated into the running sum
    // itself, as a tensor-core MMA with the accumulator as C does). A term then meets at most key_block - 1 + (blocks
    // - 1) additions instead of Tk - 1.
    bool block_partial_sums = false;
    // The sum of the exps and each weighted sum add the keys' terms one at a time, in key order (a plain loop; no
    // blocking, pairing or reordering). Only the statistical verdict's row statistic uses it (oracle/BOUNDS.md
    // section 10): its variance proxy then takes the exact partial sums instead of their worst case over orders.
    bool sequential_sums = false;
    // Roundings between SdpaProblem::scale (a double) and the factor the kernel uses; generic's 5: 1/sqrt(Dk) computed
    // in T (sqrt, divide) against the double scale (its own rounding), times a rounded log2(e) for exp2.
    Index scale_roundings = 5;
    // Roundings in each exponent difference: 1 when exp takes fl(s - m) and rescales by exp(fl(m_old - m_new)); 2 when
    // a product follows the difference (exp2(fl(fl(m_old - m_new) * c)), c = scale * log2(e)).
    Index shift_roundings = 2;
    // The shift subtracts a separately rounded max, exp2(fma(s, c, -fl(m * c))) (FlashAttention-2's form): each key's
    // exponent carries up to u |m| more, which does not telescope over rescalings.
    bool rounded_max_shift = true;
    // Lazy rescaling: the running max is kept while a new logit exceeds it by at most stale_max (in the natural
    // exponent), so exps of arguments up to +stale_max occur and the max is rescaled less often (FlashAttention-4
    // keeps it within 8 in base 2, 5.55 here). 0: the running max always follows the logits.
    double stale_max = 5.6;
    // Split-KV (FlashDecoding): the keys are split into parts, each normalised on its own with lse_s = m_s + log(l_s),
    // and the parts combined as sum_s exp(lse_s - lse) o_s with lse the log-sum-exp of the lse_s (no final division).
    bool split_kv = true;
    // Error of the kernel's log (split-KV only), in ulps of max(|log x|, 1): covers a fast log's absolute error
    // near 1 as well as its relative error elsewhere.
    double log_ulps = 4.0;
    // Error of the kernel's tanh (SdpaOptions::softcap only), in ulps of the result (oracle/BOUNDS.md section 2b).
    // generic's 4 is Highway's documented bound; a GPU's tanh.approx.f32 (FlashAttention's fast_tanh) is documented
    // at 2^-10.987 relative, about 2^13 ulps of float: such a kernel needs its own model.
    double tanh_ulps = 4.0;
    // Normalised by a reciprocal, acc * fl(1 / l) and e * fl(1 / l), one rounding more than a division.
    bool reciprocal_normalisation = true;
    // Subnormal inputs may be read as 0 (denormals-are-zero, with flush-to-zero on GPUs): each element of q, k and v
    // below the normal range may be off by its own magnitude.
    bool inputs_flushed = true;
    // Results below the normal range are rounded (IEEE gradual underflow), never flushed to zero: products and
    // quotients then err by at most half the smallest subnormal, sums not at all. false: flush-to-zero (GPUs).
    bool gradual_underflow = false;
    // Kernels on 16-bit storage that round inside the computation as well (BOUNDS.md section 11; every result is
    // rounded to the storage type at the end in any case). logit_storage_roundings: how many times each logit, or the
    // scale it is multiplied by, is rounded to the storage type before the softmax (0: the logits stay in the compute
    // type; 1: the q k^T product is stored; 2: it is then scaled in storage too, as an unfused 16-bit matmul followed
    // by a 16-bit multiplication does). probabilities_in_storage: the exps, or the normalised weights, are rounded to
    // the storage type before the P V product (FlashAttention's forward; a 16-bit softmax followed by a 16-bit
    // matmul); in the backward, each recomputed weight and each dS_ij are rounded to it before the products they
    // enter (FlashAttention-2's backward: dv = P^T dO, dq = dS K, dk = dS^T Q with 16-bit operands; section 12).
    // For float and double targets the storage type is the target itself, and these count roundings more.
    Index logit_storage_roundings = 0;
    bool probabilities_in_storage = false;
    // The backward pass (oracle::sdpa_backward, BOUNDS.md section 12). backward_weights_from_lse: each weight is
    // recomputed as Exp(s - lse) from the forward's saved log-sum-exp, the exponent rounded shift_roundings times
    // (FlashAttention-2), instead of by the forward's own softmax (the reference backward). backward_d_from_output:
    // D_i = dout_i . out_i from the forward's saved output, a dot product over Dv, instead of sum_j p_ij dP_ij.
    // The saved lse and output are bounded as a forward of this model computes them (BOUNDS.md section 12b).
    bool backward_weights_from_lse = false;
    bool backward_d_from_output = false;
};

// A conservative model for a kernel whose structure is unknown (any summation order, folded scale, rescaling
// after every key, exp or exp2 within 4 ulps, FlashAttention-2's rounded-max shift, a reciprocal normalisation,
// flush-to-zero).
ErrorModel generic_model();
// The library's backends, as documented in lib/ (reference: BLIS dot products, scale after, glibc exp; tiled:
// exactly attn::tiled_kernel_info, i.e. its key block, Highway's 1-ulp Exp, the scale as the micro-kernel's alpha).
ErrorModel reference_model();
// key_block: the kernel's, or SdpaOptions::tiled_key_block when a call sets it.
ErrorModel library_tiled_model(Index key_block = tiled_key_block);
// Any online-softmax kernel with the given key block, e.g. one of yours for `attn check --model tiled`: exp within
// 1 ulp, and the scale possibly folded into q together with log2(e) (two more roundings than library_tiled_model).
ErrorModel tiled_model(Index key_block);
// "generic", "reference" or "tiled" (tiled with the given key block); ConfigError otherwise.
ErrorModel model_by_name(const std::string& name, Index key_block = 64);

// Rescalings the model assumes for a row of Tk keys.
Index effective_rescalings(const ErrorModel& model, Index Tk);

struct OracleOptions {
    // Working precision in bits; 0 = the default (113 bits, with error-free double-double dot products and
    // weighted sums). Any other value selects the plain multiprecision path at the next supported precision
    // (114, 261 or 516 bits).
    int bits = 0;
    ErrorModel model = generic_model();
    // Also compute the statistical bound (oracle/BOUNDS.md section 10; the SDPA path only): Result::output_stat_bound
    // and weights_stat_bound, and the row statistic. Costs about half again (T = D = 64: 341 against 495 cases/s).
    bool statistical = false;
};

// The statistical verdict's false-alarm rate per CALL (one oracle result, one `attn check`, one property case): the
// probability that a kernel whose rounding errors follow the model (oracle/BOUNDS.md section 10) is called suspicious.
// Half of it is spread over every element of the call (output and weights) by the union bound, half goes to the row
// statistic.
inline constexpr double statistical_false_alarm = 1e-9;

// The oracle's answer for a target dtype T (float, double, or a 16-bit storage type: attn/half.hpp; then the bounds
// are for a kernel that computes in float32 and rounds its results to T once, BOUNDS.md section 11).
template <class T>
struct Result {
    Tensor<T> output;                 // (batch..., Tq, Dv), exact result correctly rounded to T
    Tensor<T> weights;                // (batch..., Tq, Tk), idem
    Tensor<double> output_bound;      // per element: rigorous bound on |computed - exact| for a T implementation
    Tensor<double> weights_bound;     // idem for the weights
    // Per (query, key) the model's bound on the error of the logit it computes, after the cap and the bias, the
    // scale's roundings included (BOUNDS.md sections 2-2c; 0 where blocked): the backward's weights from the lse
    // (section 12b) start from it.
    Tensor<double> logits_bound;
    Tensor<double> output_scale;      // per element: sum_k p_k |V_k|, the condition-aware scale for relative errors
    Tensor<long double> output_exact; // exact result to ~64 bits, for error measurement (no rounding to T)
    Tensor<long double> weights_exact;
    // exact = output_exact + output_exact_lo to the working precision: long double alone (64 bits) would make
    // the measured error of a double candidate uncertain by 2^-11 of its bound.
    Tensor<long double> output_exact_lo;
    Tensor<long double> weights_exact_lo;
    // Max over elements of (rigorous bound on the oracle's own error) / (the bound it checks). The oracle throws
    // rather than return a result where this exceeds 1e-6 (see max_oracle_error_ratio).
    double oracle_error_ratio = 0;
    int bits = 0;               // working precision used
    // Rows the default path did again in MPFR: a result too close to a rounding boundary of T for its double-double
    // enclosure to decide the rounding (Ziv's strategy), or logits beyond 2^1000 (oracle/BOUNDS.md section 5).
    Index rows_redone_in_mpfr = 0;
    ErrorModel model;           // the model the bounds were computed for
    // With OracleOptions::statistical (else empty): per element, a bound that a kernel of the model whose rounding
    // errors are mean-independent exceeds with probability at most statistical_false_alarm (Higham and Mary 2019;
    // oracle/BOUNDS.md section 10). Never above the rigorous bound; equal to it on structured rows, where rounding
    // errors are correlated (repeated or near-equal terms in a sum) and independence cannot be assumed.
    bool statistical = false;
    Tensor<double> output_stat_bound;
    Tensor<double> weights_stat_bound;
    Index structured_rows = 0;  // rows given the rigorous bound as their statistical one (section 10)
    // The row statistic (section 10), one output element per row, column (flat row index) mod Dv, shape (batch...,
    // Tq): its error is at most row_stat_det + X with X of variance proxy row_stat_sigma^2 (sub-Gaussian, from the
    // sums' roundings). row_stat_sigma = 0: the row takes no part (structured, unbounded, empty, or Dv = 0).
    Tensor<double> row_stat_det;
    Tensor<double> row_stat_sigma;
};

// The oracle's own error must stay below this fraction of every bound it reports.
inline constexpr double max_oracle_error_ratio = 1e-6;

// Same contracts as attn::scaled_dot_product_attention (validation, masks, causal alignments, empty-row policies,
// unreachable positions ignored), computed from the exact inputs in high precision. With check_finite off, a row
// that reads a NaN or Inf comes out NaN (output and weights), with bound 0.
template <class T>
Result<T> scaled_dot_product_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                       std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                                       const OracleOptions& oracle_options = {});

// The one place a high-precision value (hi + lo, hi = the value rounded to nearest double, lo = the rest rounded
// to double) is rounded to T, correctly (to nearest, ties to even), without double rounding.
template <class T>
T round_to(double hi, double lo);

}  // namespace attn::oracle
