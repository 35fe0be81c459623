// `attn report`: the sweep, the drift check against the baseline of this machine's numerics fingerprint, and the
// report files.
#include "attn/report/report.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "artifacts.hpp"
#include "attn/error.hpp"
#include "attn/suite/property.hpp"
#include "document.hpp"
#include "gradients.hpp"
#include "plots.hpp"

namespace attn::report {

namespace fs = std::filesystem;

namespace {

// accuracy.json as text: every key indented, except that each row of "rows" is one compact line. A row's dozens of
// fields then diff as one line per case, and the file is a fifth smaller than indented.
std::string rows_one_per_line(const nlohmann::json& doc) {
    std::string text = "{\n";
    bool first = true;
    for (const auto& [key, value] : doc.items()) {
        text += first ? " " : ",\n ";
        first = false;
        text += nlohmann::json(key).dump() + ": ";
        if ((key != "rows" && key != "gradient_rows") || !value.is_array()) {
            text += value.dump();
            continue;
        }
        text += "[";
        for (std::size_t r = 0; r < value.size(); ++r) text += (r ? ",\n  " : "\n  ") + value[r].dump();
        text += value.empty() ? "]" : "\n ]";
    }
    return text + "\n}\n";
}


// ---- progress -------------------------------------------------------------------------------------------------

// A bar redrawn in place on a terminal; on anything else (CI logs, pipes) a line every tenth of the work.
class Progress {
public:
    Progress(Index total, std::string what)
        : total_(total), what_(std::move(what)), tty_(::isatty(::fileno(stderr)) != 0),
          start_(std::chrono::steady_clock::now()) {}

    void step(const std::string& label) {
        std::lock_guard<std::mutex> lock(mutex_);
        ++done_;
        const double s = seconds();
        if (tty_) {
            const int width = 30;
            const int filled = static_cast<int>(width * done_ / std::max<Index>(total_, 1));
            const double left = done_ > 0 ? s * static_cast<double>(total_ - done_) / static_cast<double>(done_) : 0;
            std::string shown = label.size() > 70 ? label.substr(0, 67) + "..." : label;
            std::fprintf(stderr, "\r\033[K%s [%s%s] %lld/%lld %5.1f s, ~%.0f s left  %s", what_.c_str(),
                         std::string(static_cast<std::size_t>(filled), '#').c_str(),
                         std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                         static_cast<long long>(done_), static_cast<long long>(total_), s, left, shown.c_str());
            std::fflush(stderr);
        } else if (done_ * 10 / std::max<Index>(total_, 1) != (done_ - 1) * 10 / std::max<Index>(total_, 1) ||
                   done_ == total_) {
            std::fprintf(stderr, "%s: %lld/%lld (%lld%%), %.1f s\n", what_.c_str(), static_cast<long long>(done_),
                         static_cast<long long>(total_), static_cast<long long>(100 * done_ / std::max<Index>(total_, 1)),
                         s);
        }
    }

    void finish() {
        if (tty_) std::fprintf(stderr, "\r\033[K%s: %lld items in %.1f s\n", what_.c_str(), static_cast<long long>(done_), seconds());
    }

    double seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }

private:
    Index total_, done_ = 0;
    std::string what_;
    bool tty_;
    std::chrono::steady_clock::time_point start_;
    std::mutex mutex_;
};

// ---- the sweep ------------------------------------------------------------------------------------------------

// Every (case, dtype) unit measured by `jobs` workers; the rows come back in grid order whatever the scheduling.
std::vector<Row> sweep(const std::vector<Case>& cases, const std::vector<const suite::Implementation*>& impls,
                       int jobs, const std::string& what, const std::string& filter = "",
                       std::map<std::string, int>* skipped = nullptr) {
    const std::vector<Dtype>& dtypes = suite::all_dtypes();
    const Index per_case = static_cast<Index>(dtypes.size());
    const Index units = static_cast<Index>(cases.size()) * per_case;
    std::vector<std::vector<Row>> results(static_cast<std::size_t>(units));
    Progress progress(units, what);
    std::atomic<Index> next{0};
    const auto worker = [&] {
        for (Index u = next++; u < units; u = next++) {
            const Case& c = cases[static_cast<std::size_t>(u / per_case)];
            const Dtype dtype = dtypes[static_cast<std::size_t>(u % per_case)];
            std::vector<const suite::Implementation*> selected;
            for (const suite::Implementation* impl : impls) {
                // The suite's own implementations have no rows in a dtype they have no path in (the module's 16-bit);
                // an external kernel's are counted as skipped, with the reason.
                if (impl->kernel_path.empty() && impl->dtype_unsupported.count(dtype)) continue;
                if (suite::config_matches(config_string(c, impl->name, dtype), filter)) selected.push_back(impl);
            }
            if (!selected.empty()) results[static_cast<std::size_t>(u)] = measure(selected, c, dtype);
            progress.step(config_string(c, "*", dtype));
        }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < std::max(jobs, 1); ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    progress.finish();
    std::vector<Row> rows;
    for (auto& unit : results)
        for (auto& row : unit) {
            if (!row.skipped.empty()) {
                if (skipped) ++(*skipped)[row.skipped];
                continue;
            }
            rows.push_back(std::move(row));
        }
    return rows;
}

// ---- formatting -----------------------------------------------------------------------------------------------

std::string fmt(const char* format, double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, x);
    return buf;
}
std::string ulps(double x) { return fmt("%.3g", x); }
std::string sci(double x) { return fmt("%.2e", x); }
std::string tight(double x) { return x == 0 ? "0" : fmt("%.2g", x); }

std::string index_string(const Shape& idx) {
    if (idx.empty()) return "-";
    static const char* letters[] = {"b", "h", "i", "d"};
    std::string s = "(";
    for (std::size_t n = 0; n < idx.size(); ++n) {
        if (n) s += ",";
        s += (idx.size() == 4 ? std::string(letters[n]) + "=" : "") + std::to_string(idx[n]);
    }
    return s + ")";
}

}  // namespace

