// `attn mutate`: the property suite against small automatic changes to the library's own source (lib/src), one at
// a time, in a scratch copy of the sources (build/mutate/src, built with the `mutate` preset). Each mutant is
// written into the copy, the property test program is rebuilt (only the changed file recompiles), and the suite's
// runs go one after another until one fails (the mutant is killed) or all pass (it survives). Survivors that
// suite/equivalent_mutants.txt shows to be equivalent leave the score's denominator. Writes reports/mutation/
// summary.md and summary.json (suite/README.md, "Source mutation").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "mutate.hpp"

namespace attn::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using mutate::Mutant;

// The folder mutated, relative to the source directory.
const std::string mutated_folder = "lib/src";
// The list of survivors shown equivalent, with the reason for each.
const std::string equivalents_file = "suite/equivalent_mutants.txt";

// One run of the property test program: the suite against one implementation, or the regression replay.
struct Stage {
    std::string name, environment, arguments;
};
const std::vector<Stage> stages = {
    {"reference", "ATTN_SUITE_IMPL=reference", "'[suite]' --order decl"},
    {"tiled", "ATTN_SUITE_IMPL=tiled", "'[suite]' --order decl"},
    {"tiled_small_blocks", "ATTN_SUITE_IMPL=tiled_small_blocks", "'[suite]' --order decl"},
    {"mha", "ATTN_SUITE_IMPL=mha", "'[suite]' --order decl"},
    {"tiled_scalar", "ATTN_SUITE_IMPL=tiled ATTN_SIMD_TARGET=SCALAR", "'[suite]' --order decl"},
    // BLIS's sandybridge micro-kernels: query panels narrower than the lanes (suite/CMakeLists.txt says why).
    {"tiled_blis_sandybridge", "ATTN_SUITE_IMPL=tiled BLIS_ARCH_TYPE=4", "'[suite]' --order decl"},
    {"replay", "", "'[replay]'"},
};

// The stages in the order most likely to kill a mutant of `file` first (all of them run on a survivor).
std::vector<const Stage*> stage_order(const std::string& file) {
    std::vector<std::string> first;
    if (file.find("mha") != std::string::npos) first = {"mha"};
    else if (file.find("tiled") != std::string::npos) first = {"tiled_small_blocks", "tiled"};
    else if (file.find("machine") != std::string::npos) first = {"tiled_scalar"};
    std::vector<const Stage*> order;
    for (const std::string& name : first)
        for (const Stage& s : stages)
            if (s.name == name) order.push_back(&s);
    for (const Stage& s : stages)
        if (std::find(order.begin(), order.end(), &s) == order.end()) order.push_back(&s);
    return order;
}

// Writes `text` to `p` (a fresh modification time, so the build sees the change).
void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// Copies the source tree into `dst`, leaving out build/ and .git/, writing only files whose contents differ (the
// scratch build stays incremental between runs).
int sync_tree(const fs::path& src, const fs::path& dst) {
    int written = 0;
    for (auto it = fs::recursive_directory_iterator(src); it != fs::recursive_directory_iterator(); ++it) {
        const fs::path rel = fs::relative(it->path(), src);
        if (it.depth() == 0 && (rel == "build" || rel == ".git")) {
            it.disable_recursion_pending();
            continue;
        }
        if (it->is_directory()) {
            fs::create_directories(dst / rel);
        } else if (it->is_regular_file()) {
            const std::string text = read_text(it->path());
            if (!fs::exists(dst / rel) || read_text(dst / rel) != text) {
                write_file(dst / rel, text);
                fs::permissions(dst / rel, fs::status(it->path()).permissions());
                ++written;
            }
        }
    }
    return written;
}

// The files below `dir`, relative to it.
std::set<std::string> files_below(const fs::path& dir) {
    std::set<std::string> out;
    if (fs::exists(dir))
        for (const auto& e : fs::recursive_directory_iterator(dir))
            if (e.is_regular_file()) out.insert(fs::relative(e.path(), dir).string());
    return out;
}

