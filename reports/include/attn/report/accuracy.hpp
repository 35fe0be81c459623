// attn/report/accuracy.hpp: one report row (an implementation on one case in one dtype, measured against the
// oracle), the per implementation x dtype summaries, and their JSON form (schema in reports/README.md).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/oracle/metrics.hpp"
#include "attn/report/grid.hpp"
#include "attn/suite/registry.hpp"

namespace attn::report {

// What the report says about one row. Errors are measured on the output (B, H, Tq, Dv) only.
struct Row {
    std::string config;  // config_string(case, impl, dtype): the row's identity across runs
    std::string impl;
    Dtype dtype = Dtype::Float;
    Case grid_case;

    std::string error;  // non-empty when the implementation or the oracle threw: the row failed
    // Non-empty when the implementation does not support the case (an external kernel's suite::Unsupported): the
    // report leaves the row out and counts it under this reason, as neither a pass nor a failure.
    std::string skipped;
    Index elements = 0;
    double max_ulp = 0;
    double p99_ulp = 0;
    double max_abs = 0;
    double max_rel = 0;        // relative to sum_k p_k |V_k| (see attn/oracle/metrics.hpp)
    double normwise_rel = 0;
    double max_tightness = 0;  // max over elements of |computed - exact| / bound
    double median_tightness = 0;
    Index violations = 0;      // elements with error > bound (or a NaN/Inf mismatch); must be 0
    Index unbounded = 0;       // elements the error model cannot bound (infinite bound): tightness says nothing there
    Shape worst_index;         // (b, h, i, d) of the element with the largest error / bound
    double worst_computed = 0, worst_exact = 0, worst_bound = 0;
    // The tightness one more ulp of error at the worst element would add: the drift margin's absolute part.
    double tightness_per_ulp = 0;
    // The statistical verdict (oracle/BOUNDS.md section 10): max error / statistical bound, the row statistic's Q
    // over its threshold, and whether either fired. A library kernel must never be suspicious: if one is, the
    // statistical model is wrong, and the row fails.
    double stat_max_tightness = 0;
    double row_statistic = 0;
    bool suspicious = false;

    bool failed() const { return !error.empty() || violations > 0 || suspicious; }
};

// Copies a comparison's measures (elements, max ULP, errors, tightness, violations, the worst element and the
// tightness of one ulp there) into a row of dtype `dtype`.
void fill_comparison(Row& row, const oracle::Comparison& cmp, Dtype dtype);

// A gradient row's config: "dq " (or "dk ", "dv ") before the forward row's config string; row_from_json reads the
// case, implementation and dtype from the rest.
std::string gradient_row_config(const std::string& gradient, const std::string& config);

// Runs every implementation on the case's inputs in one dtype and compares each with the oracle (bound for its
// error model); a row whose implementation or oracle threw carries the message in `error`.
std::vector<Row> measure(const std::vector<const suite::Implementation*>& impls, const Case& grid_case, Dtype dtype);

struct Summary {
    std::string impl;
    Dtype dtype = Dtype::Float;
    Index rows = 0, failed_rows = 0, violations = 0, unbounded = 0, suspicious_rows = 0;
    double max_stat_tightness = 0, max_row_statistic = 0;  // the statistical verdict's, over the rows
    double max_ulp = 0, max_p99_ulp = 0, max_rel = 0, max_tightness = 0, median_tightness = 0;
    std::string worst_config;  // the row with the largest tightness
};

// One summary per (implementation, dtype), in the order the rows first name them.
std::vector<Summary> summarize(const std::vector<Row>& rows);

nlohmann::json to_json(const Row& row);
Row row_from_json(const nlohmann::json& j);  // IoError naming the field when the JSON is not a report row
// A gradient row as accuracy.json keeps it: only what drift compares (config, sweep, error, max_ulp, max_tightness,
// violations, unbounded, tightness_per_ulp), so that a baseline stays under the repository's 2 MiB per file.
nlohmann::json to_drift_json(const Row& row);
Row row_from_drift_json(const nlohmann::json& j);
nlohmann::json to_json(const Summary& summary);

// Non-finite doubles are written as the strings "inf", "-inf", "nan" (JSON has no such numbers).
nlohmann::json number(double x);
double number_from_json(const nlohmann::json& j);

}  // namespace attn::report
