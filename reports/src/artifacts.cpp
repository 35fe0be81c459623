// Rendering other commands' JSON files (attn mutants, attn fuzz, attn bench) into report sections.
#include "artifacts.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace attn::report {

namespace fs = std::filesystem;

std::optional<std::string> find_artifact(const std::vector<std::string>& dirs, const std::string& name) {
    for (const std::string& dir : dirs) {
        const fs::path p = fs::path(dir) / name;
        std::error_code ec;
        if (fs::is_regular_file(p, ec)) return p.string();
    }
    return std::nullopt;
}

namespace {

std::string cell(const nlohmann::json& j) {
    if (j.is_null()) return "-";
    if (j.is_string()) return j.get<std::string>();
    if (j.is_boolean()) return j.get<bool>() ? "yes" : "no";
    if (j.is_number_integer()) return std::to_string(j.get<long long>());
    if (j.is_number()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.4g", j.get<double>());
        return buf;
    }
    return j.dump();
}

// Google Benchmark's JSON: {"context": {...}, "benchmarks": [{name, real_time, time_unit, <counters>...}]}.
void append_benchmarks(Section& section, const nlohmann::json& doc) {
    static const char* standard[] = {"name", "family_index", "per_family_instance_index", "run_name", "run_type",
                                     "repetitions", "repetition_index", "threads", "iterations", "real_time",
                                     "cpu_time", "time_unit", "aggregate_name", "aggregate_unit", "label"};
    const auto& benchmarks = doc.at("benchmarks");
    std::vector<std::string> counters;
    for (const auto& b : benchmarks)
        for (auto it = b.begin(); it != b.end(); ++it)
            if (std::find(std::begin(standard), std::end(standard), it.key()) == std::end(standard) &&
                std::find(counters.begin(), counters.end(), it.key()) == counters.end())
                counters.push_back(it.key());
    if (doc.contains("context")) {
        const auto& c = doc.at("context");
        std::string line = "Machine:";
        for (const char* key : {"host_name", "num_cpus", "mhz_per_cpu", "library_build_type", "date"})
            if (c.contains(key)) line += std::string(" ") + key + "=" + cell(c.at(key));
        section.paragraph(line);
    }
    Table t;
    t.header = {"benchmark", "real time", "cpu time"};
    for (const auto& c : counters) t.header.push_back(c);
    for (const auto& b : benchmarks) {
        const std::string unit = b.value("time_unit", "");
        std::vector<std::string> row = {b.value("name", "?"), cell(b.value("real_time", nlohmann::json())) + " " + unit,
                                        cell(b.value("cpu_time", nlohmann::json())) + " " + unit};
        for (const auto& c : counters) row.push_back(b.contains(c) ? cell(b.at(c)) : "-");
        t.rows.push_back(std::move(row));
    }
    section.table(std::move(t));
}

bool is_table(const nlohmann::json& j) {
    return j.is_array() && !j.empty() && std::all_of(j.begin(), j.end(), [](const auto& e) { return e.is_object(); });
}

void append_table(Section& section, const nlohmann::json& items) {
    Table t;
    for (const auto& item : items)
        for (auto it = item.begin(); it != item.end(); ++it)
            if (std::find(t.header.begin(), t.header.end(), it.key()) == t.header.end()) t.header.push_back(it.key());
    for (const auto& item : items) {
        std::vector<std::string> row;
        for (const auto& key : t.header) row.push_back(item.contains(key) ? cell(item.at(key)) : "-");
        t.rows.push_back(std::move(row));
    }
    section.table(std::move(t));
}

}  // namespace

void append_artifact(Section& section, const std::string& path) {
    std::ifstream in(path);
    nlohmann::json doc;
    try {
        in >> doc;
    } catch (const nlohmann::json::exception& e) {
        section.paragraph("`" + path + "` is not valid JSON (" + e.what() + "); nothing shown from it.");
        return;
    }
    section.paragraph("From `" + fs::path(path).filename().string() + "`.");
    // Benchmarks record the numerics fingerprint they ran on (bench/attention_bench.cpp): figures from another
    // machine than this report's must be visibly so.
    if (doc.is_object() && doc.contains("context") && doc["context"].is_object() &&
        doc["context"].contains("attn_fingerprint"))
        section.paragraph("Measured on numerics fingerprint `" + cell(doc["context"]["attn_fingerprint"]) + "`.");
    if (doc.is_object() && doc.contains("benchmarks") && doc.at("benchmarks").is_array()) {
        append_benchmarks(section, doc);
        return;
    }
    if (is_table(doc)) {
        append_table(section, doc);
        return;
    }
    if (doc.is_object()) {
        std::string scalars;
        bool tabled = false;
        for (auto it = doc.begin(); it != doc.end(); ++it) {
            if (is_table(it.value())) {
                section.paragraph("**" + it.key() + "**");
                append_table(section, it.value());
                tabled = true;
            } else if (!it.value().is_structured()) {
                scalars += (scalars.empty() ? "" : ", ") + it.key() + ": " + cell(it.value());
            }
        }
        if (!scalars.empty()) section.paragraph(scalars);
        if (tabled) return;
    }
    section.code(doc.dump(2));
}

namespace {

std::vector<std::string> split_pipe_row(const std::string& line) {
    std::vector<std::string> cells;
    std::string cell;
    for (std::size_t i = 1; i < line.size(); ++i) {  // line[0] is the leading '|'
        if (line[i] == '|' && line[i - 1] != '\\') {
            const auto b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
            cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
            cell.clear();
        } else if (!(line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|')) {  // "\|" is a literal '|'
            cell += line[i];
        }
    }
    return cells;
}

bool is_separator(const std::vector<std::string>& cells) {
    return !cells.empty() && std::all_of(cells.begin(), cells.end(), [](const std::string& c) {
        return !c.empty() && c.find_first_not_of("-: ") == std::string::npos;
    });
}

}  // namespace

void append_markdown_artifact(Section& section, const std::string& path) {
    std::ifstream in(path);
    section.paragraph("From `" + fs::path(path).filename().string() + "`.");
    Table table;
    const auto flush = [&] {
        if (!table.header.empty()) section.table(std::move(table));
        table = Table{};
    };
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty() && line[0] == '|') {
            auto cells = split_pipe_row(line);
            if (table.header.empty()) table.header = std::move(cells);
            else if (!is_separator(cells)) table.rows.push_back(std::move(cells));
            continue;
        }
        flush();
        const auto start = line.find_first_not_of("# ");
        if (start != std::string::npos) section.paragraph(line.substr(start));
    }
    flush();
}

}  // namespace attn::report
