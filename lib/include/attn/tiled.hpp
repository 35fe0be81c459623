// attn/tiled.hpp: the structure of the `tiled` backend that its rounding errors depend on, for error models.
#pragma once

#include "attn/tensor.hpp"

namespace attn {

// How backend `tiled` computes softmax(scale * q k^T) v, as far as rounding is concerned. The oracle's
// ErrorModel for this backend, oracle::library_tiled_model, is these facts and nothing else: each field below is
// one claim about the kernel (lib/src/sdpa_tiled.cpp), read there field by field.
//
// Per (batch element, block of query_block query rows), the readable keys (those some query may read, gathered
// in ascending order) are visited in blocks of key_block keys, blocks starting at readable key 0:
//   1. s_j = fl(scale * fl(q . k_j))                  BLIS micro-kernel: sequential FMA sum over Dk, then alpha
//   2. m_new = max(m, max_j s_j) over allowed keys      exact
//   3. p_j = Exp(s_j - m_new)                           one rounding in the subtraction, Exp within exp_max_ulps
//   4. c = Exp(m - m_new); l = fl(c l + sum_j p_j)      the block sum sequential over keys, then one FMA
//   5. acc = fl(fl(c acc) + fl(sum_j p_j v_j))          the block's sum formed on its own (BLIS micro-kernel with
//                                                       beta = 0, any order), then one addition to acc
//   6. out = acc / l
// Every step is element-wise per query (one SIMD lane per query), so neither the vector width nor the thread
// count changes a bit of the result on one SIMD target. The kernel is compiled for every Highway target and
// dispatched at run time (attn/machine.hpp); targets may round differently (an FMA where an older target
// multiplies and adds, Exp's own polynomial), which steps 1-6 allow: the error model counts every operation as
// rounded and Exp's error is measured within exp_max_ulps on each target (lib/tests/tiled_test.cpp).
struct TiledKernelInfo {
    Index query_block;          // query rows per task
    Index key_block;            // keys per online-softmax step
    double exp_max_ulps;        // the kernel's Exp: max error in ulps of the result (measured on every target)
    // SdpaOptions::softcap: after step 1, s_j = fl(fl(cap) * Tanh(fl(s_j * fl(1 / fl(cap))))) for allowed keys,
    // the tanh within tanh_max_ulps. SdpaOptions::bias: then s_j = fl(s_j + bias_j), one addition per allowed
    // key (oracle/BOUNDS.md section 2c).
    double tanh_max_ulps;
    bool scale_folded_into_q;   // false: the scale multiplies the rounded dot product, as in `reference`
    // Steps 4 and 5: each key block's sums (of p_j and of p_j v_j) are formed apart from the running l and acc and
    // joined to them by one rounding each, so a term meets at most key_block - 1 additions in its own block and one
    // per block after it (oracle/BOUNDS.md section 3, "Blocked sums").
    bool block_partial_sums;
    // Step 1's scale: static_cast<T>(scale), applied once as the micro-kernel's alpha (one rounding of the scale).
    Index scale_roundings;
    // Step 3's exponent s_j - m_new: one rounding (a subtraction on the CPU; no fused log2(e) multiply, no exp2).
    Index shift_roundings;
    // Step 2's max is exact (a max of rounded logits, not itself rounded to a coarser grid before the shift).
    bool rounded_max_shift;
    // The running max is rescaled whenever a logit exceeds it (no lazy rescaling: exps of arguments <= 0 only).
    double stale_max;
    // One pass over the keys per row: no split-KV partial results combined through their log-sum-exps.
    bool split_kv;
    // Step 6 divides by l (no reciprocal 1 / l multiplied in).
    bool reciprocal_normalisation;
    // Subnormal inputs and intermediates are kept as they are (no flush-to-zero, no denormals-are-zero).
    bool gradual_underflow;
    bool inputs_flushed;
    // Online-softmax rescalings per row (at most one per key block the row visits): ceil(readable keys / key_block).
    constexpr Index rescalings(Index readable_keys) const { return (readable_keys + key_block - 1) / key_block; }
};

// The kernel's Exp (sdpa_tiled.cpp, kernel_exp): Highway's reduction and polynomial (hwy/contrib/math/math-inl.h,
// "Max Error: ULP = 1") with the rounding to q and the scaling by 2^q done in fewer operations. Its arguments are
// <= 0 (s - max), -inf (a blocked key; exp gives 0) or, in the backward, s - lse, which a saved lse's rounding may
// leave just above 0; at most 1 ulp on every target over (-inf, log(max)], subnormal results included
// (lib/tests/tiled_test.cpp measures it).
inline constexpr double tiled_exp_max_ulps = 1.0;

// The soft-capping's tanh. float: the kernel's own rational approximation (sdpa_tiled.cpp, tanh_float), checked at
// every float in [2^-13, 16] on every target (lib/tests/tiled_test.cpp): at most 5 ulps where the target has FMA,
// 6 where it multiplies and adds apart (SSSE3, SSE4, scalar); below 2^-13 within 1. double: Highway's Tanh
// (hwy/contrib/math/math-inl.h), "Max Error: ULP = 4" (measured 3). One number for both.
inline constexpr double tiled_tanh_max_ulps = 6.0;

// Block sizes. Query block: the q block (128 x Dk) and the accumulator (128 x Dv) stay in L1/L2 for Dk, Dv <= 128;
// key block: the score block s (128 x 256 floats = 128 KiB, 256 KiB for double) stays in the 1 MiB L2 together
// with the k and v blocks (256 x D each) it is computed from.
inline constexpr Index tiled_query_block = 128;
inline constexpr Index tiled_key_block = 256;

inline constexpr TiledKernelInfo tiled_kernel_info{.query_block = tiled_query_block,
                                                  .key_block = tiled_key_block,
                                                  .exp_max_ulps = tiled_exp_max_ulps,
                                                  .tanh_max_ulps = tiled_tanh_max_ulps,
                                                  .scale_folded_into_q = false,
                                                  .block_partial_sums = true,
                                                  .scale_roundings = 1,
                                                  .shift_roundings = 1,
                                                  .rounded_max_shift = false,
                                                  .stale_max = 0,
                                                  .split_kv = false,
                                                  .reciprocal_normalisation = false,
                                                  .gradual_underflow = true,
                                                  .inputs_flushed = false};

// How backend `tiled` computes the backward pass (attn::sdpa_backward; FlashAttention-2's algorithm), as far as
// rounding is concerned. The oracle's ErrorModel fields backward_weights_from_lse and backward_d_from_output describe
// it (oracle/BOUNDS.md section 12b). Per batch element, one thread, key blocks of key_block readable keys outside and
// blocks of query_block query rows inside (blocks no row of which reads a key of the key block are skipped):
//   1. D_i = fl(sum_c dout_ic out_ic)                  the forward's saved output, sequential over Dv, once per row
//   2. s_ij = fl(scale * fl(q_i . k_j))                 packed products, any order; then the forward's cap and bias
//                                                       (TiledKernelInfo: Highway's Tanh, one addition)
//   3. p_ij = Exp(fl(s_ij - lse_i))                     the forward's saved lse, the forward's Exp (exp_max_ulps)
//   4. dv_j += p_ij dout_i; dP_ij = fl(dout_i . v_j)     packed products, any order; dv summed over query blocks
//   5. dS_ij = fl(p_ij fl(dP_ij - D_i))                 (times fl(1 - t^2), t = s'_ij / cap, with a cap)
//   6. dk_j += dS_ij q_i; dq_i += dS_ij k_j              packed products, summed over blocks (any order)
//   7. dq = fl(scale * dq), dk = fl(scale * dk)         once, at the end
// No step depends on the thread count (threads take whole batch elements), so neither do the bits.
struct TiledBackwardInfo {
    Index query_block;
    Index key_block;
    bool weights_from_lse;  // step 3: P recomputed from the forward's saved lse, not by the forward's softmax
    bool d_from_output;     // step 1: D from the forward's saved output, not rowsum(P * dP)
};
// Blocks: the score and dP tiles (128 x 128 each, 64 KiB in float) stay in L2 with the q, dout, k and v blocks.
inline constexpr TiledBackwardInfo tiled_backward_info{
    .query_block = 128, .key_block = 128, .weights_from_lse = true, .d_from_output = true};

}  // namespace attn
