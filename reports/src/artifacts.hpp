// reports/src/artifacts.hpp: the report sections fed by other commands' JSON files (mutant table, fuzzing,
// benchmarks), found by name in a list of directories.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "document.hpp"

namespace attn::report {

// The first dir/name that exists, if any.
std::optional<std::string> find_artifact(const std::vector<std::string>& dirs, const std::string& name);

// Appends the contents of a JSON artifact to `section`: Google Benchmark output as a benchmark table (name, time,
// user counters such as GFLOP/s and % of peak); an array of flat objects (or an object holding one) as a table
// with one column per key; anything else as pretty-printed JSON. A file that does not parse is said so.
void append_artifact(Section& section, const std::string& path);

// Appends a Markdown file another command wrote (e.g. the fuzzers' mutant_kills.md): its pipe tables as tables,
// its other lines as paragraphs (headings lose their #).
void append_markdown_artifact(Section& section, const std::string& path);

}  // namespace attn::report
