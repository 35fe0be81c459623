// attn/report/drift.hpp: comparing a run with the baseline of its numerics fingerprint
// (reports/baselines/<fingerprint id>.json).
#pragma once

#include <string>
#include <vector>

#include "attn/report/accuracy.hpp"

namespace attn::report {

// How much a row's max tightness (error / bound) may grow before it counts as a regression. The derivation is in
// reports/README.md ("Drift"): the same binary on the same inputs and the same fingerprint is bitwise deterministic,
// so any growth is a change; a change that only reorders or re-rounds the same sums (another blocking, another
// BLIS kernel) redraws the rounding errors beneath an unchanged bound without changing their scale, and a maximum
// over the elements of such errors stays within a factor 2 of itself, plus one rounding at the last step (a single
// ulp is the granularity of the measure: a row whose maximum is 0 or 1 ulp would otherwise flag every reordering).
// Measured in units of the bound, not in ulps of the output: an output that cancels to almost nothing has a tiny
// ulp, and a redraw moves its ULP error by thousands while its error relative to the bound barely moves.
struct DriftMargin {
    double factor = 2.0;  // growth factor tolerated on max tightness
    double ulps = 1.0;    // plus the tightness of this many ulps at the worst element (tightness_per_ulp times this)
};

struct RowDrift {
    std::string config;
    double baseline_ulp = 0, current_ulp = 0;  // informative: max ULP error is never compared
    double baseline_tightness = 0, current_tightness = 0;
    std::string reason;  // "max tightness 0.01 -> 0.05", "bound violations 0 -> 3", "now fails: ..."
};

struct Drift {
    std::string fingerprint;           // this run's numerics fingerprint id
    std::string baseline_path;
    bool baseline_found = false;       // a baseline file was there
    std::string baseline_fingerprint;  // the fingerprint id the baseline records ("" when it records none)
    bool checked = false;              // compared: found, and made on this fingerprint
    std::string off;                   // why drift is not compared at all (ReportOptions::drift_off), or ""
    std::string baseline_grid;
    DriftMargin margin;
    Index compared = 0;       // rows present in both runs
    Index new_rows = 0;       // rows the baseline does not have (not compared)
    Index missing_rows = 0;   // baseline rows this run did not produce (another grid, another implementation set)
    Index identical_rows = 0; // compared rows whose max ULP error and tightness are exactly the baseline's
    std::vector<RowDrift> regressions;
};

// Whether `current` regressed against `baseline` (same config) beyond the margin; the reason when it did.
bool regressed(const Row& baseline, const Row& current, const DriftMargin& margin, std::string* reason = nullptr);

// Matches rows by config string; the caller makes sure both come from the same fingerprint.
Drift compare_with_baseline(const std::vector<Row>& baseline, const std::vector<Row>& current,
                            const DriftMargin& margin = {});

}  // namespace attn::report
