// attn/report/report.hpp: `attn report`, the accuracy report: sweep, compare with the baseline of this machine's
// numerics fingerprint, write the report.
#pragma once

#include <ostream>
#include <map>
#include <string>
#include <vector>

#include "attn/report/accuracy.hpp"
#include "attn/report/drift.hpp"
#include "attn/machine.hpp"
#include "attn/report/grid.hpp"
#include "attn/suite/registry.hpp"

namespace attn::report {

struct ReportOptions {
    GridKind grid = GridKind::Quick;
    std::string out_dir;        // accuracy.md, index.html, plots/*.svg and the run's accuracy.json go here
    // Drift is compared only with a baseline of this machine's numerics fingerprint: baselines_dir/<id>.json
    // (reports/baselines/), or baseline_path when it is set (its fingerprint must still match to be compared).
    std::string baselines_dir;
    std::string baseline_path;
    std::string drift_off;      // non-empty: no baseline is read or written, and the report says why (this)
    bool check = false;         // exit 1 when a row regressed, violated its bound or failed
    bool update_baseline = false;  // write this run as the baseline in force (baseline_path, or baselines_dir/<id>.json)
    bool plots = true;
    bool mutant_sweep = true;   // also run every mutant on the small cross-product cases (a kill column)
    bool mutant_table = true;   // run the property suite's mutant table (attn mutants) into the report
    int jobs = 1;               // worker threads over the grid (rows are independent; results keep grid order)
    // Only the rows whose config string matches (suite::config_matches: a whole config string, or fields such as
    // "impl=tiled,mask=causal-br"); drift then compares only the baseline rows that match too. "" = every row.
    std::string filter;
    std::vector<std::string> artifact_dirs;  // where fuzz.json and bench.json are looked for
    std::string command = "attn report";     // as typed, for the report header
    std::string project_root;                // paths inside it are shown relative to it in the report
};

struct ReportRun {
    std::vector<Row> rows;
    std::vector<Summary> summaries;
    NumericsFingerprint fingerprint;  // of this run
    Drift drift;
    std::map<std::string, int> skipped;  // rows left out because the implementation does not support them, by reason
    // The backward pass of every implementation with one: (impl, dtype, cases, gradients over their bound, worst
    // error / bound); a row with a violation or an error fails --check like a failed forward row.
    struct GradientSummary {
        std::string impl, dtype;
        Index cases = 0, violations = 0, errors = 0;
        double max_tightness = 0;
        std::string worst_config, first_error;
    };
    std::vector<GradientSummary> gradients;
    int exit_code = 0;  // 0, or 1 under --check when something regressed, violated or failed
};

// The command line that reruns exactly one row (every failed or regressed row is printed with it).
std::string reproduce_command(const ReportOptions& options, const std::string& row_config);

// Runs the grid over `impls` (the correct implementations), compares with the baseline, writes the report and
// prints a plain log to `log` (the progress bar goes to stderr when it is a terminal). `mutants` feed the mutant
// section's kill column; pass none to skip it.
ReportRun run_report(const ReportOptions& options, const std::vector<const suite::Implementation*>& impls,
                     const std::vector<const suite::Implementation*>& mutants, std::ostream& log);

// The baseline of a fingerprint in a baselines directory: <baselines_dir>/<fingerprint id>.json.
std::string baseline_file(const std::string& baselines_dir, const std::string& fingerprint_id);

// accuracy.json: {"schema", "grid", "fingerprint", "margin", "summary", "rows", "gradient_rows"}; see
// reports/README.md.
nlohmann::json accuracy_json(GridKind grid, const std::vector<Row>& rows, const DriftMargin& margin,
                             const NumericsFingerprint& fingerprint, const std::vector<Row>& gradient_rows = {});
// {"id": ..., "cpu": ..., ...}: the id and every field, as strings.
nlohmann::json fingerprint_json(const NumericsFingerprint& fingerprint);
// The rows of an accuracy.json file, its grid name and its fingerprint id ("" when it records none: schema 1);
// IoError when it cannot be read or is not one.
// With `gradient_rows`, its gradient rows too (none in a file made before they were recorded).
std::vector<Row> read_accuracy_json(const std::string& path, std::string* grid = nullptr,
                                    std::string* fingerprint_id = nullptr, std::vector<Row>* gradient_rows = nullptr);

}  // namespace attn::report
