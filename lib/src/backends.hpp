// Internal: the kernels behind scaled_dot_product_attention, all fed the same validated problem.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/backward.hpp"
#include "attn/detail/problem.hpp"
#include "attn/detail/splitmix64.hpp"

namespace attn::detail {

// Every kernel writes output (batch, Tq, Dv), when weights != nullptr weights (batch, Tq, Tk), and when lse != nullptr
// each row's log-sum-exp (batch, Tq) (SdpaOptions::return_lse), all contiguous. Contract checks (empty rows under
// Throw, finite inputs) have already run; rows with no allowed key are written per options.empty_rows by
// write_empty_row (their lse is -inf).
template <class T>
void sdpa_reference(const SdpaProblem<T>& problem, const std::vector<Readability>& readable, const SdpaOptions& options,
                    T* output, T* weights, compute_t<T>* lse);

// Step 3 of sdpa_reference for query row i of batch element b: row[c], the logit scale * q.k of readable key keys[c]
// (c < n) in the compute type T, becomes its weight: blocked keys 0, the others soft-capped (std::tanh), biased
// (bias_at), exponentiated after the row's max and normalised by their sum. Returns the row's lse, max + log(sum).
// With cap_derivative, cap_derivative[c] = 1 - tanh^2(s / softcap) for each allowed key under a cap (the backward's
// factor). A logit that overflowed is a ValueError under check_finite.
template <class S, class T = compute_t<S>>
T reference_softmax_row(const SdpaProblem<S>& p, const SdpaOptions& options, Index b, Index i, const Index* keys,
                        Index n, T* row, T* cap_derivative);

// The backward's kernels (attn/backward.hpp), per batch element b of a checked problem, into contiguous dq (Tq, Dk),
// dk (Tk, Dk), dv (Tk, Dv) in the compute type.
// The readable key positions of a batch element, ascending: the only keys a backward gathers.
std::vector<Index> readable_keys(const Readability& r);
// The tiled backward (attn/tiled.hpp, TiledBackwardInfo): P from the saved lse, D from the saved output. Returns
// false, computing nothing, when a readable value is NaN or Inf (check_finite off): the reference backward, whose
// products run over allowed pairs only, is the one that keeps it from rows that may not read it.
template <class S, class T>
bool sdpa_backward_tiled_batch(const SdpaProblem<S>& p, const Readability& r, const SdpaOptions& options, Index b,
                               const SavedRows<S>& out, const SavedRows<S>& dout, const SavedRows<T>& lse, T* dq,
                               T* dk, T* dv);
// Both backwards' last step: dkc and dvc (one row per readable key, keys[c]) scattered to the key positions (0 at
// keys nobody reads), dq rows of queries with no allowed key per the policy, and under check_finite a ValueError
// for a gradient that overflowed.
template <class S, class T>
void finish_backward_batch(const SdpaProblem<S>& p, const Readability& r, const SdpaOptions& options, Index b,
                           const std::vector<Index>& keys, const std::vector<T>& dkc, const std::vector<T>& dvc, T* dq,
                           T* dk, T* dv);

// Dropout on the attention weights (MhaConfig::dropout_seed's rule): weight `flat` = (b Tq + i) Tk + j of a flat
// batch (the head path's b H + h) is kept at draw `step` when unit_uniform(m(m(m(seed) ^ step) ^ flat)) >= p, and
// then multiplied by dropout_keep_scale<C>(p) = C(1 / (1 - p)), one rounding in the compute type C.
struct WeightDropout {
    double p = 0;
    std::uint64_t seed = 0, step = 0;
};
inline bool dropout_keeps(const WeightDropout& d, Index flat) {
    return unit_uniform(splitmix64_mix(splitmix64_mix(splitmix64_mix(d.seed) ^ d.step) ^ static_cast<std::uint64_t>(flat))) >=
           d.p;
}
template <class C>
C dropout_keep_scale(double p) {
    return static_cast<C>(1.0 / (1.0 - p));
}

// sdpa_backward of the forward whose weights were dropped out by `dropout` (out = (P * keep / (1 - p)) v): the
// reference backward (whatever options.backend says) with dv = dropped(P)^T dout, dP = dropped(dout v^T), D and dS as
// without dropout. The head path's training mode (multi_head_sdpa_backward).
template <class S>
SdpaGradients<S> sdpa_backward_with_dropout(TensorView<const S> q, TensorView<const S> k, TensorView<const S> v,
                                            TensorView<const S> out, TensorView<const compute_t<S>> lse,
                                            TensorView<const S> dout, std::optional<TensorView<const bool>> allowed_mask,
                                            const SdpaOptions& options, const WeightDropout& dropout);

// Backend::Auto picks `tiled` from this many scores per batch element (Tq * Tk) on, forward and backward (sdpa.cpp
// says how it was measured).
inline constexpr Index auto_tiled_min_scores = 128 * 128;

// FlashAttention-style: output and lse only (never a Tq x Tk matrix, so no weights), same contracts as
// sdpa_reference. Block sizes and rounding structure: attn/tiled.hpp.
template <class T>
void sdpa_tiled(const SdpaProblem<T>& problem, const std::vector<Readability>& readable, const SdpaOptions& options,
                T* output, compute_t<T>* lse);

// Thrown by sdpa_tiled on a readability whose values were not checked (Readability::values_deferred) when it reads
// a value of q, k, v or the bias that is not finite: the caller checks the contracts with the values read and runs
// the call again.
struct ValuesNeedChecking {};

// x[i] = exp(x[i]) for i < n with the exp the tiled kernel uses (kernel_exp in sdpa_tiled.cpp), so its accuracy can be measured.
template <class T>
void tiled_exp(T* x, Index n);

// x[i] = cap * tanh(x[i] / cap) for i < n (cap > 0) with the soft-capping the tiled kernel applies to its allowed
// logits (Highway's Tanh), so its accuracy can be measured; -inf and NaN pass unchanged.
template <class T>
void tiled_softcap(T* x, Index n, T cap);

// y[i] = float(x[i]) for i < n with the SIMD conversion the tiled kernel packs 16-bit q, k and v with, so it can be
// checked against the scalar one (attn/half.hpp) on every pattern and target.
template <class S>
void tiled_widen(const S* x, Index n, float* y);
// y[i] = S(x[i]) for i < n with the SIMD rounding the tiled kernel writes a 16-bit output with (the same check).
template <class S>
void tiled_narrow(const float* x, Index n, S* y);

// SIMD dispatch of the tiled kernel (sdpa_tiled.cpp): the Highway targets compiled in (a HWY_TARGETS mask) and
// the one HWY_DYNAMIC_DISPATCH runs now (a single target bit).
std::int64_t simd_compiled_targets();
std::int64_t simd_dispatched_target();
// Applies ATTN_SIMD_TARGET (attn/machine.hpp) once, before the first dispatch; cheap afterwards.
void apply_simd_target_from_environment();

// Output row (Dv) and weights row (Tk, may be null) of a query with no allowed key: 0 under Zero, NaN under Nan.
template <class T>
void write_empty_row(EmptyRowPolicy policy, T* output_row, Index Dv, T* weights_row, Index Tk);

// The contract that finite readable inputs give finite outputs: a logit or output that overflowed is reported
// as a ValueError naming the row, never returned as Inf or NaN.
// `shapes` (SdpaProblem::shapes) names the tensors and their shapes in the message; `row_name` what `row` counts.
[[noreturn]] void throw_overflow(const std::string& function, const char* what, const std::string& batch_index, Index row,
                                 const std::string& shapes = {}, const char* row_name = "query row");

// How parallel_for hands out items: in equal contiguous chunks, or one at a time to whichever thread is free
// (items of unequal cost, e.g. causal query blocks). Which thread runs an item never changes its result.
enum class Schedule { Static, Dynamic };

// The library's one parallel loop: body(0..count-1) on `threads` threads (OpenMP); rethrows the exception of the
// lowest failing index, so errors do not depend on the thread count. Inside body, omp_get_thread_num() is the
// thread's index in [0, threads).
void parallel_for(Index count, int threads, const std::function<void(Index)>& body,
                  Schedule schedule = Schedule::Static);

// Threads for a parallel region: `requested`, or OpenMP's default when 0.
int thread_count(int requested);
inline int thread_count(const SdpaOptions& options) { return thread_count(options.num_threads); }

}  // namespace attn::detail
