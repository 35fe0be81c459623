// Internal: the oracle's per-column loops in SIMD, compiled for every Highway target and dispatched at run time
// (oracle/src/simd.cpp). Each lane does exactly the scalar operations of one column (IEEE multiplies, adds and
// subtracts, no FMA), so the results are bitwise those of the scalar loops they replace, on any target.
#pragma once

#include <cstddef>

namespace attn::oracle::detail {

// Per column c of Dv: the double-double weighted sum over n keys, o_c = sh[c] + sl[c] (BOUNDS.md section 5): p_hi[j]
// v_jc exactly by TwoProduct (Dekker, Veltkamp's splitting), p_lo[j] v_jc rounded, through Dot2; rows[j] points to
// key j's Dv values; then the final TwoSum.
void weighted_sums_dd_simd(const double* p_hi, const double* p_lo, const double* const* rows, std::size_t n,
                           std::size_t Dv, double* sh, double* sl);

// One key's terms of every column's bound sums (BOUNDS.md sections 3 and 7, the engine's output_row), in double:
// av = |v_c|, d = |v_c - od_c|, ev = |v_c| when below flush_below (a flushing kernel may read it as 0), else 0;
// sc += p av; av_sum += av; av_self += pB_self av; av_impl += ev; spread += pB (d + ev); dv += w ev;
// absterm += w (av + ev). flush_below = 0 when the model reads inputs as given.
void accumulate_key_simd(const double* v, const double* od, std::size_t Dv, double flush_below, double p, double pB,
                         double w, double pB_self, double* sc, double* av_sum, double* av_self, double* av_impl,
                         double* spread, double* dv, double* absterm);

}  // namespace attn::oracle::detail
