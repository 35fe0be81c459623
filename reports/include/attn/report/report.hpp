// attn/report/report.hpp: `attn report`, the accuracy report: sweep, compare with the baseline, write the report.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "attn/report/accuracy.hpp"
#include "attn/report/drift.hpp"
#include "attn/report/grid.hpp"
#include "attn/suite/registry.hpp"

namespace attn::report {

struct ReportOptions {
    GridKind grid = GridKind::Quick;
    std::string out_dir;        // accuracy.md, index.html, plots/*.svg and the run's accuracy.json go here
    std::string baseline_path;  // the committed baseline (reports/latest/accuracy.json)
    bool check = false;         // exit 1 when a row regressed, violated its bound or failed
    bool update_baseline = false;
    bool plots = true;
    bool mutant_sweep = true;   // also run every mutant on the small cross-product cases (a kill column)
    bool mutant_table = true;   // run the property suite's mutant table (attn mutants) into the report
    int jobs = 1;               // worker threads over the grid (rows are independent; results keep grid order)
    std::vector<std::string> artifact_dirs;  // where fuzz.json and bench.json are looked for
    std::string command = "attn report";     // as typed, for the report header
    std::string project_root;                // paths inside it are shown relative to it in the report
};

struct ReportRun {
    std::vector<Row> rows;
    std::vector<Summary> summaries;
    Drift drift;
    int exit_code = 0;  // 0, or 1 under --check when something regressed, violated or failed
};

// Runs the grid over `impls` (the correct implementations), compares with the baseline, writes the report and
// prints a plain log to `log` (the progress bar goes to stderr when it is a terminal). `mutants` feed the mutant
// section's kill column; pass none to skip it.
ReportRun run_report(const ReportOptions& options, const std::vector<const suite::Implementation*>& impls,
                     const std::vector<const suite::Implementation*>& mutants, std::ostream& log);

// accuracy.json: {"schema", "grid", "environment", "margin", "summary", "rows"}; see reports/README.md.
nlohmann::json accuracy_json(GridKind grid, const std::vector<Row>& rows, const DriftMargin& margin);
// The rows of an accuracy.json file, and its grid name; IoError when it cannot be read or is not one.
std::vector<Row> read_accuracy_json(const std::string& path, std::string* grid = nullptr);

}  // namespace attn::report