// The property that failed, from the suite's table in a log ("<property> <impl> <dtype> FAIL ..."), else the test
// case Catch2 names after its first rule of dashes (the replay and other test cases).
std::string failing_property(const std::string& log) {
    std::istringstream in(log);
    std::string line, test_case;
    while (std::getline(in, line)) {
        std::istringstream words(line);
        std::string name, impl, dtype, verdict;
        if (words >> name >> impl >> dtype >> verdict && verdict == "FAIL") return name + " (" + dtype + ")";
        if (test_case.empty() && line.size() > 20 && line.find_first_not_of('-') == std::string::npos && std::getline(in, line))
            test_case = line;
    }
    return test_case;
}

// The failing tests ctest lists at the end of a log ("The following tests FAILED:" then "  N - name (Failed)").
std::string failing_ctest(const std::string& log) {
    const auto at = log.find("The following tests FAILED:");
    if (at == std::string::npos) return "the build or ctest failed";
    std::istringstream in(log.substr(at));
    std::string line, names;
    std::getline(in, line);
    while (std::getline(in, line)) {
        const auto dash = line.find(" - ");
        if (dash == std::string::npos) break;
        names += (names.empty() ? "" : ", ") + line.substr(dash + 3);
    }
    return names;
}

// " target..." for every program ctest runs under the label `unit` in `build`, read from ctest's own listing: the
// command's program once built, else the test's name (a test is named after its target, or after it plus
// "_simd_<TARGET>", attn_add_simd_tests) where that names a target of the build (ninja's phony targets).
std::string unit_test_targets(const fs::path& build, const fs::path& logs) {
    const fs::path listing = logs / "unit-tests.json", phony = logs / "targets.txt";
    if (run("ctest --test-dir " + quote(build) + " -L unit --show-only=json-v1 > " + quote(listing) + " 2> /dev/null") != 0 ||
        run("ninja -C " + quote(build) + " -t targets all > " + quote(phony) + " 2> /dev/null") != 0)
        return "";
    std::set<std::string> known;
    {
        std::istringstream in(read_text(phony));
        for (std::string line; std::getline(in, line);)
            if (const auto at = line.find(": phony"); at != std::string::npos) known.insert(line.substr(0, at));
    }
    std::set<std::string> targets;
    std::ifstream in(listing);
    const json tests = json::parse(in);
    for (const json& t : tests.at("tests")) {
        if (t.contains("command") && !t.at("command").empty() && !t.at("command")[0].get<std::string>().empty()) {
            targets.insert(fs::path(t.at("command")[0].get<std::string>()).filename().string());
            continue;
        }
        std::string name = t.at("name").get<std::string>();
        if (const auto at = name.find("_simd_"); at != std::string::npos) name = name.substr(0, at);
        if (known.count(name)) targets.insert(name);
    }
    std::string out;
    for (const std::string& t : targets) out += " " + t;
    return out;
}

// suite/equivalent_mutants.txt: "<id> <what and why>" per line, '#' comments.
std::map<std::string, std::string> read_equivalents(const fs::path& p) {
    std::map<std::string, std::string> out;
    std::istringstream in(read_text(p));
    for (std::string line; std::getline(in, line);) {
        const auto b = line.find_first_not_of(" \t");
        if (b == std::string::npos || line[b] == '#') continue;
        const auto e = line.find_first_of(" \t", b);
        const std::string id = line.substr(b, e - b);
        const auto r = e == std::string::npos ? std::string::npos : line.find_first_not_of(" \t", e);
        out[id] = r == std::string::npos ? "" : line.substr(r);
    }
    return out;
}

// One scratch copy of the sources with its build, and the commands that build and test it.
struct Worker {
    fs::path copy, build_dir, program;
    std::string cd;                         // "cd <copy> && "
    std::string build, unit_build, unit_run;  // run after cd
    std::set<std::string> cases_before;  // the files of its regressions/ before any mutant ran
};

