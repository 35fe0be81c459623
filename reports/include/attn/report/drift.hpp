// attn/report/drift.hpp: comparing a run with the committed baseline (reports/latest/accuracy.json).
#pragma once

#include <string>
#include <vector>

#include "attn/report/accuracy.hpp"

namespace attn::report {

// How much a row's error may grow before it counts as a regression. The derivation is in reports/README.md
// ("Drift"): the same binary on the same inputs is bitwise deterministic, so on one machine any growth is real;
// across machines a different BLIS micro-kernel, FMA contraction or libm exp reorders or re-rounds the same sums,
// which redraws the rounding errors but does not change their scale. A maximum over the elements of such errors
// stays within a factor 2 of itself, plus one rounding at the last step (a single ulp is the granularity of
// the measure: a row whose maximum is 0 or 1 ulp would otherwise flag every reordering).
struct DriftMargin {
    double factor = 2.0;  // growth factor tolerated on max ULP error and on max tightness
    double ulps = 1.0;    // plus this many ulps (for tightness: tightness_per_ulp times this)
};

struct RowDrift {
    std::string config;
    double baseline_ulp = 0, current_ulp = 0;
    double baseline_tightness = 0, current_tightness = 0;
    std::string reason;  // "max ULP error 3 -> 12", "tightness ...", "now fails: ..."
};

struct Drift {
    bool baseline_found = false;
    std::string baseline_path;
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

Drift compare_with_baseline(const std::vector<Row>& baseline, const std::vector<Row>& current,
                            const DriftMargin& margin = {});

}  // namespace attn::report
