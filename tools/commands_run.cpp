// `attn test` (ctest) and `attn verify` (the main job: every stage with a one-line status and a summary table).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "attn/machine.hpp"
#include "commands.hpp"
#if ATTN_HAVE_REPORTS
#include "attn/report/report.hpp"
#endif

namespace attn::cli {

namespace {

// Parallel jobs for builds and ctest: every core this process may use.
std::string ctest_command(const std::string& extra) {
    return std::string("ctest --test-dir '") + ATTN_BINARY_DIR + "' --output-on-failure -j " + jobs() + " " + extra;
}

// This program's own path, so stages run as `attn <subcommand>` in child processes.
std::string self_path() {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string("attn") : p.string();
}

struct Stage {
    std::string name;
    std::string subcommand;  // attn subcommand the stage needs ("" = none)
    std::string command;
};

struct StageResult {
    std::string name;
    std::string status;  // ok, FAILED, skipped
    double seconds;
    std::string note;
};

struct RunOptions {
    std::string label;
    bool sanitizers = false;
    bool full = false;
};

// The suite built with ASan + UBSan, without the long-running labels: under the sanitizers the properties and
// mutants would take most of CI's budget, and the fuzz smoke run is the same clang ASan/UBSan build and seed that
// `attn verify` runs. Preset debug-asan (`attn test --sanitizers`, CI) builds the library, io, the oracle, the
// plugins and the fuzz replays with their tests; debug-asan-full (`attn test --sanitizers --full`, `attn verify
// --full`) adds the property suite, the report generator and the attn program, whose own tests (commands, reports,
// the backends fuzz replay, an external kernel through the suite) then run under the sanitizers too: the code they
// add is the project's harness, and compiling it twice more would take a third of CI's time. The documentation's
// examples (label docs) run the release launcher and a plain consumer build, not this build, so they run only in
// `attn test`; the example kernels (label examples) are property-suite runs on plugins (the host side of plugins
// runs here in attn_kernel_process_test). Of the tests forced onto each SIMD target (label simd), the scalar
// fallback and the narrowest vectors (SSE4, 4 lanes) run, beside the plain test on the CPU's own target (the
// widest): the others differ from these in width alone, and would add a sixth of the stage's time.
std::string sanitizer_command(const std::string& label, bool full) {
    const std::string src = std::string("'") + ATTN_SOURCE_DIR + "'";
    const std::string preset = full ? "debug-asan-full" : "debug-asan";
    return "cd " + src + " && cmake --preset " + preset + " >/dev/null && cmake --build --preset " + preset + " -j " +
           jobs() + " && ctest --preset " + preset + " -j " + jobs() + " " +
           (label.empty() ? "-LE 'properties|slow|fuzz-smoke|docs|examples' -E '_simd_(AVX3_DL|AVX3|AVX2|SSSE3)$'"
                          : "-L '" + label + "'");
}

// For the summary's report line: whether the drift check had a baseline of this machine's fingerprint to compare
// with (the report stage itself prints the details and the command that records one).
std::string drift_note() {
#if ATTN_HAVE_REPORTS
    const std::string id = numerics_fingerprint().id();
    return std::filesystem::exists(report::baseline_file(baselines_dir(), id))
               ? "drift checked against the baseline of " + id
               : "drift NOT checked: no baseline for fingerprint " + id;
#else
    return "";
#endif
}

}  // namespace

Action add_run_commands(CLI::App& app) {
    static RunOptions opts;
    auto* test = app.add_subcommand("test", "Run the test suite (ctest): unit tests, oracle, properties, replays");
    test->add_option("-L,--label", opts.label, "Only tests with this ctest label");
    test->add_flag("--sanitizers", opts.sanitizers,
                   "Build and run the library's tests under ASan + UBSan (build/debug-asan), except properties and "
                   "mutants");
    test->add_flag("--full", opts.full,
                   "With --sanitizers: the attn program, reports and property suite too (build/debug-asan-full); "
                   "without: the fuzz-smoke tests too");
    auto* verify = app.add_subcommand("verify", "The main job: tests, properties, mutants, fuzzing, report");
    verify->add_flag("--full", opts.full,
                     "Run the long versions (thorough properties, longer fuzzing, coverage, full report)");
    return [&app, test, verify]() -> int {
        if (test->parsed()) {
            if (opts.sanitizers) return run(sanitizer_command(opts.label, opts.full));
            // The tests that build the clang fuzz preset (label fuzz-smoke: a second build of the library and a
            // libFuzzer run of every target, a third of the suite's time) run in `attn verify`, beside its fuzzing.
            if (!opts.label.empty()) return run(ctest_command("-L '" + opts.label + "'"));
            return run(ctest_command(opts.full ? "" : "-LE fuzz-smoke"));
        }
        if (!verify->parsed()) return not_mine;

        const std::string self = "'" + self_path() + "'";
        const bool clang = run("command -v clang++ >/dev/null 2>&1") == 0;
        std::vector<Stage> stages = {
            // Everything in ctest but the property suite, which the next two stages run with their own output.
            {"unit tests", "", ctest_command("-LE 'properties|slow'")},
            {"properties", "properties", self + " properties" + (opts.full ? " --thorough" : "")},
            {"mutants", "mutants", self + " mutants"},
            {"fuzzing", clang ? "fuzz" : "-", self + " fuzz --target all --minutes " + (opts.full ? "10" : "0.25")},
            {"report", "report", self + " report --check" + (opts.full ? "" : " --quick")},
        };
        // The nightly run measures coverage (minutes in its own build) before the report, which shows the summary.
        if (opts.full) stages.insert(stages.end() - 1, {"coverage", "coverage", self + " coverage"});
        // And every test but the long ones under the sanitizers, the harness included (CI builds the library's part).
        if (opts.full) stages.insert(stages.end() - 1, {"sanitizers", "", sanitizer_command("", true)});
        // And a sample of the source mutants (a subset of the committed run's; its summary stays in build/mutate).
        if (opts.full)
            stages.insert(stages.end() - 1, {"source mutation", "mutate",
                                             self + " mutate --mutants 40 --min-per-file 3 --out '" + std::string(ATTN_SOURCE_DIR) +
                                                 "/build/mutate/sampled'"});
        std::vector<StageResult> results;
        for (const Stage& s : stages) {
            const bool available = s.subcommand.empty() || (s.subcommand != "-" && [&] {
                                       try {
                                           app.get_subcommand(s.subcommand);
                                           return true;
                                       } catch (const CLI::OptionNotFound&) {
                                           return false;
                                       }
                                   }());
            if (!available) {
                results.push_back({s.name, "skipped", 0.0, s.subcommand == "-" ? "clang++ not installed" : "not built"});
                std::cout << "== " << s.name << ": skipped\n";
                continue;
            }
            std::cout << "== " << s.name << ": " << s.command << "\n";
            const auto t0 = std::chrono::steady_clock::now();
            const int code = run(s.command);
            const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::string note = code == 0 ? "" : "exit " + std::to_string(code);
            if (s.subcommand == "report") note += (note.empty() ? "" : "; ") + drift_note();
            results.push_back({s.name, code == 0 ? "ok" : "FAILED", sec, note});
            std::cout << "== " << s.name << ": " << results.back().status << " (" << sec << " s)\n";
        }
        int exit_code = 0;
        std::cout << "\nattn verify summary\n";
        for (const StageResult& r : results) {
            std::printf("  %-12s %-8s %8.1f s  %s\n", r.name.c_str(), r.status.c_str(), r.seconds, r.note.c_str());
            if (r.status == "FAILED") exit_code = 1;
        }
        std::printf("attn verify: %s\n", exit_code == 0 ? "everything held" : "FAILED");
        return exit_code;
    };
}

}  // namespace attn::cli
