// Drift against the baseline of the same fingerprint: rows matched by config string, tightness growth beyond the
// documented margin, or a fall beyond it (a bound that loosened).
#include "attn/report/drift.hpp"

#include <cmath>
#include <sstream>
#include <unordered_map>

namespace attn::report {

bool regressed(const Row& baseline, const Row& current, const DriftMargin& margin, std::string* reason) {
    std::ostringstream why;
    if (!current.error.empty() && baseline.error.empty()) {
        why << "now fails: " << current.error;
    } else if (current.violations > baseline.violations) {
        why << "bound violations " << baseline.violations << " -> " << current.violations;
    } else if (!(current.max_tightness <=
                 margin.factor * baseline.max_tightness + margin.ulps * current.tightness_per_ulp)) {
        // Written as !(<=) so a NaN or Inf tightness counts as growth. Max ULP error is not compared: on outputs
        // that cancel to almost nothing it moves by thousands of ulps under a mere reordering (reports/README.md).
        why << "max tightness " << baseline.max_tightness << " -> " << current.max_tightness;
    } else if (baseline.max_tightness > margin.factor * current.max_tightness + margin.ulps * current.tightness_per_ulp) {
        // The same margin the other way, in the current run's ulps: a bound that loosened (a kernel computing the
        // same bits now passes a far weaker check) or a kernel that became much more accurate. Either needs a look.
        why << "max tightness fell " << baseline.max_tightness << " -> " << current.max_tightness
            << " (the bound loosened, or the error shrank)";
    } else {
        return false;
    }
    if (reason) *reason = why.str();
    return true;
}

Drift compare_with_baseline(const std::vector<Row>& baseline, const std::vector<Row>& current,
                            const DriftMargin& margin) {
    Drift drift;
    drift.baseline_found = true;
    drift.checked = true;
    drift.margin = margin;
    std::unordered_map<std::string, const Row*> by_config;
    for (const Row& row : baseline) by_config[row.config] = &row;
    Index matched = 0;
    for (const Row& row : current) {
        const auto it = by_config.find(row.config);
        if (it == by_config.end()) {
            ++drift.new_rows;
            continue;
        }
        ++matched;
        const Row& base = *it->second;
        ++drift.compared;
        if (base.max_ulp == row.max_ulp && base.max_tightness == row.max_tightness) ++drift.identical_rows;
        std::string reason;
        if (regressed(base, row, margin, &reason))
            drift.regressions.push_back(
                {row.config, base.max_ulp, row.max_ulp, base.max_tightness, row.max_tightness, reason});
    }
    drift.missing_rows = static_cast<Index>(by_config.size()) - matched;
    return drift;
}

}  // namespace attn::report
