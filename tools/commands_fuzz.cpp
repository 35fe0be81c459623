// `attn fuzz`: time-boxed libFuzzer runs of the fuzz targets (build/fuzz, the `fuzz` preset), corpus merge, crash
// minimisation into regressions/fuzz/<target>/, a per-target summary; `--smoke` for the test suite and
// `--mutants` for the table of mutants the fuzzers kill.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/machine.hpp"
#include "commands.hpp"

namespace attn::cli {

namespace {

namespace fs = std::filesystem;

struct FuzzSettings {
    std::string target = "all";
    double minutes = 1;
    int jobs = 1;
    bool smoke = false;
    int smoke_runs = 1000;
    double smoke_cap_seconds = 60;
    bool mutants = false;
    double mutant_seconds = 60;
    bool no_build = false;
    bool merge_corpus = false;
    std::string build_dir;  // default <source>/build/fuzz
    std::string kernel;     // an external kernel library (attn/kernel_abi.h) to fuzz instead of the library
    std::string cases_dir = "attn-cases";
};

// Runs a shell command, returning its exit code and stdout+stderr.
std::pair<int, std::string> capture(const std::string& command) {
    std::cout.flush();
    std::string output;
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    if (!pipe) return {2, ""};
    std::array<char, 4096> buffer{};
    while (std::fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
    return {exit_code(pclose(pipe)), output};
}

std::string utc_now(const char* format) {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[64];
    std::strftime(buf, sizeof buf, format, &tm);
    return buf;
}

// The last number after `key` in libFuzzer's output ("cov: 779", "stat::average_exec_per_sec:     723").
double last_number_after(const std::string& text, const std::string& key) {
    const auto at = text.rfind(key);
    if (at == std::string::npos) return -1;
    return std::atof(text.c_str() + at + key.size());
}

// The first line saying what went wrong: a violated property, a sanitizer report, a libFuzzer error.
std::string symptom_of(const std::string& text) {
    for (const char* key : {"attn-fuzz: property violated:", "runtime error:", "ERROR: AddressSanitizer:",
                            "ERROR: LeakSanitizer:", "ERROR: libFuzzer:", "SUMMARY:"}) {
        const auto at = text.find(key);
        if (at == std::string::npos) continue;
        const auto end = text.find('\n', at);
        return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    }
    return "(no symptom line found)";
}

// The numerics fingerprint and its fields, each field after `separator`, for the top of every log and table this
// command leaves. It is this program's; the fuzz targets run on the same CPU, SIMD targets, BLIS and C library, but
// are built by clang with sanitizers, so their compiler and flags differ.
std::string fingerprint_text(const std::string& separator) {
    const NumericsFingerprint f = numerics_fingerprint();
    std::string out = "numerics fingerprint " + f.id() + " (of this attn program; the fuzz build's compiler and "
                      "flags differ)";
    for (const auto& [name, value] : f.fields()) out += separator + name + ": " + value;
    return out;
}

std::size_t count_files(const fs::path& dir) {
    std::size_t n = 0;
    if (fs::exists(dir))
        for (const auto& entry : fs::directory_iterator(dir)) n += entry.is_regular_file();
    return n;
}

struct Paths {
    fs::path source, release, fuzz_build;
    // With an external kernel: its library, and the directory its corpus, findings and figures go to (attn's own
    // corpus and regressions are attn's: they only seed the kernel's corpus).
    // The committed corpus (fuzz/corpus) is read, never written by a fuzzing run: what a run finds grows a corpus
    // outside git (build/fuzz/corpus, or the kernel's), and `attn fuzz --merge-corpus` adds to the committed one
    // the units of it that reach something the committed one does not.
    fs::path kernel, kernel_dir;
    fs::path fuzzer(const std::string& target) const { return fuzz_build / "fuzz" / ("fuzz_" + target); }
    // The fuzzer as a shell command: the kernel, when there is one, chosen through the environment.
    std::string fuzzer_command(const std::string& target) const {
        return (kernel.empty() ? "" : "ATTN_FUZZ_KERNEL=" + quote(kernel) + " ") + quote(fuzzer(target));
    }
    fs::path committed_corpus(const std::string& target) const { return source / "fuzz" / "corpus" / target; }
    fs::path corpus(const std::string& target) const {
        return kernel.empty() ? fuzz_build / "corpus" / target : kernel_dir / "fuzz-corpus" / target;
    }
    // Both, as libFuzzer's corpus arguments after the one new units go to.
    std::string corpora(const std::string& target) const {
        return quote(corpus(target)) + " " + quote(committed_corpus(target));
    }
    fs::path dict(const std::string& target) const { return source / "fuzz" / "dict" / (target + ".dict"); }
    fs::path regressions(const std::string& target) const {
        return kernel.empty() ? source / "regressions" / "fuzz" / target : kernel_dir / "fuzz" / target;
    }
    fs::path runs(const std::string& target) const {
        return fuzz_build / "runs" / (kernel.empty() ? target : kernel_dir.filename().string() + "-" + target);
    }
    fs::path figures() const { return kernel.empty() ? fuzz_build / "fuzz.json" : kernel_dir / "fuzz.json"; }
};

// Configures (once) and builds the fuzz preset: clang, libFuzzer, ASan + UBSan + float-divide-by-zero.
int build_fuzz_preset(const Paths& paths, int jobs) {
    const std::string cd = "cd " + quote(paths.source) + " && ";
    // Configured every time (incremental): the list of targets below is the configure step's, and a target added
    // since the last configure must be in it.
    if (!fs::exists(paths.fuzz_build / "build.ninja"))
        std::cout << "attn fuzz: configuring the fuzz preset in " << paths.fuzz_build << "\n";
    if (const int rc = run(cd + "cmake --preset fuzz -B " + quote(paths.fuzz_build) + " > /dev/null")) return rc;
    // Only the fuzz targets (and what they link): the preset also configures the property tests, not needed here.
    std::string targets;
    std::istringstream names(read_text(paths.fuzz_build / "fuzz" / "targets.txt"));
    for (std::string t; names >> t;) targets += " fuzz_" + t;
    targets += " fuzz_leak_check";
    std::cout << "attn fuzz: building" << targets << " (clang, libFuzzer, sanitizers)\n";
    return run(cd + "cmake --build " + quote(paths.fuzz_build) + " -j " + std::to_string(std::max(jobs, 1)) +
               " --target" + targets);
}

std::vector<std::string> built_targets(const Paths& paths) {
    std::istringstream in(read_text(paths.fuzz_build / "fuzz" / "targets.txt"));
    std::vector<std::string> targets;
    for (std::string t; in >> t;) targets.push_back(t);
    return targets;
}

std::string common_flags(const Paths& paths, const std::string& target) {
    std::string flags = " -print_final_stats=1 -timeout=20 -rss_limit_mb=4096 -max_len=4096";
    if (fs::exists(paths.dict(target))) flags += " -dict=" + quote(paths.dict(target));
    return flags;
}

struct TargetReport {
    std::string target;
    double seconds = 0, execs = 0, execs_per_second = 0, coverage = -1, features = -1, corpus_files = 0;
    std::vector<std::string> findings;
};

// Minimises a crashing input, saves it under regressions/fuzz/<target>/ with a one-line note, and prints the
// commands that replay it. Returns the saved path.
fs::path save_finding(const Paths& paths, const std::string& target, const fs::path& artifact) {
    const std::string kind = artifact.filename().string().substr(0, artifact.filename().string().find('-'));
    fs::path input = artifact;
    // libFuzzer writes the crash files of every attempt to its working directory: run it in the artifact's own
    // directory, never in the caller's (the launcher keeps the caller's directory).
    const std::string in_artifacts = "cd " + quote(artifact.parent_path()) + " && " + paths.fuzzer_command(target) +
                                     " -artifact_prefix=" + quote(artifact.parent_path()) + "/";
    if (kind == "crash") {
        const fs::path minimised = artifact.string() + ".min";
        capture(in_artifacts + " -minimize_crash=1 -runs=4000 -exact_artifact_path=" + quote(minimised) + " " +
                quote(artifact));
        if (fs::exists(minimised) && fs::file_size(minimised) > 0) input = minimised;
    }
    std::string symptom = symptom_of(capture(in_artifacts + " " + quote(input)).second);
    if (symptom == "(no symptom line found)" && kind != "crash")
        symptom = "libFuzzer " + kind + " during the run; this input alone does not reproduce it (memory or time " +
                  "accumulated over many executions: see the worker log under " + paths.runs(target).string() + ")";
    fs::create_directories(paths.regressions(target));
    const fs::path saved = paths.regressions(target) / artifact.filename();
    fs::copy_file(input, saved, fs::copy_options::overwrite_existing);
    std::ofstream(saved.string() + ".note") << "target=" << target << " date=" << utc_now("%Y-%m-%d")
                                            << " kind=" << kind << " symptom: " << symptom << "\n";
    const std::string env = paths.kernel.empty() ? "" : "ATTN_FUZZ_KERNEL=" + quote(paths.kernel) + " ";
    std::cout << "attn fuzz: " << target << " finding saved to " << saved << "\n  " << symptom
              << "\n  replay: " << env << (paths.release / "fuzz" / ("fuzz_" + target)).string() << " " << saved.string()
              << "\n  replay under the sanitizers: " << env << paths.fuzzer(target).string() << " " << saved.string() << "\n";
    return saved;
}

TargetReport fuzz_target(const Paths& paths, const std::string& target, const FuzzSettings& s) {
    TargetReport report;
    report.target = target;
    const fs::path work = paths.runs(target) / utc_now("%Y%m%dT%H%M%SZ");
    const fs::path fresh = work / "new", artifacts = work / "artifacts";
    fs::create_directories(fresh);
    fs::create_directories(artifacts);
    fs::create_directories(paths.corpus(target));
    std::ofstream(work / "fingerprint.txt") << fingerprint_text("\n  ") << "\n";
    const int seconds = std::max(1, static_cast<int>(s.minutes * 60));
    std::cout << "attn fuzz: " << target << " for " << seconds << " s on " << s.jobs << " worker(s), log in " << work
              << "\n";
    // New units go to `fresh` (the first corpus dir); the grown and the committed corpus are read, and the units
    // of `fresh` that add coverage are merged into the grown one at the end.
    const auto t0 = std::chrono::steady_clock::now();
    run("cd " + quote(work) + " && " + paths.fuzzer_command(target) + common_flags(paths, target) +
        " -max_total_time=" + std::to_string(seconds) + " -jobs=" + std::to_string(s.jobs) +
        " -workers=" + std::to_string(s.jobs) + " -artifact_prefix=" + quote(artifacts) + "/ " + quote(fresh) + " " +
        paths.corpora(target) + " > /dev/null 2>&1");
    report.seconds = seconds_since(t0);
    for (const auto& entry : fs::directory_iterator(work)) {
        if (entry.path().extension() != ".log") continue;
        const std::string log = read_text(entry.path());
        report.execs += std::max(0.0, last_number_after(log, "stat::number_of_executed_units:"));
        report.execs_per_second += std::max(0.0, last_number_after(log, "stat::average_exec_per_sec:"));
    }
    // Keep only the units that add coverage.
    // (Every libFuzzer call runs in `work`: a unit that crashes on the way is written to the working directory.)
    capture("cd " + quote(work) + " && " + paths.fuzzer_command(target) + " -merge=1 " + quote(paths.corpus(target)) +
            " " + quote(fresh));
    for (const auto& entry : fs::directory_iterator(artifacts))
        report.findings.push_back(save_finding(paths, target, entry.path()).string());
    // Coverage reached: both corpora replayed once.
    const std::string stats =
        capture("cd " + quote(work) + " && " + paths.fuzzer_command(target) + " -runs=0 " + paths.corpora(target))
            .second;
    report.coverage = last_number_after(stats, "cov:");
    report.features = last_number_after(stats, "ft:");
    report.corpus_files = static_cast<double>(count_files(paths.corpus(target)) + count_files(paths.committed_corpus(target)));
    return report;
}

// The committed corpus plus `runs` fresh executions per target, seed 1, new units into a scratch dir: part of the
// test suite. A run count (not a time) keeps the smoke run the same on a loaded machine; the time is only a cap.
int smoke(const Paths& paths, const std::vector<std::string>& targets, int runs, double cap_seconds) {
    int failures = 0;
    for (const std::string& target : targets) {
        const fs::path scratch = paths.fuzz_build / "smoke" / target;
        fs::remove_all(scratch);
        fs::create_directories(scratch / "new");
        const std::size_t corpus_files = count_files(paths.committed_corpus(target));
        const auto [rc, output] =
            capture("cd " + quote(scratch) + " && " + quote(paths.fuzzer(target)) + common_flags(paths, target) +
                    " -seed=1 -runs=" + std::to_string(corpus_files + static_cast<std::size_t>(runs)) +
                    " -max_total_time=" + std::to_string(static_cast<int>(cap_seconds)) + " -artifact_prefix=" +
                    quote(scratch) + "/ " + quote(scratch / "new") + " " + quote(paths.committed_corpus(target)));
        std::printf("  %-16s %s  %8.0f execs  %6.0f execs/s  cov %g\n", target.c_str(), rc == 0 ? "ok    " : "FAILED",
                    last_number_after(output, "stat::number_of_executed_units:"),
                    last_number_after(output, "stat::average_exec_per_sec:"), last_number_after(output, "cov:"));
        if (rc != 0) {
            ++failures;
            std::cout << "    " << symptom_of(output) << "\n";
        }
    }
    // The heap must not grow from call to call on any path (a leak no single fuzz input reveals).
    const auto [leak_rc, leak_output] = capture(quote(paths.fuzz_build / "fuzz" / "fuzz_leak_check"));
    std::cout << leak_output;
    if (leak_rc != 0) {
        ++failures;
        std::cout << "  leak check FAILED (exit " << leak_rc << ")\n";
    }
    return failures == 0 ? 0 : 1;
}

// The grown corpus into the committed one: libFuzzer's merge adds the units that reach features the committed corpus
// does not, and nothing else; the grown corpus stays (the next run still reads it).
int merge_corpus(const Paths& paths, const std::vector<std::string>& targets) {
    std::size_t added = 0;
    for (const std::string& target : targets) {
        const std::size_t grown = count_files(paths.corpus(target)), before = count_files(paths.committed_corpus(target));
        if (grown == 0) {
            std::printf("  %-16s nothing grown in %s\n", target.c_str(), paths.corpus(target).c_str());
            continue;
        }
        const fs::path work = paths.fuzz_build / "merge" / target;
        fs::remove_all(work);
        fs::create_directories(work);
        fs::create_directories(paths.committed_corpus(target));
        const auto [rc, output] = capture("cd " + quote(work) + " && " + quote(paths.fuzzer(target)) + " -merge=1 " +
                                          quote(paths.committed_corpus(target)) + " " + quote(paths.corpus(target)));
        if (rc != 0) {
            std::cout << "attn fuzz: merging " << target << " failed (exit " << rc << "):\n" << output;
            return 1;
        }
        const std::size_t after = count_files(paths.committed_corpus(target));
        std::printf("  %-16s %zu of %zu grown units added (%zu -> %zu)\n", target.c_str(), after - before, grown, before,
                    after);
        added += after - before;
    }
    std::cout << "attn fuzz: " << added << " units added to fuzz/corpus" << (added ? "; commit them" : "") << "\n";
    return 0;
}

// Each mutant under the sdpa and backends targets for a bounded time: killed or not, after how many execs and
// seconds, and by which property.
int mutant_table(const Paths& paths, const std::vector<std::string>& targets, double seconds) {
    const auto [list_rc, list] = capture("ATTN_FUZZ_LIST_MUTANTS=1 " + quote(paths.fuzzer("sdpa")) + " -runs=0");
    std::vector<std::string> names;
    std::istringstream lines(list);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("mutant: ", 0) == 0) names.push_back(line.substr(8));
    if (names.empty()) {
        std::cerr << "attn fuzz: no mutants registered (the fuzz targets were built without the implementation registry)\n";
        return 1;
    }
    std::ostringstream table;
    table << "| mutant | target | killed | execs | seconds | property that failed |\n|---|---|---|---|---|---|\n";
    int survivors = 0;
    for (const std::string& name : names) {
        bool killed_by_any = false;
        for (const std::string& target : {std::string("sdpa"), std::string("backends")}) {
            if (std::find(targets.begin(), targets.end(), target) == targets.end()) continue;
            const fs::path scratch = paths.fuzz_build / "mutants" / name / target;
            fs::remove_all(scratch);
            fs::create_directories(scratch / "new");
            const auto t0 = std::chrono::steady_clock::now();
            const auto [rc, output] = capture(
                "cd " + quote(scratch) + " && ATTN_FUZZ_IMPL='" + name + "' " + quote(paths.fuzzer(target)) +
                common_flags(paths, target) + " -seed=1 -max_total_time=" + std::to_string(static_cast<int>(seconds)) +
                " -exact_artifact_path=" + quote(scratch / "kill") + " " + quote(scratch / "new") + " " +
                quote(paths.committed_corpus(target)));
            const double elapsed = seconds_since(t0);
            const bool killed = rc != 0 && fs::exists(scratch / "kill");
            killed_by_any = killed_by_any || killed;
            // Execs at the kill: the last "#N" progress line (libFuzzer prints one per new unit and on exit).
            double execs = last_number_after(output, "stat::number_of_executed_units:");
            if (execs < 0) {
                const auto at = output.rfind("\n#");
                execs = at == std::string::npos ? -1 : std::atof(output.c_str() + at + 2);
            }
            std::string why = killed ? symptom_of(output) : "";
            const auto colon = why.find("violated: ");
            if (colon != std::string::npos) why = why.substr(colon + 10);
            if (why.size() > 110) why = why.substr(0, 107) + "...";
            std::replace(why.begin(), why.end(), '|', '/');
            char row[512];
            std::snprintf(row, sizeof row, "| %s | %s | %s | %.0f | %.1f | %s |\n", name.c_str(), target.c_str(),
                          killed ? "yes" : "no", execs, elapsed, why.c_str());
            table << row;
            std::cout << row << std::flush;
        }
        if (!killed_by_any) ++survivors;
    }
    const fs::path out = paths.fuzz_build / "mutant_kills.md";
    std::ofstream(out) << "# Mutants under the fuzzers (" << seconds << " s budget each, seed 1, committed corpus)\n\n"
                       << "Machine: " << fingerprint_text("; ") << ".\n\n"
                       << table.str() << "\n" << names.size() - static_cast<std::size_t>(survivors) << " of "
                       << names.size() << " mutants killed.\n";
    std::cout << "\nattn fuzz: " << names.size() - static_cast<std::size_t>(survivors) << " of " << names.size()
              << " mutants killed; table written to " << out << "\n";
    return survivors == 0 ? 0 : 1;
}

}  // namespace

Action add_fuzz_command(CLI::App& app) {
    static FuzzSettings settings;
    auto* fuzz = app.add_subcommand(
        "fuzz", "Fuzz the library: time-boxed libFuzzer runs, corpus merge, crashes minimised into regressions/fuzz/");
    fuzz->add_option("--target", settings.target, "A fuzz target (sdpa, mask_broadcast, mha, npy, safetensors, backends, backward) or all");
    fuzz->add_option("--minutes", settings.minutes, "Minutes per target")->check(CLI::PositiveNumber);
    fuzz->add_option("--jobs", settings.jobs, "Parallel libFuzzer workers per target")->check(CLI::PositiveNumber);
    fuzz->add_flag("--smoke", settings.smoke, "The corpus plus a few thousand runs per target, seed 1 (part of attn test)");
    fuzz->add_option("--smoke-runs", settings.smoke_runs, "Fresh executions per target for --smoke");
    fuzz->add_flag("--mutants", settings.mutants, "Run every mutant under the sdpa and backends targets");
    fuzz->add_option("--mutant-seconds", settings.mutant_seconds, "Time budget per mutant and target");
    fuzz->add_flag("--no-build", settings.no_build, "Use the fuzz build as it is");
    fuzz->add_flag("--merge-corpus", settings.merge_corpus,
                   "Add to the committed corpus (fuzz/corpus) the units of the grown one (build/fuzz/corpus) that reach "
                   "what it does not; fuzzing runs never write fuzz/corpus");
    fuzz->add_option("--build-dir", settings.build_dir, "The fuzz preset's build directory (default build/fuzz)");
    fuzz->add_option("--kernel", settings.kernel,
                     "Fuzz an external kernel (attn/kernel_abi.h) under the sdpa and backends targets instead of the "
                     "library; its corpus, findings and figures go to --cases-dir/<kernel name>/");
    fuzz->add_option("--cases-dir", settings.cases_dir, "Where --kernel's results go (default attn-cases)");
    return [fuzz]() -> int {
        if (!fuzz->parsed()) return not_mine;
        const FuzzSettings& s = settings;
        // Tiny problems, many calls, a shared machine: OpenMP threads that spin between calls starve the fuzzer
        // (measured: a 327-input replay took 1.7 s with the default policy, 0.08 s passive, under load 16).
        setenv("OMP_WAIT_POLICY", "passive", 0);
        Paths paths{ATTN_SOURCE_DIR, ATTN_BINARY_DIR, s.build_dir.empty() ? fs::path(ATTN_SOURCE_DIR) / "build" / "fuzz"
                                                                            : fs::path(s.build_dir), {}, {}};
        std::cout << "attn fuzz: " << fingerprint_text("\n  ") << "\n";
        if (capture("command -v clang++").first != 0) {
            std::cerr << "attn fuzz: clang++ not found; the libFuzzer targets need clang (deps/debian.txt)\n";
            return 2;
        }
        if (!s.no_build)
            if (const int rc = build_fuzz_preset(paths, s.smoke ? 2 : s.jobs)) return rc;
        std::vector<std::string> targets = built_targets(paths);
        if (!s.kernel.empty()) {
            if (s.smoke || s.mutants) {
                std::cerr << "attn fuzz: --kernel runs timed fuzzing; --smoke and --mutants are about the library\n";
                return 2;
            }
            paths.kernel = fs::absolute(s.kernel);
            // Load it once here: a file that is no kernel is refused before any fuzzing (exit 2, the rule named).
            const auto [rc, name] = capture("cd " + quote(paths.fuzz_build) + " && ATTN_FUZZ_KERNEL=" + quote(paths.kernel) +
                                            " ATTN_FUZZ_PRINT_KERNEL=1 " + quote(paths.fuzzer("sdpa")) + " -runs=0");
            const std::string prefix = "attn fuzz kernel: ";
            const auto at = name.find(prefix);
            if (rc != 0 || at == std::string::npos) {
                std::cerr << "attn fuzz: " << s.kernel << " cannot be fuzzed:\n" << name;
                return 2;
            }
            const std::string kernel_name = name.substr(at + prefix.size(), name.find('\n', at) - at - prefix.size());
            paths.kernel_dir = fs::absolute(fs::path(s.cases_dir) / kernel_name);
            std::cout << "attn fuzz: kernel " << kernel_name << " (" << paths.kernel.string() << "), results in "
                      << paths.kernel_dir.string() << "\n";
            // Only the targets that run a registered implementation take a kernel.
            std::erase_if(targets, [](const std::string& t) { return t != "sdpa" && t != "backends"; });
        }
        if (s.target != "all") {
            if (std::find(targets.begin(), targets.end(), s.target) == targets.end()) {
                std::cerr << "attn fuzz: no target '" << s.target << "'; built targets:";
                for (const auto& t : targets) std::cerr << " " << t;
                std::cerr << "\n";
                return 2;
            }
            targets = {s.target};
        }
        if (s.smoke) return smoke(paths, targets, s.smoke_runs, s.smoke_cap_seconds);
        if (s.mutants) return mutant_table(paths, targets, s.mutant_seconds);
        if (s.merge_corpus) {
            if (!paths.kernel.empty()) {
                std::cerr << "attn fuzz: --merge-corpus merges attn's own corpus; a kernel's stays in its directory\n";
                return 2;
            }
            return merge_corpus(paths, targets);
        }
        std::vector<TargetReport> reports;
        for (const std::string& target : targets) reports.push_back(fuzz_target(paths, target, s));
        std::cout << "\nattn fuzz summary (" << s.jobs << " worker(s) per target, fingerprint "
                  << numerics_fingerprint().id() << ")\n";
        std::printf("  %-16s %8s %10s %8s %7s %7s %7s %s\n", "target", "seconds", "execs", "execs/s", "cov", "ft",
                    "corpus", "findings");
        std::size_t findings = 0;
        nlohmann::json rows = nlohmann::json::array();
        for (const TargetReport& r : reports) {
            std::printf("  %-16s %8.0f %10.0f %8.0f %7.0f %7.0f %7.0f %zu\n", r.target.c_str(), r.seconds, r.execs,
                        r.execs_per_second, r.coverage, r.features, r.corpus_files, r.findings.size());
            findings += r.findings.size();
            const auto count = [](double x) { return static_cast<long long>(x); };  // -1: libFuzzer did not say
            rows.push_back({{"target", r.target}, {"seconds", r.seconds}, {"execs", count(r.execs)},
                            {"execs_per_second", count(r.execs_per_second)}, {"coverage", count(r.coverage)},
                            {"features", count(r.features)}, {"corpus_files", count(r.corpus_files)},
                            {"findings", r.findings.size()}});
        }
        // The figures of this run, where the accuracy report looks for them (its Fuzzing section).
        const nlohmann::json summary = {{"schema", "attn-fuzz/1"}, {"date", utc_now("%Y-%m-%dT%H:%M:%SZ")},
                                        {"fingerprint", numerics_fingerprint().id()}, {"jobs", s.jobs},
                                        {"targets", rows}};
        fs::create_directories(paths.figures().parent_path());
        std::ofstream(paths.figures()) << summary.dump(2) << "\n";
        std::cout << "attn fuzz: figures written to " << paths.figures().string() << "\n";
        return findings == 0 ? 0 : 1;
    };
}

}  // namespace attn::cli