std::string reproduce_command(const ReportOptions& options, const std::string& row_config) {
    return "./" + options.command + " --check --no-mutants --no-plots --filter '" + row_config + "'";
}

namespace {

// The command that records a baseline for this machine with the grid of this run.
std::string record_command(const ReportOptions& options) { return "./" + options.command + " --update-baseline"; }

// Why drift was not compared, as one sentence; `code` marks up paths and commands for the document.
std::string not_checked_line(const Drift& d, const std::string& record, bool markup) {
    const auto code = [&](const std::string& x) { return markup ? "`" + x + "`" : x; };
    if (!d.off.empty()) return "drift not checked: " + d.off;
    std::string why;
    if (!d.baseline_found) {
        why = "no baseline for fingerprint " + code(d.fingerprint) +
              (d.baseline_path.empty() ? "" : " (" + code(d.baseline_path) + ")");
    } else {
        why = "the baseline " + code(d.baseline_path) +
              (d.baseline_fingerprint.empty()
                   ? " records no fingerprint (this machine's is " + code(d.fingerprint) + ")"
                   : " was made on fingerprint " + code(d.baseline_fingerprint) + ", not on this machine's " +
                         code(d.fingerprint)) +
              ", and rows are compared only with a baseline of the same fingerprint";
    }
    return "drift not checked: " + why + "; record one with: " + code(record);
}

// ---- the document ---------------------------------------------------------------------------------------------

Section summary_section(const ReportOptions& options, const std::vector<Row>& rows,
                        const std::vector<Summary>& summaries) {
    Section s{"Summary", {}};
    Index failed = 0, violations = 0, suspicious = 0;
    for (const Row& r : rows) failed += r.failed(), violations += r.violations, suspicious += r.suspicious;
    s.paragraph("Grid `" + std::string(to_string(options.grid)) + "`: " + std::to_string(rows.size()) +
                " rows (implementation x dtype x shape x input distribution x mask), each compared element by "
                "element with the high-precision oracle and its rigorous error bound. Made by `" + options.command +
                "`.");
    s.paragraph(failed == 0 ? "**Every row is within its bound** (0 bound violations, 0 failed rows)."
                            : "**" + std::to_string(failed) + " rows failed** (" + std::to_string(violations) +
                                  " elements above their bound, " + std::to_string(suspicious) +
                                  " rows statistically suspicious, or an implementation error); see Failures.");
    s.paragraph("Every row also gets the statistical verdict (oracle/BOUNDS.md section 10): the bound under "
                "independent rounding errors (additions that stagnate charged at their worst), and a chi-square test "
                "over the rows; a correct kernel is flagged with probability at most 1e-9 per call. A library kernel flagged *suspicious* fails its row: "
                "the statistical model would be wrong.");
    Table t;
    t.header = {"implementation", "dtype", "rows", "max ULP", "max p99 ULP", "max rel. error", "median tightness",
                "max tightness", "violations", "unbounded elements", "max statistical tightness",
                "max row statistic / threshold", "suspicious rows", "failed rows", "row with the max tightness"};
    for (const Summary& x : summaries)
        t.rows.push_back({x.impl, to_string(x.dtype), std::to_string(x.rows), ulps(x.max_ulp), ulps(x.max_p99_ulp),
                          sci(x.max_rel), tight(x.median_tightness), tight(x.max_tightness),
                          std::to_string(x.violations), std::to_string(x.unbounded), tight(x.max_stat_tightness),
                          tight(x.max_row_statistic), std::to_string(x.suspicious_rows), std::to_string(x.failed_rows),
                          "`" + x.worst_config + "`"});
    s.table(std::move(t));
    return s;
}

// What decides the bits of this run; drift is a claim per fingerprint, the bounds hold on every machine.
Section machine_section(const NumericsFingerprint& f) {
    Section s{"Machine", {}};
    s.paragraph("Numerics fingerprint `" + f.id() + "`: what decides the bits of this run (the SIMD target the "
                "tiled kernel dispatched to, the BLIS kernels chosen for this CPU, the compiler and its flags, the "
                "C library). Drift is compared only with a baseline of the same fingerprint; the bound check holds "
                "on every machine.");
    Table t;
    t.header = {"field", "value"};
    t.rows.push_back({"id", "`" + f.id() + "`"});
    for (const auto& [name, value] : f.fields()) t.rows.push_back({name, value.empty() ? "-" : value});
    s.table(std::move(t));
    return s;
}

Section drift_section(const Drift& drift, const std::string& record) {
    Section s{"Drift against the baseline", {}};
    if (!drift.checked) {
        s.paragraph("**" + not_checked_line(drift, record, true) + ".** The bound check (Summary, Failures) does not "
                    "depend on the machine and was done.");
        return s;
    }
    s.paragraph("Baseline `" + drift.baseline_path + "` (grid `" + drift.baseline_grid + "`, fingerprint `" +
                drift.fingerprint + "`, the same as this run). A row regresses when its max tightness (error / "
                "bound) exceeds " + fmt("%g", drift.margin.factor) + " x baseline + the tightness of " +
                fmt("%g", drift.margin.ulps) + " ulp at its worst element, or it has more bound violations, or it "
                "now fails; max ULP error is shown but not compared (derivation in reports/README.md, \"Drift\").");
    s.paragraph(std::to_string(drift.compared) + " rows compared (" + std::to_string(drift.identical_rows) +
                " bitwise identical in both measures), " + std::to_string(drift.new_rows) + " new, " +
                std::to_string(drift.missing_rows) + " in the baseline but not in this run.");
    if (drift.regressions.empty()) {
        s.paragraph("**No row regressed.**");
        return s;
    }
    s.paragraph("**" + std::to_string(drift.regressions.size()) + " rows regressed:**");
    Table t;
    t.header = {"row", "what grew", "max ULP (baseline -> now)", "max tightness (baseline -> now)"};
    for (const RowDrift& d : drift.regressions)
        t.rows.push_back({"`" + d.config + "`", d.reason, ulps(d.baseline_ulp) + " -> " + ulps(d.current_ulp),
                          tight(d.baseline_tightness) + " -> " + tight(d.current_tightness)});
    s.table(std::move(t));
    return s;
}

Section failures_section(const std::vector<Row>& rows) {
    Section s{"Failures", {}};
    Table t;
    t.header = {"row", "violations", "worst element (b,h,i,d)", "computed", "exact", "bound", "error"};
    for (const Row& r : rows)
        if (r.failed())
            t.rows.push_back({"`" + r.config + "`", std::to_string(r.violations), index_string(r.worst_index),
                              fmt("%.17g", r.worst_computed), fmt("%.17g", r.worst_exact), sci(r.worst_bound),
                              r.error.empty() ? "-" : r.error});
    if (t.rows.empty()) s.paragraph("None: no element of any row is above its bound, and no implementation threw.");
    else s.table(std::move(t));
    return s;
}

Section plots_section(const Plots& plots, bool wanted) {
    Section s{"Plots", {}};
    if (!wanted) {
        s.paragraph("Plots were not requested (`--no-plots`).");
        return s;
    }
    s.paragraph("Left: error in ulps of the dtype, the maximum (solid) and the 99th percentile (dashed) over the "
                "output elements of a row. Middle: the maximum relative error (against sum_k p_k |V_k|) in units of "
                "the dtype's unit roundoff u, so float and double share an axis. Right: the maximum of error / bound; "
                "the dotted line at 1 is the bound itself. Rows with no error at all are drawn at the tick labelled "
                "0. Float in blue, double in red, float16 in green, bfloat16 in orange. The weights maps after them "
                "show, for one small case per mask and variant, the weights of batch element 0 on a log colour scale, "
                "the keys a query may not read in grey, the causal diagonal and the window's edges as lines "
                "(`attn sdpa --plot-weights` draws the same map for any inputs).");
    for (const Plot& p : plots.plots) s.plot(p.path, p.alt);
    for (const std::string& problem : plots.problems) s.paragraph("Plot not drawn: " + problem);
    return s;
}

Section rows_section(const std::vector<Row>& rows, const std::vector<Summary>& summaries) {
    Section s{"Rows", {}};
    s.paragraph("Every row, named by its config string. ULP columns: error in units in the last place of the "
                "dtype; rel.: error relative to sum_k p_k |V_k|; tightness: error / bound (max and median over the "
                "elements); worst: the element with the largest error / bound.");
    for (const Summary& x : summaries) {
        Table t;
        t.header = {"row", "max ULP", "p99 ULP", "max rel.", "max tightness", "median tightness", "violations",
                    "worst (b,h,i,d)"};
        for (const Row& r : rows) {
            if (r.impl != x.impl || r.dtype != x.dtype) continue;
            if (!r.error.empty()) {
                t.rows.push_back({"`" + r.config + "`", "error: " + r.error, "-", "-", "-", "-", "-", "-"});
                continue;
            }
            t.rows.push_back({"`" + r.config + "`", ulps(r.max_ulp), ulps(r.p99_ulp), sci(r.max_rel),
                              tight(r.max_tightness), tight(r.median_tightness), std::to_string(r.violations),
                              index_string(r.worst_index)});
        }
        s.table(std::move(t), x.impl + " " + to_string(x.dtype) + ": " + std::to_string(x.rows) + " rows");
    }
    return s;
}

// The property suite's mutant table (the authority on which bug each property catches), then the accuracy check's
// own kill column: mutants run through the cross-product cases, killed when some row violates its bound or the
// mutant throws where the correct implementations do not.
Section mutants_section(const std::optional<std::vector<suite::MutantRow>>& table, const std::vector<Row>& mutant_rows,
                        const std::vector<const suite::Implementation*>& mutants, bool swept) {
    Section s{"Mutants", {}};
    if (!table) {
        s.paragraph("The property suite's mutant table was not run (`--no-mutants`); `attn mutants` prints it.");
    } else {
        Index killed = 0;
        double seconds = 0;
        Table t;
        t.header = {"mutant", "bug", "killed", "first killing property", "dtype", "killing case", "cases until the kill",
                    "seconds"};
        for (const suite::MutantRow& m : *table) {
            killed += m.killed;
            seconds += m.seconds;
            t.rows.push_back({m.mutant, m.description, m.killed ? "yes" : "**SURVIVED**", m.killed_by.empty() ? "-" : m.killed_by,
                              m.dtype.empty() ? "-" : m.dtype, m.config.empty() ? "-" : "`" + m.config + "`",
                              std::to_string(m.cases), fmt("%.2f", m.seconds)});
        }
        s.paragraph("The property suite against every deliberately wrong implementation of the registry (`attn "
                    "mutants`): **mutation score " + std::to_string(killed) + "/" + std::to_string(table->size()) +
                    "**, " + fmt("%.1f", seconds) + " s in all. A mutant that survives means a property is missing.");
        s.table(std::move(t));
    }
    if (mutants.empty()) return s;
    if (!swept) {
        s.paragraph("The accuracy sweep of the mutants was skipped (`--no-mutants`).");
        return s;
    }
    Table t;
    t.header = {"mutant", "killed by the accuracy sweep", "first killing row", "max tightness there"};
    Index killed = 0;
    for (const suite::Implementation* m : mutants) {
        const Row* first = nullptr;
        Index rows = 0, failed = 0;
        for (const Row& r : mutant_rows) {
            if (r.impl != m->name) continue;
            ++rows;
            if (r.failed()) {
                ++failed;
                if (!first) first = &r;
            }
        }
        killed += failed > 0;
        t.rows.push_back({m->name,
                          failed ? "yes (" + std::to_string(failed) + "/" + std::to_string(rows) + " rows)" : "no",
                          first ? "`" + first->config + "`" : "-",
                          first ? (first->error.empty() ? tight(first->max_tightness) : "threw: " + first->error) : "-"});
    }
    s.paragraph("The accuracy check alone (every output element within the oracle's bound) against every mutant, on "
                "the " + std::to_string(mutant_rows.size()) + " rows of the distribution x mask cross product of the "
                "smoke grid: " + std::to_string(killed) + " of " + std::to_string(mutants.size()) + " killed. Bugs "
                "this sweep cannot see (dropout, NaN handling, weights-only bugs, shapes it does not use) are the "
                "properties' job.");
    s.table(std::move(t));
    return s;
}

Section artifact_section(const std::string& title, const std::string& file, const std::string& intro,
                         const std::string& how_to_run, const std::vector<std::string>& dirs) {
    Section s{title, {}};
    if (const auto path = find_artifact(dirs, file)) {
        s.paragraph(intro);
        append_artifact(s, *path);
    } else {
        s.paragraph("Not run: no `" + file + "` was found (" + how_to_run + ").");
    }
    return s;
}

// Fuzzing figures: the fuzz.json of the latest `attn fuzz` run found (execs/s, coverage, findings per target), and
// the fuzzers' mutant table: the one `attn fuzz --mutants` last wrote into the fuzz build directory, else the
// committed fuzz/mutant_kills.md (said which, with the machine it names).
Section fuzzing_section(const std::vector<std::string>& dirs, const std::string& project_root) {
    Section s{"Fuzzing", {}};
    const auto figures = find_artifact(dirs, "fuzz.json");
    auto kills = find_artifact(dirs, "mutant_kills.md");
    const bool committed = !kills;
    if (!kills && !project_root.empty()) kills = find_artifact({project_root + "/fuzz"}, "mutant_kills.md");
    if (figures) {
        s.paragraph("Figures of the latest `attn fuzz` run found: executions per second, coverage, findings.");
        append_artifact(s, *figures);
    } else {
        s.paragraph("No `attn fuzz` run was found on this machine (`attn fuzz --target all --minutes M` writes its "
                    "figures to the fuzz build directory; `attn verify` runs one).");
    }
    if (kills) {
        s.paragraph(committed ? "The mutants under the fuzzers, as committed in `fuzz/mutant_kills.md` (no "
                                "`attn fuzz --mutants` run on this machine; the table names the machine it ran on):"
                              : "The mutants under the fuzzers, from the latest `attn fuzz --mutants` run:");
        append_markdown_artifact(s, *kills);
    }
    return s;
}

// The committed coverage summary (`attn coverage` writes reports/coverage/summary.json): lines and branches of
// lib/src and oracle/src per file, by the property suite alone and with the fuzz replays added.
Section coverage_section(const std::string& project_root) {
    Section s{"Coverage", {}};
    const fs::path path = fs::path(project_root) / "reports" / "coverage" / "summary.json";
    std::error_code ec;
    if (project_root.empty() || !fs::is_regular_file(path, ec)) {
        s.paragraph("Not measured: no `reports/coverage/summary.json` (`attn coverage` writes it).");
        return s;
    }
    std::ifstream in(path);
    const nlohmann::json summary = nlohmann::json::parse(in);
    const nlohmann::json& alone = summary.at("snapshots").at("properties").at("files");
    const nlohmann::json& both = summary.at("snapshots").at("properties+fuzz").at("files");
    const auto ratio = [](long covered, long total) {
        char buf[64];
        if (total == 0) return std::to_string(covered) + "/0";
        std::snprintf(buf, sizeof buf, "%ld/%ld (%.1f%%)", covered, total, 100.0 * static_cast<double>(covered) / static_cast<double>(total));
        return std::string(buf);
    };
    Table t;
    t.header = {"file", "lines, properties alone", "branches, properties alone", "lines, + fuzz replay",
                "branches, + fuzz replay"};
    for (const std::string folder : {"lib/src/", "oracle/src/"}) {
        long sum[8] = {};
        for (const nlohmann::json& a : alone) {
            const std::string file = a.at("file").get<std::string>();
            if (file.rfind(folder, 0) != 0) continue;
            for (const nlohmann::json& b : both) {
                if (b.at("file") != file) continue;
                const long n[8] = {a.at("lines_covered"), a.at("lines_total"), a.at("branches_covered"), a.at("branches_total"),
                                   b.at("lines_covered"), b.at("lines_total"), b.at("branches_covered"), b.at("branches_total")};
                for (int x = 0; x < 8; ++x) sum[x] += n[x];
                t.rows.push_back({"`" + file + "`", ratio(n[0], n[1]), ratio(n[2], n[3]), ratio(n[4], n[5]), ratio(n[6], n[7])});
            }
        }
        t.rows.push_back({"**" + folder + " (all)**", ratio(sum[0], sum[1]), ratio(sum[2], sum[3]), ratio(sum[4], sum[5]),
                          ratio(sum[6], sum[7])});
    }
    s.paragraph("The committed summary of `attn coverage` (`reports/coverage/summary.md`; g++ `--coverage -O0`, gcovr with "
                "throw and unreachable branches excluded): lines and branches covered / total, by the property suite "
                "alone and with the fuzz corpus replays added. suite/README.md lists the lines the properties miss and "
                "why.");
    s.table(std::move(t));
    return s;
}

// The committed source-mutation summary (`attn mutate` writes reports/mutation/summary.json): the mutation score of
// the property suite over lib/src, per file, and every survivor.
Section mutation_section(const std::string& project_root) {
    Section s{"Source mutation", {}};
    const fs::path path = fs::path(project_root) / "reports" / "mutation" / "summary.json";
    std::error_code ec;
    if (project_root.empty() || !fs::is_regular_file(path, ec)) {
        s.paragraph("Not measured: no `reports/mutation/summary.json` (`attn mutate` writes it).");
        return s;
    }
    std::ifstream in(path);
    const nlohmann::json summary = nlohmann::json::parse(in);
    const nlohmann::json& c = summary.at("counts");
    const auto n = [](const nlohmann::json& j, const char* key) { return std::to_string(j.at(key).get<int>()); };
    const auto percent = [](double x) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f%%", x);
        return std::string(buf);
    };
    s.paragraph("The committed summary of `" + summary.at("command").get<std::string>() +
                "` (`reports/mutation/summary.md`): small automatic changes to the library's own source, one at a "
                "time, each run against the property suite (and, when it survives, the unit tests). Equivalent "
                "mutants (`suite/equivalent_mutants.txt`, with the reason for each) and mutants that do not compile "
                "are left out of the score.");
    Table t;
    t.header = {"mutants", "killed by the properties", "killed by the unit tests only", "survived both", "equivalent",
                "stillborn", "score (properties)", "score (+ unit tests)"};
    t.rows.push_back({n(c, "run"), n(c, "killed"), n(c, "unit"), n(c, "survived"), n(c, "equivalent"), n(c, "stillborn"),
                      percent(summary.at("score").get<double>()), percent(summary.at("score_with_unit_tests").get<double>())});
    s.table(std::move(t));
    Table f;
    f.header = {"file", "run", "killed", "unit tests", "survived", "equivalent", "stillborn"};
    for (const nlohmann::json& x : summary.at("files"))
        if (x.at("run").get<int>() > 0)
            f.rows.push_back({"`" + x.at("file").get<std::string>() + "`", n(x, "run"), n(x, "killed"), n(x, "unit"),
                              n(x, "survived"), n(x, "equivalent"), n(x, "stillborn")});
    s.table(std::move(f));
    return s;
}