// Runs mutant `m` in worker `k`'s copy: write it, build, the property suite's runs in turn, the unit tests on a
// survivor; then the original back. The result as the summary's JSON entry.
json run_mutant(Worker& k, const Mutant& m, const std::string& text, const std::map<std::string, double>& limit,
                const std::map<std::string, std::string>& equivalents, const fs::path& logs) {
    const auto t0 = std::chrono::steady_clock::now();
    const fs::path target = k.copy / m.file;
    write_file(target, mutate::apply(text, m));
    json r = {{"id", m.id}, {"file", m.file}, {"line", m.line}, {"op", m.op}, {"change", mutate::describe(m)}};
    std::string status, detail;
    std::vector<std::string> stages_run;
    if (run(k.cd + "timeout 900 " + k.build + " > " + quote(logs / (m.id + ".txt")) + " 2>&1") != 0) {
        status = "stillborn";
    } else {
        status = "survived";
        for (const Stage* s : stage_order(m.file)) {
            stages_run.push_back(s->name);
            const fs::path log = logs / (m.id + "-" + s->name + ".txt");
            const int code = run(k.cd + "timeout -k 5 " + fixed(limit.at(s->name), 0) + " env OMP_WAIT_POLICY=PASSIVE " +
                                 s->environment + " " + quote(k.program) + " " + s->arguments + " --abort > " + quote(log) + " 2>&1");
            if (code == 0) continue;
            status = "killed";
            const std::string property = failing_property(read_text(log));
            detail = s->name + ": " + (code == 124 || code == 137 ? "timed out"
                                       : code > 128              ? "crashed (signal " + std::to_string(code - 128) + ")"
                                       : property.empty()        ? "failed (exit " + std::to_string(code) + ")"
                                                                 : property);
            break;
        }
        if (status == "survived") {
            // The unit tests, on the property suite's survivors (also on those listed as equivalent: a kill there
            // proves the entry wrong).
            stages_run.push_back("unit tests");
            const fs::path log = logs / (m.id + "-unit.txt");
            const int code = run(k.cd + "timeout 900 " + k.unit_build + " > " + quote(log) + " 2>&1") != 0
                                 ? 1
                                 : run("env OMP_WAIT_POLICY=PASSIVE timeout -k 5 " + fixed(limit.at("unit"), 0) + " " + k.unit_run +
                                       " >> " + quote(log) + " 2>&1");
            if (code != 0) {
                status = "unit";
                detail = "unit tests: " + failing_ctest(read_text(log));
                if (equivalents.count(m.id)) detail += "; listed in " + equivalents_file + " as equivalent, wrongly";
            } else if (equivalents.count(m.id)) {
                status = "equivalent";
                r["reason"] = equivalents.at(m.id);
            }
        }
    }
    // Back to the original, and no case files left from this mutant's failures.
    write_file(target, text);
    for (const std::string& f : files_below(k.copy / "regressions"))
        if (!k.cases_before.count(f)) fs::remove(k.copy / "regressions" / f);
    r["status"] = status;
    r["killed_by"] = detail;
    std::string names;
    for (const std::string& n : stages_run) names += (names.empty() ? "" : ", ") + n;
    r["stages_run"] = names;
    r["seconds"] = seconds_since(t0);
    return r;
}

