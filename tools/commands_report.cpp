// `attn report`: the accuracy report (sweep against the oracle, drift against the baseline of this machine's numerics
// fingerprint, reports/baselines/<id>.json).
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#if ATTN_HAVE_REPORTS
#include "attn/plugin/kernel_process.hpp"
#endif

#if ATTN_HAVE_REPORTS
#include "attn/report/report.hpp"
#include "attn/suite/registry.hpp"
#endif

namespace attn::cli {

namespace {

struct ReportSettings {
    bool quick = false, full = false, check = false, update_baseline = false, no_plots = false, no_mutants = false;
    std::string grid;
    std::string out_dir;  // empty: <build dir>/report, or <build dir>/report-filter under --filter
    std::string filter;
    std::string baseline;  // empty: reports/baselines/<fingerprint id>.json
    std::vector<std::string> impls;
    int jobs = 1;
    std::string kernel;  // an external kernel library (attn/kernel_abi.h) to report on instead
    std::string cases_dir = "attn-cases";
};

}  // namespace

Action add_report_command(CLI::App& app) {
    auto settings = std::make_shared<ReportSettings>();
    auto* report = app.add_subcommand(
        "report", "Accuracy report: every correct implementation against the oracle, with drift against the baseline "
                  "of this machine's numerics fingerprint");
    auto* quick = report->add_flag("--quick", settings->quick, "The CI grid (seconds on 2 cores: 8 s measured, mutant table included)");
    auto* full = report->add_flag("--full", settings->full, "The nightly grid (the default)");
    auto* grid = report->add_option("--grid", settings->grid, "smoke, quick or full");
    quick->excludes(full)->excludes(grid);
    full->excludes(grid);
    report->add_flag("--check", settings->check,
                     "Exit 1 when a row violated its bound or failed, or regressed against this fingerprint's baseline");
    report->add_flag("--update-baseline", settings->update_baseline,
                     "Make this run the baseline of this machine's fingerprint (or write it to --baseline FILE)");
    report->add_option("--out", settings->out_dir,
                       "Directory for accuracy.md, accuracy.json, index.html, plots/ (default: report/ in the build "
                       "directory, build/release/report; with --filter, report-filter/ beside it)");
    report->add_option("--filter", settings->filter,
                       "Only the rows whose config string is this one, or has these fields (e.g. "
                       "'impl=tiled,mask=causal-br,dtype=float'; alternatives separated by '|'); drift compares only "
                       "the matching baseline rows");
    report->add_option("--baseline", settings->baseline,
                       "The baseline accuracy.json (default: reports/baselines/<fingerprint id>.json; compared only "
                       "when its fingerprint is this machine's)");
    report->add_option("--impl", settings->impls, "Only these implementations (repeatable; default: every correct one)");
    report->add_option("-j,--jobs", settings->jobs, "Worker threads over the grid")->check(CLI::Range(1, 64))
        ->capture_default_str();
    report->add_flag("--no-plots", settings->no_plots, "Do not draw the plots");
    report->add_flag("--no-mutants", settings->no_mutants, "Skip the mutant table and the mutants' accuracy sweep");
    report->add_option("--kernel", settings->kernel,
                       "Report on an external kernel (attn/kernel_abi.h) instead: its rows only, no mutants, written to "
                       "--cases-dir/<kernel name>/report unless --out says otherwise");
    report->add_option("--cases-dir", settings->cases_dir, "Where --kernel's report goes (default attn-cases)");

    return [report, settings]() -> int {
        if (!report->parsed()) return not_mine;
#if ATTN_HAVE_REPORTS
        const ReportSettings& s = *settings;
        report::ReportOptions options;
        options.grid = s.quick ? report::GridKind::Quick
                       : s.grid.empty() ? report::GridKind::Full
                                        : report::grid_from_string(s.grid);
        options.out_dir = !s.out_dir.empty()  ? s.out_dir
                          : s.filter.empty() ? std::string(ATTN_BINARY_DIR) + "/report"
                                             : std::string(ATTN_BINARY_DIR) + "/report-filter";
        options.filter = s.filter;
        options.baselines_dir = baselines_dir();
        options.baseline_path = s.baseline;
        options.check = s.check;
        options.update_baseline = s.update_baseline;
        options.plots = !s.no_plots;
        options.mutant_sweep = !s.no_mutants;
        options.mutant_table = !s.no_mutants;
        options.jobs = s.jobs;
        options.artifact_dirs = {options.out_dir, ATTN_BINARY_DIR,
                                 std::string(ATTN_BINARY_DIR) + "/bench", std::string(ATTN_BINARY_DIR) + "/fuzz",
                                 std::string(ATTN_SOURCE_DIR) + "/build/fuzz"};
        options.project_root = ATTN_SOURCE_DIR;
        // The command that reruns this report, as printed in it (with the forced SIMD target: it is part of the
        // fingerprint whose baseline the command records).
        const char* simd = std::getenv("ATTN_SIMD_TARGET");
        options.command = std::string("attn ") + (simd && *simd ? std::string("--simd-target ") + simd + " " : "") + "report";
        if (options.grid == report::GridKind::Quick) options.command += " --quick";
        if (options.grid == report::GridKind::Smoke) options.command += " --grid smoke";
        std::vector<const suite::Implementation*> impls;
        if (!s.kernel.empty()) {
            if (!s.impls.empty() || s.update_baseline) {
                std::cerr << "attn report: --kernel reports on the kernel alone: no --impl, and never --update-baseline "
                             "(the baselines are the library's)\n";
                return 2;
            }
            try {
                impls.push_back(&suite::load_external(s.kernel));
            } catch (const plugin::LoadError& e) {
                std::cerr << "attn report: " << e.what() << "\n";
                return 2;
            }
            std::cout << "attn report: kernel " << impls.back()->name << " declares " << impls.back()->capabilities
                      << "; the rows it does not support are listed as skipped\n";
            if (s.out_dir.empty()) options.out_dir = s.cases_dir + "/" + impls.back()->name + "/report";
            options.mutant_sweep = options.mutant_table = false;
            options.drift_off = "the baselines hold the library's rows, and an external kernel's have none";
            options.command += " --kernel " + s.kernel;
            return report::run_report(options, impls, {}, std::cout).exit_code;
        }
        if (s.impls.empty()) impls = suite::correct_implementations();
        for (const std::string& name : s.impls) impls.push_back(&suite::implementation(name));
        return report::run_report(options, impls, suite::mutants(), std::cout).exit_code;
#else
        std::cerr << "attn report: this build has no report generator (it needs the oracle and the property suite; "
                     "configure with ATTN_BUILD_ORACLE, ATTN_BUILD_SUITE and ATTN_BUILD_REPORTS on)\n";
        return 2;
#endif
    };
}

}  // namespace attn::cli