// The rows left out because the implementation does not support them (an external kernel's declaration).
Section skipped_section(const std::map<std::string, int>& skipped) {
    Section s{"Rows skipped", {}};
    int total = 0;
    for (const auto& [reason, count] : skipped) total += count;
    s.paragraph(std::to_string(total) + " rows of the grid are left out: the implementation does not support them "
                "(neither a pass nor a failure).");
    Table t;
    t.header = {"rows", "why"};
    for (const auto& [reason, count] : skipped) t.rows.push_back({std::to_string(count), reason});
    s.table(std::move(t));
    return s;
}

Section gradients_section(const std::vector<GradientRow>& rows) {
    Section s{"Gradients", {}};
    s.paragraph("The backward pass of every implementation that has one, on the smoke grid's cross-product cases with "
                "a random dout: dq, dk and dv element by element against the oracle's exact gradients and their "
                "rigorous bound for the implementation's structure (oracle/BOUNDS.md sections 12, 12b: `tiled` "
                "recomputes P from the saved lse and D from the saved output). 16-bit gradients are checked by the "
                "property suite and `attn_backward_test`, not here. Each case's dq, dk and dv is a row of its own in "
                "`accuracy.json` (`gradient_rows`, config `dq <case>`), compared with the baseline as the forward's "
                "rows are (Drift).");
    Table t;
    t.header = {"implementation", "dtype", "cases", "max ULP dq", "max ULP dk", "max ULP dv", "max tightness dq",
                "max tightness dk", "max tightness dv", "median tightness", "violations", "unbounded elements",
                "errors", "row with the max tightness"};
    for (const GradientRow& r : rows) {
        const double median = r.tightness.empty() ? 0 : r.tightness[r.tightness.size() / 2];
        t.rows.push_back({r.impl, to_string(r.dtype), std::to_string(r.cases), ulps(r.max_ulp[0]), ulps(r.max_ulp[1]),
                          ulps(r.max_ulp[2]), tight(r.max_tightness[0]), tight(r.max_tightness[1]),
                          tight(r.max_tightness[2]), tight(median), std::to_string(r.violations),
                          std::to_string(r.unbounded), std::to_string(r.errors),
                          r.worst_config.empty() ? "" : "`" + r.worst_config + "`"});
    }
    s.table(std::move(t));
    return s;
}

