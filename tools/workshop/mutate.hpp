// Source mutants for `attn mutate` (commands_mutate.cpp): small changes to one C++ source file at a time, found by
// a lexer that sees only code (comments, string and character literals and preprocessor lines are never touched).
// suite/README.md, "Source mutation", lists the operators and what a score means.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attn::cli::mutate {

// One mutant: in `file`, the `length` characters at `offset` (on 1-based `line`) become `replacement`.
struct Mutant {
    std::string file;  // path relative to the source directory, e.g. "lib/src/mask.cpp"
    std::size_t offset = 0, length = 0;
    int line = 0;
    std::string op;           // the operator's name (operators() lists them)
    std::string original;     // the text replaced
    std::string replacement;  // the text put there
    // Stable name: a hash of the file, the operator, the whole (trimmed) source line and the change's place in it,
    // so editing other lines does not rename it (suite/equivalent_mutants.txt refers to mutants by it).
    std::string id;
};

// The operators, with a line each on what they do.
struct Operator {
    const char* name;
    const char* description;
};
const std::vector<Operator>& operators();

// Every mutant of `text` (the contents of `file`), in source order.
std::vector<Mutant> find_mutants(const std::string& file, const std::string& text);

// `text` with `m` applied.
std::string apply(const std::string& text, const Mutant& m);

// "line 12: `a < b` -> `a <= b`": the change in its source line, for listings.
std::string describe(const Mutant& m);

// A deterministic sample of `total` mutants (more when `min_per_file` times the files is more), spread over the
// files: each file gets at least `min_per_file` (or all it has), the rest go by D'Hondt's rule in proportion to the
// files' mutant counts, and within a file the mutants are taken in the order of their ids (a hash). So the sample
// stays the same while the sources do, and a larger sample contains every smaller one.
std::vector<Mutant> sample(const std::vector<Mutant>& all, std::size_t total, std::size_t min_per_file);

// 64-bit FNV-1a, for ids.
std::uint64_t fnv1a(const std::string& s);

}  // namespace attn::cli::mutate
