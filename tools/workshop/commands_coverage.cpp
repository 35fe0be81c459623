// `attn coverage`: what the property suite alone reaches of lib/src and oracle/src, then what the fuzz corpus
// replays add, measured with g++ --coverage (preset `coverage`, build/coverage) and gcovr. Writes
// reports/coverage/index.html (per-file pages), summary.md and summary.json (suite/README.md, "Coverage").
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"

namespace attn::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The folders measured, relative to the source directory.
const std::vector<std::string> measured_folders = {"lib/src/", "oracle/src/"};

// gcovr's branch exclusions (suite/README.md, "Coverage", says why each is sound).
const std::vector<std::string> gcovr_exclusions = {"--exclude-throw-branches", "--exclude-unreachable-branches"};

// The gcov gcovr runs: gcov itself, whose text output tools/workshop/gcov_throw_marks.py gives the `(throw)` marks of the
// exception edges in code that never ran (gcovr 5.2 reads the text, where gcov leaves them out; its JSON has them).
std::string gcov_executable(const fs::path& source) {
    return "/usr/bin/python3 " + (source / "tools" / "workshop" / "gcov_throw_marks.py").string();
}

// The two runs: the property suite alone (ctest label `properties`), then the fuzz corpus replays on top (label
// `fuzz`, without the clang smoke run, which builds and runs another build, and without the valgrind replay, which
// replays inputs fuzz_replay_mha already replays).
struct Snapshot {
    std::string name, title, ctest_selection;
};
const std::vector<Snapshot> snapshots = {
    {"properties", "properties alone", "-L properties"},
    {"properties+fuzz", "properties + fuzz replay", "-L fuzz -LE fuzz-smoke -E valgrind"},
};

// Deletes every .gcda file below `dir`: the counters start from zero.
int zero_counters(const fs::path& dir) {
    int removed = 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir))
        if (entry.is_regular_file() && entry.path().extension() == ".gcda") removed += fs::remove(entry.path());
    return removed;
}

// One gcovr pass over the counters so far: its JSON tracefile (per line) and JSON summary (per file), and with
// `html` the HTML report with a page per file.
int gcovr(const fs::path& source, const fs::path& build, const fs::path& raw_dir, const std::string& name,
          const fs::path& html) {
    std::string command = "cd " + quote(source) + " && gcovr -j " + jobs() + " --root .";
    for (const std::string& folder : measured_folders) command += " --filter '" + folder + "'";
    for (const std::string& option : gcovr_exclusions) command += " " + option;
    command += " --gcov-executable " + quote(gcov_executable(source));
    command += " --json " + quote(raw_dir / (name + ".json")) + " --json-summary " + quote(raw_dir / (name + ".summary.json"));
    if (!html.empty()) command += " --html-details " + quote(html) + " --html-title 'attn coverage: properties + fuzz replay'";
    // Only the objects of the measured folders carry counters for their lines (their headers are private).
    command += " " + quote(build / "lib") + " " + quote(build / "oracle");
    return run(command + " > /dev/null");
}

json read_json(const fs::path& p) {
    std::ifstream in(p);
    return json::parse(in);
}

// "3-5, 9" from sorted line numbers.
std::string line_ranges(const std::vector<int>& lines) {
    std::string s;
    for (std::size_t i = 0; i < lines.size();) {
        std::size_t j = i;
        while (j + 1 < lines.size() && lines[j + 1] == lines[j] + 1) ++j;
        s += (s.empty() ? "" : ", ") + std::to_string(lines[i]) + (j > i ? "-" + std::to_string(lines[j]) : "");
        i = j + 1;
    }
    return s;
}

// Per file: lines and branches covered / total (gcovr's summary) and the code lines never executed (its tracefile).
json snapshot_files(const fs::path& raw_dir, const std::string& name) {
    std::map<std::string, std::vector<int>> missed;
    const json tracefile = read_json(raw_dir / (name + ".json")), summary = read_json(raw_dir / (name + ".summary.json"));
    for (const json& f : tracefile.at("files")) {
        std::vector<int>& lines = missed[f.at("file").get<std::string>()];
        for (const json& l : f.at("lines"))
            if (!l.value("gcovr/noncode", false) && !l.value("gcovr/excluded", false) && l.value("count", 0) == 0) lines.push_back(l.at("line_number").get<int>());
    }
    json files = json::array();
    for (const json& f : summary.at("files")) {
        const std::string file = f.at("filename").get<std::string>();
        files.push_back({{"file", file},
                         {"lines_covered", f.at("line_covered")},
                         {"lines_total", f.at("line_total")},
                         {"branches_covered", f.at("branch_covered")},
                         {"branches_total", f.at("branch_total")},
                         {"missed_lines", line_ranges(missed[file])}});
    }
    return files;
}