Section reading_section() {
    Section s{"How to read this report", {}};
    s.paragraph("A ULP is the spacing of the dtype's numbers at the exact value; the bound is the oracle's rigorous "
                "worst-case error for the implementation's way of computing; tightness is error / bound. A healthy "
                "row has tightness around 0.01 to 0.5; values near 1e-9 mean the bound is so loose it proves "
                "nothing; above 1 is a bug (in the implementation or in the bound). The full guide, the JSON "
                "schema and what to do when drift is flagged are in `reports/README.md`.");
    return s;
}

void write_text(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream out(path);
    out << text;
    if (!out) throw IoError("report: cannot write " + path.string());
}

// A path as the report shows it: relative to the project root when it lies inside it, so the committed report
// does not name the directory it happened to be made in.
std::string shown_path(const std::string& path, const std::string& root) {
    if (root.empty()) return path;
    std::error_code ec;
    const fs::path rel = fs::weakly_canonical(path, ec).lexically_relative(fs::weakly_canonical(root, ec));
    if (ec || rel.empty() || *rel.begin() == "..") return path;
    return rel.string();
}

bool same_file(const fs::path& a, const fs::path& b) {
    std::error_code ec;
    return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

}  // namespace

// ---- JSON -----------------------------------------------------------------------------------------------------

