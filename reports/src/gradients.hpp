// Internal: the report's gradient rows (report.cpp's "Gradients" section).
#pragma once

#include <string>
#include <vector>

#include "attn/report/accuracy.hpp"
#include "attn/report/grid.hpp"
#include "attn/suite/registry.hpp"

namespace attn::report {

// One implementation and dtype over the cases: dq, dk, dv (index 0, 1, 2) against the oracle's gradient bound.
struct GradientRow {
    std::string impl;
    Dtype dtype = Dtype::Float;
    Index cases = 0, skipped = 0, errors = 0;
    Index violations = 0, unbounded = 0;  // elements, over the three gradients
    double max_ulp[3] = {0, 0, 0};
    double max_tightness[3] = {0, 0, 0};
    std::vector<double> tightness;  // every case's and gradient's max error / bound, sorted
    double worst_tightness = 0;
    std::string worst_config, first_error;
    // One report row per case and gradient (config "dq <case's config>", ...): what drift compares with the baseline.
    std::vector<Row> rows;
    bool pass() const { return violations == 0 && errors == 0; }
};

// Every implementation with a backward pass, in float and double, over `cases` (a random dout per case).
std::vector<GradientRow> gradient_rows(const std::vector<Case>& cases,
                                       const std::vector<const suite::Implementation*>& impls);

}  // namespace attn::report
