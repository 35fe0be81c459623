// Internal: the oracle's per-column loops in SIMD, compiled for every Highway target and dispatched at run time
// (oracle/src/simd.cpp). Each lane does exactly the scalar operations of one column (IEEE multiplies, adds and
// subtracts, no FMA), so the results are bitwise those of the scalar loops they replace, on any target.
#pragma once

#include <cstddef>

#include "dd.hpp"

namespace attn::oracle::detail {

// Per column c of Dv: the double-double weighted sum over n keys, o_c = sh[c] + sl[c] (BOUNDS.md section 5): p_hi[j]
// v_jc exactly by TwoProduct (Dekker, Veltkamp's splitting), p_lo[j] v_jc rounded, through Dot2; rows[j] points to
// key j's Dv values; then the final TwoSum.
void weighted_sums_dd_simd(const double* p_hi, const double* p_lo, const double* const* rows, std::size_t n,
                           std::size_t Dv, double* sh, double* sl);

// Every key's terms of every column's bound sums (BOUNDS.md sections 3 and 7, the engine's output_row), in double,
// each sum in key order: av = |v_jc|, d = |v_jc - od_c|, ev = |v_jc| when below flush_below (a flushing kernel may
// read it as 0), else 0; sc += p_j av; av_sum += av; av_self += pB_self_j av; spread_self += pB_self_j d;
// av_impl += ev; spread += pB_j (d + ev); dv += w_j ev; absterm += w_j (av + ev), from 0. flush_below = 0 when the
// model reads inputs as given.
void accumulate_row_simd(const double* const* rows, std::size_t n, const double* od, std::size_t Dv, double flush_below,
                         const double* p, const double* pB, const double* w, const double* pB_self, double* sc,
                         double* av_sum, double* av_self, double* spread_self, double* av_impl, double* spread,
                         double* dv, double* absterm);

// Dot2 (Ogita, Rump and Oishi 2005; BOUNDS.md section 5) of q (Dk values) with every key j < Tk of kT, stored
// transposed (kT[d * Tk + j]), one key per lane: TwoProduct (its error taken as 0 when exact_products: float inputs,
// whose products are exact in double), TwoSum into s, the errors summed into c; hi[j] = s and lo[j] = c without the
// final rounding, and abs[j] = sum_d |q_d k_jd| summed to nearest.
void dot2_keys_simd(const double* q, const double* kT, std::size_t Dk, std::size_t Tk, bool exact_products, double* hi,
                    double* lo, double* abs);

// e_j = dd_exp_nonpositive(x_j) for j < n (x_j <= 0), bitwise: the same operations per lane, and the lanes whose
// result needs a scaling below 2^-1000 (x_j < -690) or is 0 done by the scalar function.
void dd_exp_nonpositive_simd(const double* x_hi, const double* x_lo, std::size_t n, double* e_hi, double* e_lo);

}  // namespace attn::oracle::detail