nlohmann::json fingerprint_json(const NumericsFingerprint& fingerprint) {
    nlohmann::json j = {{"id", fingerprint.id()}};
    for (const auto& [name, value] : fingerprint.fields()) j[name] = value;
    return j;
}

nlohmann::json accuracy_json(GridKind grid, const std::vector<Row>& rows, const DriftMargin& margin,
                             const NumericsFingerprint& fingerprint, const std::vector<Row>& gradient_rows) {
    nlohmann::json j;
    j["schema"] = "attn-accuracy/3";
    j["grid"] = to_string(grid);
    j["fingerprint"] = fingerprint_json(fingerprint);
    j["margin"] = {{"factor", margin.factor}, {"ulps", margin.ulps}, {"measure", "max_tightness"}};
    j["summary"] = nlohmann::json::array();
    for (const Summary& s : summarize(rows)) j["summary"].push_back(to_json(s));
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) j["rows"].push_back(to_json(r));
    j["gradient_rows"] = nlohmann::json::array();
    for (const Row& r : gradient_rows) j["gradient_rows"].push_back(to_drift_json(r));
    return j;
}

std::string baseline_file(const std::string& baselines_dir, const std::string& fingerprint_id) {
    return (fs::path(baselines_dir) / (fingerprint_id + ".json")).string();
}

