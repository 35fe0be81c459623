// attn/report/oracle_sweep.hpp: the oracle's self-check sweep: random and adversarial cases through an
// implementation of the suite's registry, each compared with the oracle's bound for that implementation's error
// model (no violation allowed) and summarised as worst and median tightness. It lives with the report, not in the
// oracle, because it runs the library's kernels and the oracle uses none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/oracle/metrics.hpp"

namespace attn::report {

struct SweepOptions {
    std::uint64_t seed = 20261130;
    Index cases = 200;
    bool adversarial = true;  // logits up to +-1e4, near-ties, Dk up to 1024, Tk up to 4096, values 1e-30..1e30
    std::string impl = "reference";  // a registry name (attn/suite/registry.hpp); its error model bounds the errors
    // Also run every case on the all-MPFR path (OracleOptions::bits = 114) and compare its rounded output and weights
    // with the default path's, bit for bit (oracle/BOUNDS.md section 5).
    bool compare_mpfr = false;
};

struct SweepStats {
    std::string dtype;
    Index cases = 0;     // compared with the oracle
    Index skipped = 0;   // the backend refused the case with a documented attn::Error (e.g. logit overflow)
    Index violations = 0;           // cases with any element over its bound (output or weights)
    Index unbounded_elements = 0;   // elements whose bound is infinite
    // Cases with an infinite bound outside the all-wide class (q, k up to 1e15, logits up to 1e30, where two
    // logits closer than their own error bound make any weight between the one-hot answers legitimate).
    Index unbounded_outside_wide = 0;
    double worst_tightness = 0;     // max over cases of the case's max error/bound (output)
    double median_tightness = 0;    // median over cases of the case's max error/bound (output)
    double worst_weights_tightness = 0, median_weights_tightness = 0;
    double max_oracle_error_ratio = 0;  // the oracle's own error / bound, max over cases
    Index rows_redone_in_mpfr = 0;      // the default path's rows done again in MPFR (Ziv), summed over cases
    Index mpfr_mismatches = 0;          // with compare_mpfr: cases whose rounded results differ in any bit
    std::string first_mpfr_mismatch;    // its config string
    std::string worst_case;         // config string of the case with the worst output tightness
    std::string worst_summary;      // its Comparison::summary()
    std::string first_violation;    // config + summary of the first violating case, if any
    std::string first_unbounded;    // config + summary of the first case with an infinite bound, if any
    std::string summary() const;
};

// One sweep for dtype T (float or double); deterministic for a given seed.
template <class T>
SweepStats oracle_sweep(const SweepOptions& options);

}  // namespace attn::report