std::string summary_markdown(const json& s) {
    std::ostringstream o;
    const json& c = s.at("counts");
    const auto n = [](const json& j, const char* key) { return std::to_string(j.at(key).get<int>()); };
    o << "# Source mutation of " << mutated_folder << "\n\n"
      << "Written by `attn mutate` (`" << s.at("command").get<std::string>() << "`). Each mutant is one small change to "
      << "one file of " << mutated_folder << " (the operators are in suite/README.md, \"Source mutation\"), built in a "
      << "scratch copy. The property suite's runs (" << s.at("stages").get<std::string>() << ") go in turn until one "
      << "fails: the mutant is killed. On a survivor the unit tests (`ctest -L unit`) run too. A mutant that does not "
      << "compile is stillborn and not counted; a survivor listed in " << equivalents_file
      << " is equivalent (no input can tell it from the library) and leaves the denominator.\n\n"
      << "| mutants | killed by the properties | survived them, killed by the unit tests | survived both | equivalent | stillborn | score (properties) | score (properties + unit tests) |\n"
      << "|---|---|---|---|---|---|---|---|\n"
      << "| " << n(c, "run") << " | " << n(c, "killed") << " | " << n(c, "unit") << " | " << n(c, "survived") << " | "
      << n(c, "equivalent") << " | " << n(c, "stillborn") << " | " << fixed(s.at("score").get<double>(), 1) << "% | "
      << fixed(s.at("score_with_unit_tests").get<double>(), 1) << "% |\n\n"
      << "Score = killed / (killed + survived), equivalents left out; the second counts the unit tests' kills as "
         "killed.\n\n"
      << "| file | candidates | run | killed | unit tests | survived | equivalent | stillborn |\n"
      << "|---|---|---|---|---|---|---|---|\n";
    for (const json& f : s.at("files"))
        if (f.at("candidates").get<int>() > 0)
            o << "| " << f.at("file").get<std::string>() << " | " << n(f, "candidates") << " | " << n(f, "run") << " | "
              << n(f, "killed") << " | " << n(f, "unit") << " | " << n(f, "survived") << " | " << n(f, "equivalent") << " | "
              << n(f, "stillborn") << " |\n";
    const auto list = [&](const std::string& status, const std::string& title) {
        bool any = false;
        for (const json& m : s.at("mutants")) {
            if (m.at("status") != status) continue;
            if (!any) o << "\n" << title << ":\n\n";
            any = true;
            o << "- `" << m.at("id").get<std::string>() << "` " << m.at("file").get<std::string>() << ":" << m.at("line").get<int>()
              << " (" << m.at("op").get<std::string>() << ") " << m.at("change").get<std::string>();
            if (status == "survived") o << "; run: " << m.at("stages_run").get<std::string>();
            if (status == "unit") o << "; " << m.at("killed_by").get<std::string>();
            if (status == "equivalent") o << "; " << m.at("reason").get<std::string>();
            o << "\n";
        }
    };
    list("survived", "Survivors of the properties and the unit tests (each needs a new or stronger property, or an "
                     "entry in " + equivalents_file + ")");
    list("unit", "Survivors of the properties that the unit tests kill (a gap of the properties)");
    list("equivalent", "Equivalent (" + equivalents_file + ")");
    const json& t = s.at("seconds");
    o << "\nMeasured: " << fixed(t.at("total").get<double>(), 0) << " s in all (scratch build " << fixed(t.at("setup").get<double>(), 0)
      << " s, unmutated suite " << fixed(t.at("baseline").get<double>(), 0) << " s, mutants "
      << fixed(t.at("mutants").get<double>(), 0) << " s) on " << s.at("cores").get<int>() << " cores";
    if (s.contains("rerun_seconds"))
        o << "; then the last `--rerun-survivors` ran " << s.at("rerun_mutants").get<int>() << " survivors and equivalents again"
          << (s.value("rerun_new_mutants", 0) > 0
                  ? " (" + std::to_string(s.at("rerun_new_mutants").get<int>()) +
                        " of them new to the sample: their lines changed since the whole run; every other result is the "
                        "whole run's, for a line whose text is unchanged)"
                  : std::string())
          << " in " << fixed(s.at("rerun_seconds").at("total").get<double>(), 0) << " s";
    if (s.value("relabelled", false))
        o << "; the survivors then labelled again by the current " << equivalents_file << " (`--relabel`, no run)";
    o << ".\n";
    return o.str();
}

}  // namespace