std::vector<Row> read_accuracy_json(const std::string& path, std::string* grid, std::string* fingerprint_id,
                                    std::vector<Row>* gradient_rows) {
    std::ifstream in(path);
    if (!in) throw IoError("report: cannot read " + path);
    nlohmann::json j;
    try {
        in >> j;
    } catch (const nlohmann::json::exception& e) {
        throw IoError("report: " + path + " is not valid JSON: " + e.what());
    }
    // Version 2 added the fingerprint and changed what the margin applies to; version 3 keeps a row's case, impl and
    // dtype in its config string only (row_from_json reads every version's rows).
    const std::string schema = j.is_object() ? j.value("schema", "") : "";
    if ((schema != "attn-accuracy/1" && schema != "attn-accuracy/2" && schema != "attn-accuracy/3") ||
        !j.contains("rows") || !j["rows"].is_array())
        throw IoError("report: " + path + " is not an attn accuracy report (schema attn-accuracy/1, /2 or /3)");
    if (grid) *grid = j.value("grid", "?");
    if (fingerprint_id) {
        const auto f = j.find("fingerprint");
        *fingerprint_id = f != j.end() && f->is_object() ? f->value("id", "") : "";
    }
    std::vector<Row> rows;
    for (const auto& r : j["rows"]) rows.push_back(row_from_json(r));
    if (gradient_rows && j.contains("gradient_rows") && j["gradient_rows"].is_array())
        for (const auto& r : j["gradient_rows"]) gradient_rows->push_back(row_from_drift_json(r));
    return rows;
}

// ---- the command ----------------------------------------------------------------------------------------------

