// attn/report/oracle_sweep.hpp: the oracle's self-check sweep: random and adversarial cases through an
// implementation of the suite's registry, each compared with the oracle's bound for that implementation's error
// model (no violation allowed) and summarised as worst and median tightness. It lives with the report, not in the
// oracle, because it runs the library's kernels and the oracle uses none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"

namespace attn::report {

struct SweepOptions {
    std::uint64_t seed = 20261130;
    Index cases = 200;
    bool adversarial = true;  // logits up to +-1e4, near-ties, Dk up to 1024, Tk up to 4096, values 1e-30..1e30
    std::string impl = "reference";  // a registry name (attn/suite/registry.hpp); its error model bounds the errors
    // Also run every case on the all-MPFR path (OracleOptions::bits = 114) and compare its rounded output and weights
    // with the default path's, bit for bit (oracle/BOUNDS.md section 5).
    bool compare_mpfr = false;
    // Also give every case the statistical verdict (oracle/BOUNDS.md section 10); a correct implementation must never
    // be suspicious.
    bool statistical = true;
    // The cases' classes: "adversarial" (or "random" with adversarial = false, above), or "stagnation": the data on
    // which a running sum drops or truncates terms below its last bits, deterministically and with one sign
    // (oracle/BOUNDS.md section 10, "Stagnation"): attention sinks (one key 10-20 nats above the rest, by a bias,
    // with and without causal masks), one-hot-ish rows (a different dominant key per row), values in [1, 2),
    // bfloat16-representable and small-integer data, Tk up to 16384.
    std::string classes = "adversarial";
    // Judge every case under the generic model instead of the implementation's own.
    bool generic_model = false;
};

struct SweepStats {
    std::string dtype;
    Index cases = 0;     // compared with the oracle
    Index skipped = 0;   // the backend refused the case with a documented attn::Error (e.g. logit overflow)
    Index violations = 0;           // cases with any element over its bound (output or weights)
    Index unbounded_elements = 0;   // elements whose bound is infinite
    // Cases with an infinite bound on a row whose logits are too accurate for it. A row is unbounded only when
    // Delta >= 1/2 in both normalisations (oracle/BOUNDS.md section 3), which needs some key's exponent error
    // Theta_j >= ln(1.5) / 2 ~ 0.2 (the pivot normalisation doubles it). Theta_j is the model's dot-product and
    // scale allowance, a_j ~ gamma_{Dk+1} |scale| sum_d |q_d k_jd|, plus a few u per unit of logit; the sweep
    // estimates it independently of the oracle as gamma_{Dk+2} |scale| max_j sum_d |q_d k_jd| + u max_j |s_j| and
    // counts a row here when that estimate is below 0.05 (a quarter of 0.2, for the model's other terms). Such rows
    // arise where two logits lie closer than their own rounding error (all-wide values; Dk = 1024 with logits near
    // 5e3 in float), and there any split of the weight between those keys is a legitimate answer.
    Index unexplained_unbounded = 0;
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
    Index suspicious = 0;           // cases the statistical verdict calls suspicious
    std::string first_suspicious;   // config + what was over the statistical bound, if any
    Index structured_rows = 0;      // rows the statistical verdict left to the rigorous bound
    double worst_stat_tightness = 0;  // max over cases of error / statistical bound (output and weights)
    double worst_row_statistic = 0;   // max over cases of Q / threshold of the row statistic
    std::string first_unbounded;    // case number, config and summary of the first unexplained unbounded case (else
                                    // the first unbounded one), if any
    std::string summary() const;
};

// Whether some row of `exact` has an infinite bound although its logits are accurate enough that the model
// should bound it (SweepStats::unexplained_unbounded). q (B, Tq, Dk) and k (B, Tk, Dk) contiguous, as the sweep's.
template <class T>
bool has_unexplained_unbounded_row(TensorView<const T> q, TensorView<const T> k, const SdpaOptions& options,
                                   const oracle::Result<T>& exact);

// One sweep for dtype T (float or double); deterministic for a given seed.
template <class T>
SweepStats oracle_sweep(const SweepOptions& options);

}  // namespace attn::report