std::string ratio(const json& f, const std::string& what) {
    const long covered = f.at(what + "_covered").get<long>(), total = f.at(what + "_total").get<long>();
    return std::to_string(covered) + "/" + std::to_string(total) +
           (total > 0 ? " (" + fixed(100.0 * static_cast<double>(covered) / static_cast<double>(total), 1) + "%)" : "");
}

// Totals of one folder in one snapshot, as a file entry named after the folder.
json folder_total(const json& files, const std::string& folder) {
    json t = {{"file", folder + " (all)"}, {"lines_covered", 0}, {"lines_total", 0}, {"branches_covered", 0},
              {"branches_total", 0}};
    for (const json& f : files)
        if (f.at("file").get<std::string>().rfind(folder, 0) == 0)
            for (const char* key : {"lines_covered", "lines_total", "branches_covered", "branches_total"})
                t[key] = t[key].get<long>() + f.at(key).get<long>();
    return t;
}

std::string summary_markdown(const json& summary) {
    std::ostringstream o;
    const json& by_name = summary.at("snapshots");
    o << "# Coverage of lib/src and oracle/src\n\n"
      << "Written by `attn coverage` (g++ `--coverage -O0`, preset `coverage`; gcovr " << summary.at("gcovr_version").get<std::string>()
      << " with `" << summary.at("gcovr_exclusions")[0].get<std::string>() << "` and `"
      << summary.at("gcovr_exclusions")[1].get<std::string>() << "`, through `tools/workshop/gcov_throw_marks.py`, which "
      << "marks the exception edges of code that never ran as gcov's JSON does; suite/README.md says why). Lines and branches "
      << "covered / total, by the property suite alone (`ctest -L properties`) and with the fuzz corpus replays "
      << "(`ctest -L fuzz`) added. The HTML report with a page per file is `reports/coverage/index.html`.\n\n"
      << "| file | lines, properties alone | branches, properties alone | lines, + fuzz replay | branches, + fuzz replay |\n"
      << "|---|---|---|---|---|\n";
    const json& alone = by_name.at("properties").at("files");
    const json& both = by_name.at("properties+fuzz").at("files");
    const auto row = [&](const json& a, const json& b) {
        o << "| " << a.at("file").get<std::string>() << " | " << ratio(a, "lines") << " | " << ratio(a, "branches")
          << " | " << ratio(b, "lines") << " | " << ratio(b, "branches") << " |\n";
    };
    for (const std::string& folder : measured_folders) {
        for (const json& a : alone) {
            const std::string file = a.at("file").get<std::string>();
            if (file.rfind(folder, 0) != 0) continue;
            for (const json& b : both)
                if (b.at("file") == file) row(a, b);
        }
        row(folder_total(alone, folder), folder_total(both, folder));
    }
    o << "\nLines the property suite alone never executes (the reason for each line of lib/src is in suite/README.md, "
         "\"Coverage\"):\n\n";
    for (const json& f : alone)
        if (!f.at("missed_lines").get<std::string>().empty())
            o << "- `" << f.at("file").get<std::string>() << "`: " << f.at("missed_lines").get<std::string>() << "\n";
    const json& s = summary.at("seconds");
    o << "\nMeasured: " << fixed(s.at("total").get<double>(), 0) << " s in all (build " << fixed(s.at("build").get<double>(), 0)
      << " s, properties " << fixed(s.at("properties").get<double>(), 0) << " s, fuzz replay "
      << fixed(s.at("fuzz_replay").get<double>(), 0) << " s, gcovr " << fixed(s.at("gcovr").get<double>(), 0) << " s) on "
      << summary.at("cores").get<int>() << " cores.\n";
    return o.str();
}

}  // namespace