namespace {

// Step 1: the baseline of this fingerprint (its path, whether it exists and what it records, into run.drift), read
// before anything is written; its rows, or none.
std::vector<Row> read_baseline(const ReportOptions& options, const std::string& baseline_path, ReportRun& run,
                               std::vector<Row>& gradient_rows) {
    std::vector<Row> baseline;
    run.drift.fingerprint = run.fingerprint.id();
    run.drift.baseline_path = shown_path(baseline_path, options.project_root);
    std::error_code ec;
    run.drift.baseline_found = !baseline_path.empty() && fs::exists(baseline_path, ec);
    if (run.drift.baseline_found)
        baseline = read_accuracy_json(baseline_path, &run.drift.baseline_grid, &run.drift.baseline_fingerprint,
                                      &gradient_rows);
    return baseline;
}

// The summary committed beside a recorded baseline (reports/baselines/<id>.md): the run's headline tables, small
// enough to review in a diff, where the full report stays in the build directory.
Document summary_document(const ReportOptions& options, const ReportRun& run, const std::vector<GradientRow>& gradients) {
    Document doc{"attn accuracy summary: fingerprint " + run.fingerprint.id(), {}};
    doc.sections.push_back(summary_section(options, run.rows, run.summaries));
    if (!gradients.empty()) doc.sections.push_back(gradients_section(gradients));
    if (!run.skipped.empty()) doc.sections.push_back(skipped_section(run.skipped));
    doc.sections.push_back(machine_section(run.fingerprint));
    return doc;
}

// Step 6: the document, section by section: the summary's sections first, then the rest.
Document make_document(const ReportOptions& options, const ReportRun& run, const Plots& plots,
                       const std::optional<std::vector<suite::MutantRow>>& table, const std::vector<Row>& mutant_rows,
                       const std::vector<const suite::Implementation*>& mutants,
                       const std::vector<GradientRow>& gradients) {
    Document doc{"attn accuracy report", summary_document(options, run, gradients).sections};
    doc.sections.push_back(drift_section(run.drift, record_command(options)));
    doc.sections.push_back(failures_section(run.rows));
    doc.sections.push_back(plots_section(plots, options.plots));
    doc.sections.push_back(mutants_section(table, mutant_rows, mutants, options.mutant_sweep));
    doc.sections.push_back(fuzzing_section(options.artifact_dirs, options.project_root));
    doc.sections.push_back(artifact_section(
        "Benchmarks", "bench.json",
        "Figures of the last `attn bench --json` run (Google Benchmark underneath): time, GFLOP/s and % of gemm "
        "peak, as ratios within that one run.",
        "`attn bench --json` leaves it", options.artifact_dirs));
    doc.sections.push_back(coverage_section(options.project_root));
    doc.sections.push_back(mutation_section(options.project_root));
    doc.sections.push_back(rows_section(run.rows, run.summaries));
    doc.sections.push_back(reading_section());

    return doc;
}

// Step 8: the plain log (summaries, every failed and regressed row with its reproduction, what was written); the
// exit code --check asks for.
int write_log(const ReportOptions& options, const ReportRun& run, const fs::path& out_dir, const fs::path& json_path,
              const std::string& baseline_path, const Plots& plots, std::ostream& log) {
    const std::string fingerprint = run.fingerprint.id();
    // 8. The log.
    log << "\n";
    char line[512];
    std::snprintf(line, sizeof line, "%-12s %-7s %5s %10s %10s %10s %10s %10s %6s\n", "impl", "dtype", "rows",
                  "max_ulp", "p99_ulp", "max_rel", "med_tight", "max_tight", "viol");
    log << line;
    for (const Summary& s : run.summaries) {
        std::snprintf(line, sizeof line, "%-12s %-7s %5lld %10.3g %10.3g %10.2e %10.2g %10.2g %6lld%s\n",
                      s.impl.c_str(), to_string(s.dtype), static_cast<long long>(s.rows), s.max_ulp, s.max_p99_ulp,
                      s.max_rel, s.median_tightness, s.max_tightness, static_cast<long long>(s.violations),
                      s.failed_rows ? "  FAILED ROWS" : "");
        log << line;
    }
    Index failed = 0;
    for (const ReportRun::GradientSummary& g : run.gradients) {
        log << "gradients " << g.impl << " " << g.dtype << ": " << g.cases << " cases, max error / bound "
            << g.max_tightness << ", " << g.violations << " elements above their bound, " << g.errors << " errors\n";
        if (g.violations > 0 || g.errors > 0) {
            ++failed;
            log << "FAILED gradients of " << g.impl << " " << g.dtype << ": "
                << (g.errors > 0 ? g.first_error : "worst " + g.worst_config) << "\n";
        }
    }
    for (const Row& r : run.rows)
        if (r.failed()) {
            ++failed;
            log << "FAILED " << r.config << ": "
                << (!r.error.empty()   ? r.error
                    : r.violations > 0 ? std::to_string(r.violations) + " elements above their bound, worst " +
                                             index_string(r.worst_index)
                                       : "statistically suspicious (max error / statistical bound " +
                                             std::to_string(r.stat_max_tightness) + ", row statistic " +
                                             std::to_string(r.row_statistic) + " of its threshold)")
                << "\n  reproduce: " << reproduce_command(options, r.config) << "\n";
        }
    if (!run.drift.checked) {
        log << not_checked_line(run.drift, record_command(options), false) << "\n";
    } else {
        log << "drift: " << run.drift.compared << " rows compared with " << run.drift.baseline_path
            << " (fingerprint " << fingerprint << ", "
            << run.drift.identical_rows << " identical), " << run.drift.regressions.size() << " regressed\n";
        for (const RowDrift& d : run.drift.regressions)
            log << "REGRESSED " << d.config << ": " << d.reason << "\n  reproduce: " << reproduce_command(options, d.config)
                << "\n";
    }
    log << "wrote " << (out_dir / "accuracy.md").string() << ", " << (out_dir / "index.html").string() << ", "
        << json_path.string() << ", " << plots.plots.size() << " plots\n";
    for (const std::string& p : plots.problems) log << "warning: " << p << "\n";
    if (options.update_baseline && !baseline_path.empty())
        log << "baseline for fingerprint " << fingerprint << " written: " << baseline_path << " (and its summary, "
            << fs::path(baseline_path).replace_extension(".md").string() << ")\n";

    if (options.check && (failed > 0 || !run.drift.regressions.empty())) {
        log << "attn report --check: FAILED (" << failed << " failed rows, " << run.drift.regressions.size()
            << " regressions)\n";
        return 1;
    } else if (options.check) {
        log << "attn report --check: passed (every row within its bound; "
            << (run.drift.checked ? std::to_string(run.drift.compared) + " rows compared, none regressed"
                                  : std::string("drift not checked"))
            << ")\n";
    }
    return 0;
}

}  // namespace