Action add_mutate_command(CLI::App& app) {
    static std::size_t count = 160, min_per_file = 6, worker_count = 1;
    static double min_score = 95;
    static std::vector<std::string> only;
    static std::string file_filter, out_dir;
    static bool list = false, list_all = false, rerun = false, relabel = false;
    auto* cmd = app.add_subcommand(
        "mutate", "The property suite against automatic mutations of lib/src, one at a time in a scratch copy "
                  "(build/mutate); writes the mutation score and every survivor to reports/mutation/");
    cmd->add_option("--mutants", count, "How many mutants to run, sampled over every file of lib/src (default 160)");
    cmd->add_option("--min-per-file", min_per_file, "At least this many from each file (default 6)");
    cmd->add_option("--jobs", worker_count, "Mutants run at once, each in its own scratch copy (default 1)");
    cmd->add_option("--file", file_filter, "Only files whose path contains this");
    cmd->add_option("--only", only, "Only the mutants with these ids (repeatable)");
    cmd->add_option("--min-score", min_score, "Exit 1 when the score (percent) is below this (default 95)");
    cmd->add_option("--out", out_dir, "Directory for summary.md and summary.json (default: reports/mutation)");
    cmd->add_flag("--rerun-survivors", rerun,
                  "Run again only the mutants the last summary (in --out) lists as surviving the properties or as "
                  "equivalent, and the sampled mutants it does not have (their lines changed), keeping its other results: the "
                  "triage loop after a property or lib/src changed; with --only, just those of them");
    cmd->add_flag("--relabel", relabel,
                  "Run nothing: label the last summary's survivors (in --out) survived or equivalent by the current "
                  "equivalents list, after entries were added to it");
    cmd->add_flag("--list", list, "List the sampled mutants and stop");
    cmd->add_flag("--list-all", list_all, "List every candidate mutant and stop");
    return [cmd]() -> int {
        if (!cmd->parsed()) return not_mine;
        const auto t_start = std::chrono::steady_clock::now();
        const fs::path source = ATTN_SOURCE_DIR;
        const fs::path out = out_dir.empty() ? source / "reports" / "mutation" : fs::path(out_dir);

        // 1. The candidates and the sample.
        std::vector<Mutant> all;
        std::map<std::string, std::string> texts;
        std::vector<fs::path> files;
        for (const auto& e : fs::directory_iterator(source / mutated_folder))
            if (e.is_regular_file() && (e.path().extension() == ".cpp" || e.path().extension() == ".hpp")) files.push_back(e.path());
        std::sort(files.begin(), files.end());
        for (const fs::path& p : files) {
            const std::string rel = fs::relative(p, source).string();
            if (!file_filter.empty() && rel.find(file_filter) == std::string::npos) continue;
            texts[rel] = read_text(p);
            for (Mutant& m : mutate::find_mutants(rel, texts[rel])) all.push_back(std::move(m));
        }
        std::vector<Mutant> chosen;
        // With --rerun-survivors, --only picks which of the sample's open mutants run again; the summary stays the
        // whole sample's.
        if (!only.empty() && !rerun) {
            for (const Mutant& m : all)
                if (std::find(only.begin(), only.end(), m.id) != only.end()) chosen.push_back(m);
            for (const std::string& id : only)
                if (std::none_of(chosen.begin(), chosen.end(), [&](const Mutant& m) { return m.id == id; })) {
                    std::cerr << "attn mutate: no mutant has the id '" << id << "' (attn mutate --list-all lists them)\n";
                    return 2;
                }
        } else {
            chosen = mutate::sample(all, count, min_per_file);
        }
        if (list || list_all) {
            for (const Mutant& m : list_all ? all : chosen)
                std::cout << m.id << "  " << m.file << ":" << m.line << "  " << m.op << "  " << mutate::describe(m) << "\n";
            std::cout << (list_all ? all.size() : chosen.size()) << " mutants (" << all.size() << " candidates in "
                      << texts.size() << " files)\n";
            return 0;
        }
        const std::map<std::string, std::string> equivalents = read_equivalents(source / equivalents_file);

        // With --rerun-survivors: the last summary's results, which must be of this very sample.
        std::map<std::string, json> previous;
        json previous_summary;
        std::vector<Mutant> runlist = chosen;
        std::size_t rerun_new = 0;
        if (rerun && relabel) {
            std::cerr << "attn mutate: --rerun-survivors and --relabel exclude each other\n";
            return 2;
        }
        if (rerun || relabel) {
            const fs::path last = out / "summary.json";
            if (!fs::is_regular_file(last)) {
                std::cerr << "attn mutate: " << (rerun ? "--rerun-survivors" : "--relabel") << " needs the summary of a whole run in "
                          << last.string() << "\n";
                return 2;
            }
            std::ifstream in(last);
            previous_summary = json::parse(in);
            for (const json& r : previous_summary.at("mutants")) previous[r.at("id").get<std::string>()] = r;
            // A mutant's id hashes its line's text, so a sampled mutant that the last run did not have is on a line
            // that changed since (or the options differ): it runs too. Most of the sample must be the last run's,
            // or the carried results would describe another sample.
            std::size_t carried = 0;
            runlist.clear();
            for (const Mutant& m : chosen) {
                if (!previous.count(m.id)) {
                    runlist.push_back(m);
                    ++rerun_new;
                    continue;
                }
                ++carried;
                const std::string status = previous.at(m.id).at("status").get<std::string>();
                if ((status == "survived" || status == "unit" || status == "equivalent") &&
                    (only.empty() || std::find(only.begin(), only.end(), m.id) != only.end()))
                    runlist.push_back(m);
            }
            for (const std::string& id : only)
                if (std::none_of(runlist.begin(), runlist.end(), [&](const Mutant& m) { return m.id == id; })) {
                    std::cerr << "attn mutate: '" << id << "' is not an open mutant of the sample (a survivor, a unit "
                              << "tests' kill or an equivalent of " << last.string() << ")\n";
                    return 2;
                }
            if (relabel && rerun_new > 0) {
                std::cerr << "attn mutate: --relabel needs the sample of " << last.string() << " (" << rerun_new << " of its "
                          << chosen.size() << " mutants are new: lib/src changed); run --rerun-survivors\n";
                return 2;
            }
            if (relabel) runlist.clear();
            if (2 * carried < chosen.size()) {
                std::cerr << "attn mutate: the sample is not the one of " << last.string() << " (" << rerun_new << " of its "
                          << chosen.size() << " mutants are new: lib/src changed, or the options differ); run the whole sample\n";
                return 2;
            }
        }

        // 2. The scratch copies (one per worker), configured and built once (incremental between runs).
        const fs::path root = source / "build" / "mutate", logs = root / "logs";
        std::vector<json> fresh;
        double setup_seconds = 0, baseline_seconds = 0, mutant_seconds = 0;
        std::size_t workers = 0;
        if (!relabel) {
            fs::remove_all(logs);
            fs::create_directories(logs);
            workers = std::max<std::size_t>(1, std::min(worker_count, runlist.size()));
            // Each worker builds with one job when there are several: the workers are the parallelism.
            const std::string build_jobs = workers > 1 ? "1" : jobs();
            std::vector<Worker> ws(workers);
            std::cout << "== attn mutate: " << chosen.size() << " mutants of " << all.size() << " candidates in " << texts.size()
                      << " files; " << workers << " scratch cop" << (workers > 1 ? "ies" : "y") << " in " << root.string() << "\n";
            auto t0 = std::chrono::steady_clock::now();
            for (std::size_t w = 0; w < workers; ++w) {
                Worker& k = ws[w];
                k.copy = root / (w == 0 ? std::string("src") : "src-" + std::to_string(w));
                k.build_dir = k.copy / "build" / "mutate";
                k.program = k.build_dir / "suite" / "attn_properties_test";
                k.cd = "cd " + quote(k.copy) + " && ";
                fs::create_directories(k.copy);
                const int synced = sync_tree(source, k.copy);
                std::cout << "== attn mutate: " << k.copy.string() << ": " << synced << " files copied; building the mutate preset\n";
                const std::string all_jobs = " -j " + jobs();
                k.build = "cmake --build --preset mutate --target attn_properties_test -j " + build_jobs;
                const fs::path log = logs / ("build-" + std::to_string(w) + ".txt");
                if (run(k.cd + "cmake --preset mutate > " + quote(log) + " 2>&1") != 0 ||
                    run(k.cd + "cmake --build --preset mutate --target attn_properties_test" + all_jobs + " >> " + quote(log) + " 2>&1") != 0) {
                    std::cerr << "attn mutate: the scratch build of the unmutated sources failed; see " << log.string() << "\n";
                    return 2;
                }
                // The second tier: the unit tests (ctest -L unit), run on the property suite's survivors only, so that
                // the summary tells a gap of the properties that the unit tests cover from a gap of both.
                const std::string unit_targets = unit_test_targets(k.build_dir, logs);
                if (unit_targets.empty()) {
                    std::cerr << "attn mutate: the scratch build " << k.build_dir.string() << " has no tests labelled unit (is "
                              << "ATTN_BUILD_TESTS on in the preset mutate?)\n";
                    return 2;
                }
                k.unit_build = "cmake --build --preset mutate -j " + build_jobs + " --target" + unit_targets;
                k.unit_run = "ctest --test-dir " + quote(k.build_dir) + " -L unit -j " + build_jobs + " --stop-on-failure";
                if (run(k.cd + "cmake --build --preset mutate" + all_jobs + " --target" + unit_targets + " >> " + quote(log) + " 2>&1") != 0) {
                    std::cerr << "attn mutate: the scratch build of the unit tests failed; see " << log.string() << "\n";
                    return 2;
                }
                k.cases_before = files_below(k.copy / "regressions");
            }
            setup_seconds = seconds_since(t0);

            // 3. The unmutated suite must pass (in the first copy); its times set each run's limit.
            std::map<std::string, double> limit;
            t0 = std::chrono::steady_clock::now();
            for (const Stage& s : stages) {
                const auto ts = std::chrono::steady_clock::now();
                const fs::path log = logs / ("baseline-" + s.name + ".txt");
                const int code = run(ws[0].cd + "env OMP_WAIT_POLICY=PASSIVE " + s.environment + " " + quote(ws[0].program) + " " +
                                     s.arguments + " > " + quote(log) + " 2>&1");
                const double took = seconds_since(ts);
                std::cout << "== attn mutate: unmutated " << s.name << ": " << (code == 0 ? "passed" : "FAILED") << " in "
                          << fixed(took, 1) << " s\n";
                if (code != 0) {
                    std::cerr << "attn mutate: the property suite fails on the unmutated sources (" << s.name << "); see "
                              << log.string() << "\n";
                    return 2;
                }
                // Generous: the workers share the cores.
                limit[s.name] = 3 * static_cast<double>(workers) * took + 20;
            }
            {
                const auto ts = std::chrono::steady_clock::now();
                const int code = run("env OMP_WAIT_POLICY=PASSIVE " + ws[0].unit_run + " > " + quote(logs / "baseline-unit.txt") + " 2>&1");
                std::cout << "== attn mutate: unmutated unit tests: " << (code == 0 ? "passed" : "FAILED") << " in "
                          << fixed(seconds_since(ts), 1) << " s\n";
                if (code != 0) {
                    std::cerr << "attn mutate: the unit tests fail on the unmutated sources; see " << (logs / "baseline-unit.txt").string() << "\n";
                    return 2;
                }
                limit["unit"] = 3 * static_cast<double>(workers) * seconds_since(ts) + 30;
            }
            baseline_seconds = seconds_since(t0);

            // 4. The mutants: each worker takes the next one not yet taken.
            fresh.resize(runlist.size());
            std::mutex lock;
            std::size_t next = 0, done = 0;
            t0 = std::chrono::steady_clock::now();
            const auto work = [&](Worker& k) {
                for (;;) {
                    std::size_t i;
                    {
                        std::lock_guard<std::mutex> g(lock);
                        if (next == runlist.size()) return;
                        i = next++;
                    }
                    fresh[i] = run_mutant(k, runlist[i], texts.at(runlist[i].file), limit, equivalents, logs);
                    std::lock_guard<std::mutex> g(lock);
                    const json& r = fresh[i];
                    std::cout << "[" << ++done << "/" << runlist.size() << "] " << r.at("id").get<std::string>() << " "
                              << r.at("file").get<std::string>() << ":" << r.at("line").get<int>() << " " << r.at("op").get<std::string>()
                              << " " << r.at("change").get<std::string>() << ": " << r.at("status").get<std::string>()
                              << (r.at("killed_by").get<std::string>().empty() ? "" : " (" + r.at("killed_by").get<std::string>() + ")")
                              << " " << fixed(r.at("seconds").get<double>(), 0) << " s" << std::endl;
                }
            };
            std::vector<std::thread> threads;
            for (std::size_t w = 1; w < workers; ++w) threads.emplace_back(work, std::ref(ws[w]));
            work(ws[0]);
            for (std::thread& t : threads) t.join();
            // The scratch builds back to the unmutated sources.
            if (!runlist.empty())
                for (const Worker& k : ws) (void)run(k.cd + k.build + " > /dev/null 2>&1");
            mutant_seconds = seconds_since(t0);
        }
        // The results in the sample's order: this run's, and the last summary's for the mutants not run again.
        std::map<std::string, json> by_id;
        for (const json& r : fresh) by_id[r.at("id").get<std::string>()] = r;
        std::vector<json> results;
        for (const Mutant& m : chosen) results.push_back(by_id.count(m.id) ? by_id.at(m.id) : previous.at(m.id));
        // With --relabel: the survivors of the last run (of the properties and the unit tests) against the current list
        // of equivalents, which is all that tells "survived" from "equivalent" once a mutant has run.
        if (relabel)
            for (json& r : results) {
                const std::string id = r.at("id").get<std::string>(), status = r.at("status").get<std::string>();
                if (status == "survived" && equivalents.count(id)) {
                    r["status"] = "equivalent";
                    r["reason"] = equivalents.at(id);
                } else if (status == "equivalent" && !equivalents.count(id)) {
                    r["status"] = "survived";
                    r.erase("reason");
                }
            }
        std::map<std::string, json> per_file;
        for (const auto& [file, text] : texts)
            per_file[file] = {{"file", file}, {"candidates", 0}, {"run", 0}, {"killed", 0}, {"unit", 0}, {"survived", 0}, {"equivalent", 0}, {"stillborn", 0}};
        for (const Mutant& m : all) per_file[m.file]["candidates"] = per_file[m.file]["candidates"].get<int>() + 1;
        std::map<std::string, int> counts = {{"run", 0}, {"killed", 0}, {"unit", 0}, {"survived", 0}, {"equivalent", 0}, {"stillborn", 0}};
        for (const json& r : results) {
            const std::string status = r.at("status").get<std::string>();
            ++counts[status];
            ++counts["run"];
            json& f = per_file[r.at("file").get<std::string>()];
            f["run"] = f["run"].get<int>() + 1;
            f[status] = f[status].get<int>() + 1;
        }

        // 5. The summary.
        json s;
        s["command"] = "attn mutate --mutants " + std::to_string(count) + " --min-per-file " + std::to_string(min_per_file) +
                       (file_filter.empty() ? "" : " --file " + file_filter) + (only.empty() ? "" : " --only ...");
        s["stages"] = [] {
            std::string t;
            for (const Stage& st : stages) t += (t.empty() ? "" : ", ") + st.name;
            return t;
        }();
        s["counts"] = counts;
        // The score is the property suite's; the second one counts the unit tests' kills too.
        const int denominator = counts["killed"] + counts["unit"] + counts["survived"];
        s["score"] = denominator > 0 ? 100.0 * counts["killed"] / denominator : 100.0;
        s["score_with_unit_tests"] = denominator > 0 ? 100.0 * (counts["killed"] + counts["unit"]) / denominator : 100.0;
        s["files"] = json::array();
        for (const auto& [file, f] : per_file) s["files"].push_back(f);
        s["mutants"] = json(results);
        s["cores"] = std::stoi(jobs());
        s["workers"] = relabel ? previous_summary.at("workers") : json(workers);
        const json this_run = {{"setup", setup_seconds}, {"baseline", baseline_seconds}, {"mutants", mutant_seconds},
                               {"total", seconds_since(t_start)}};
        // A rerun keeps the whole run's times (the cost of the sample) and adds its own.
        s["seconds"] = rerun || relabel ? previous_summary.at("seconds") : this_run;
        if (relabel) {
            for (const char* key : {"rerun_seconds", "rerun_mutants", "rerun_new_mutants"})
                if (previous_summary.contains(key)) s[key] = previous_summary.at(key);
            s["relabelled"] = true;
        }
        if (rerun) {
            s["rerun_seconds"] = this_run;
            s["rerun_mutants"] = runlist.size();
            s["rerun_new_mutants"] = rerun_new;
        }
        // Entries of the equivalents list that no candidate has any more (the line changed): stale.
        std::vector<std::string> stale;
        for (const auto& [id, reason] : equivalents)
            if (std::none_of(all.begin(), all.end(), [&](const Mutant& m) { return m.id == id; })) stale.push_back(id);
        s["stale_equivalents"] = stale;
        fs::create_directories(out);
        std::ofstream(out / "summary.json") << s.dump(2) << "\n";
        const std::string md = summary_markdown(s);
        std::ofstream(out / "summary.md") << md;
        std::cout << "\n" << md << "\nattn mutate: wrote " << (out / "summary.md").string() << " and " << (out / "summary.json").string()
                  << "; logs in " << logs.string() << "\n";
        if (!stale.empty() && file_filter.empty())
            std::cout << "attn mutate: " << stale.size() << " entries of " << equivalents_file
                      << " name no current mutant (their lines changed): re-triage them\n";
        return s["score"].get<double>() + 1e-9 >= min_score ? 0 : 1;
    };
}

}  // namespace attn::cli