Action add_coverage_command(CLI::App& app) {
    static std::string out_dir;
    auto* coverage = app.add_subcommand(
        "coverage", "Line and branch coverage of lib/src and oracle/src by the property suite alone, then with the fuzz "
                    "replays (build/coverage, gcovr; writes reports/coverage/)");
    coverage->add_option("--out", out_dir, "Directory for index.html, summary.md, summary.json (default: reports/coverage)");
    return [coverage]() -> int {
        if (!coverage->parsed()) return not_mine;
        const auto t_start = std::chrono::steady_clock::now();
        const fs::path source = ATTN_SOURCE_DIR, build = source / "build" / "coverage";
        const fs::path out = out_dir.empty() ? source / "reports" / "coverage" : fs::path(out_dir);
        const fs::path raw = build / "gcovr";
        if (run("command -v gcovr > /dev/null 2>&1") != 0) {
            std::cerr << "attn coverage: gcovr is not installed (apt-get install gcovr; it is in deps/debian.txt)\n";
            return 2;
        }
        json summary;
        summary["gcovr_exclusions"] = gcovr_exclusions;
        summary["cores"] = std::stoi(jobs());

        // 1. Configure and build the coverage preset (incremental).
        std::cout << "== attn coverage: building the coverage preset into " << build.string() << "\n";
        auto t0 = std::chrono::steady_clock::now();
        const std::string cd = "cd " + quote(source) + " && ";
        if (run(cd + "cmake --preset coverage > /dev/null") != 0 || run(cd + "cmake --build --preset coverage -j " + jobs()) != 0) {
            std::cerr << "attn coverage: the coverage build failed\n";
            return 2;
        }
        summary["seconds"]["build"] = seconds_since(t0);
        fs::remove_all(raw);
        fs::create_directories(raw);
        fs::create_directories(out);
        const int removed = zero_counters(build);
        std::cout << "== attn coverage: counters zeroed (" << removed << " .gcda files removed)\n";

        // 2. The property suite alone, a snapshot; 3. the fuzz replays on top, a cumulative snapshot and the HTML.
        int failed = 0;
        double gcovr_seconds = 0;
        for (std::size_t i = 0; i < snapshots.size(); ++i) {
            const Snapshot& s = snapshots[i];
            std::cout << "== attn coverage: ctest " << s.ctest_selection << "\n";
            t0 = std::chrono::steady_clock::now();
            const int code = run("ctest --test-dir " + quote(build) + " --output-on-failure -j " + jobs() + " " + s.ctest_selection);
            summary["seconds"][i == 0 ? "properties" : "fuzz_replay"] = seconds_since(t0);
            if (code != 0) {
                std::cerr << "attn coverage: ctest " << s.ctest_selection << " failed in the coverage build\n";
                ++failed;
            }
            t0 = std::chrono::steady_clock::now();
            const bool last = i + 1 == snapshots.size();
            if (gcovr(source, build, raw, s.name, last ? out / "index.html" : fs::path()) != 0) {
                std::cerr << "attn coverage: gcovr failed\n";
                return 2;
            }
            gcovr_seconds += seconds_since(t0);
            summary["snapshots"][s.name] = {{"title", s.title}, {"ctest", s.ctest_selection}, {"files", snapshot_files(raw, s.name)}};
        }
        summary["seconds"]["gcovr"] = gcovr_seconds;
        summary["seconds"]["total"] = seconds_since(t_start);
        summary["gcovr_version"] = [] {
            FILE* pipe = popen("gcovr --version 2>/dev/null", "r");
            char line[128] = "";
            if (pipe && std::fgets(line, sizeof line, pipe)) {
                std::string v = line;
                v = v.substr(v.find(' ') + 1);
                pclose(pipe);
                return v.substr(0, v.find_first_of(" \n"));
            }
            if (pipe) pclose(pipe);
            return std::string("?");
        }();

        std::ofstream(out / "summary.json") << summary.dump(2) << "\n";
        const std::string md = summary_markdown(summary);
        std::ofstream(out / "summary.md") << md;
        std::cout << "\n" << md << "\nattn coverage: wrote " << (out / "index.html").string() << ", "
                  << (out / "summary.md").string() << ", " << (out / "summary.json").string() << "\n";
        return failed == 0 ? 0 : 1;
    };
}

}  // namespace attn::cli