ReportRun run_report(const ReportOptions& options, const std::vector<const suite::Implementation*>& impls,
                     const std::vector<const suite::Implementation*>& mutants, std::ostream& log) {
    if (impls.empty()) throw ConfigError("report: no implementation to measure");
    ReportRun run;
    const DriftMargin margin;
    run.fingerprint = numerics_fingerprint();
    const std::string fingerprint = run.fingerprint.id();

    // 1. The baseline of this fingerprint, read before anything is written.
    const std::string baseline_path =
        !options.baseline_path.empty() ? options.baseline_path
        : options.baselines_dir.empty() ? std::string()
                                        : baseline_file(options.baselines_dir, fingerprint);
    if (!options.drift_off.empty() && options.update_baseline)
        throw ConfigError("report: no baseline is recorded here: " + options.drift_off);
    run.drift.off = options.drift_off;
    std::vector<Row> baseline_gradients;
    std::vector<Row> baseline = options.drift_off.empty() ? read_baseline(options, baseline_path, run, baseline_gradients)
                                                          : std::vector<Row>{};
    // Another fingerprint rounds differently within the same bounds: its rows say nothing about drift here.
    const bool comparable = run.drift.baseline_found && run.drift.baseline_fingerprint == fingerprint;

    if (!options.filter.empty()) {
        if (options.update_baseline) throw ConfigError("report: --update-baseline records the whole grid, not --filter");
        suite::check_filter(options.filter);
        std::erase_if(baseline, [&](const Row& r) { return !suite::config_matches(r.config, options.filter); });
    }

    // 2. The sweep.
    const std::vector<Case> cases = make_grid(options.grid);
    log << "attn report: grid " << to_string(options.grid) << ", " << cases.size() << " cases x " << suite::all_dtypes().size() << " dtypes x "
        << impls.size() << " implementations"
        << (options.filter.empty() ? std::string() : ", only rows matching '" + options.filter + "'")
        << ", fingerprint " << fingerprint << std::endl;
    run.rows = sweep(cases, impls, options.jobs, "report", options.filter, &run.skipped);
    if (run.rows.empty()) throw ConfigError("report: no row of grid " + std::string(to_string(options.grid)) +
                                            " matches '" + options.filter + "'");
    run.summaries = summarize(run.rows);

    // 2b. The backward pass, on the smoke grid's cross-product cases (unless --filter narrows the run to other rows).
    std::vector<GradientRow> gradients;
    std::vector<Row> gradient_rows_now;  // per case and gradient, for drift and the JSON
    if (options.filter.empty()) {
        std::vector<Case> small;
        for (const Case& c : make_grid(GridKind::Smoke))
            if (c.sweep == "grid") small.push_back(c);
        gradients = gradient_rows(small, impls);
        for (const GradientRow& g : gradients) {
            run.gradients.push_back({g.impl, to_string(g.dtype), g.cases, g.violations, g.errors, g.worst_tightness,
                                     g.worst_config, g.first_error});
            gradient_rows_now.insert(gradient_rows_now.end(), g.rows.begin(), g.rows.end());
        }
    }

    // 3. Drift, of the forward rows and (without --filter) the gradient rows.
    if (comparable) {
        std::vector<Row> current = run.rows;
        if (options.filter.empty()) {
            baseline.insert(baseline.end(), baseline_gradients.begin(), baseline_gradients.end());
            current.insert(current.end(), gradient_rows_now.begin(), gradient_rows_now.end());
        }
        Drift compared = compare_with_baseline(baseline, current, margin);
        compared.fingerprint = fingerprint;
        compared.baseline_path = run.drift.baseline_path;
        compared.baseline_fingerprint = run.drift.baseline_fingerprint;
        compared.baseline_grid = run.drift.baseline_grid;
        run.drift = std::move(compared);
    }

    // 4. The mutants, on the cross-product cases of the smoke grid.
    std::vector<Row> mutant_rows;
    if (options.mutant_sweep && !mutants.empty()) {
        std::vector<Case> small;
        for (const Case& c : make_grid(GridKind::Smoke))
            if (c.sweep == "grid") small.push_back(c);
        mutant_rows = sweep(small, mutants, options.jobs, "mutants");
    }

    // 5. The property suite's mutant table.
    std::optional<std::vector<suite::MutantRow>> table;
    if (options.mutant_table) {
        log << "mutant table: the property suite against every mutant (one line per mutant on stderr)" << std::endl;
        table = suite::mutant_table(suite::settings_from_environment(false), &std::cerr);
    }

    // 6. Plots and the document.
    const fs::path out_dir = options.out_dir;
    fs::create_directories(out_dir);
    Plots plots;
    if (options.plots) plots = make_plots(run.rows, out_dir.string());
    const Document doc = make_document(options, run, plots, table, mutant_rows, mutants, gradients);

    // 7. Files. The run's JSON is the latest report; it never silently replaces a baseline: without
    // --update-baseline it goes next to it as accuracy.new.json when --baseline names the output's accuracy.json.
    const std::string json_text =
        rows_one_per_line(accuracy_json(options.grid, run.rows, margin, run.fingerprint, gradient_rows_now));
    fs::path json_path = out_dir / "accuracy.json";
    if (!options.update_baseline && !baseline_path.empty() && same_file(json_path, baseline_path))
        json_path = out_dir / "accuracy.new.json";
    write_text(json_path, json_text);
    if (options.update_baseline && !baseline_path.empty()) {
        write_text(baseline_path, json_text);
        write_text(fs::path(baseline_path).replace_extension(".md"),
                   render_markdown(summary_document(options, run, gradients)));
    }
    write_text(out_dir / "accuracy.md", render_markdown(doc));
    write_text(out_dir / "index.html", render_html(doc, out_dir.string()));

    // 8. The log.
    run.exit_code = write_log(options, run, out_dir, json_path, baseline_path, plots, log);
    return run;
}

}  // namespace attn::report
