// The mutant finder of `attn mutate`: what it changes, what it must never touch, and the stability of ids and
// samples.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "mutate.hpp"

namespace m = attn::cli::mutate;

namespace {

std::vector<std::string> changes(const std::vector<m::Mutant>& ms, const std::string& op) {
    std::vector<std::string> out;
    for (const m::Mutant& x : ms)
        if (x.op == op) out.push_back(x.original + " -> " + x.replacement);
    return out;
}

bool has(const std::vector<std::string>& xs, const std::string& x) { return std::find(xs.begin(), xs.end(), x) != xs.end(); }

}  // namespace

TEST_CASE("comments, literals and preprocessor lines are never mutated") {
    const std::string text =
        "#include <vector>\n"
        "#define LIMIT (1 + 2)\n"
        "// if (a < b) x = 1;\n"
        "/* a == b && c */\n"
        "const char* s = \"a < b && c - 1\";\n"
        "const char* r = R\"(x < y)\";\n"
        "char c = '<';\n";
    const auto ms = m::find_mutants("f.cpp", text);
    for (const m::Mutant& x : ms) {
        INFO(x.op << " at line " << x.line << ": " << x.original);
        CHECK(x.line >= 5);
        CHECK(x.original.find('<') == std::string::npos);
        CHECK(x.original.find('"') == std::string::npos);
    }
}

TEST_CASE("relational, logical and arithmetic operators are mutated only where they are binary") {
    const std::string text =
        "std::vector<int> v;\n"
        "template <class T> T f(T&& a, T* p) { return a < *p && -a >= 2 * a; }\n";
    const auto ms = m::find_mutants("f.cpp", text);
    CHECK(changes(ms, "relational") == std::vector<std::string>{"< -> <=", ">= -> >"});
    CHECK(changes(ms, "logical") == std::vector<std::string>{"&& -> ||"});
    CHECK(changes(ms, "arithmetic") == std::vector<std::string>{"* -> /"});
}

TEST_CASE("statements are deleted whole, never a piece of a for header") {
    const std::string text =
        "void g(int n, int* x) {\n"
        "    for (int i = 0; i < n; ++i) x[i] += i;\n"
        "    if (n > 3) throw Error(\"n\");\n"
        "    int y = n;\n"
        "    h(y, n);\n"
        "    return;\n"
        "}\n";
    const auto deleted = changes(m::find_mutants("f.cpp", text), "delete");
    CHECK(deleted == std::vector<std::string>{"x[i] += i; -> {}", "throw Error(\"n\"); -> {}", "h(y, n); -> {}"});
}

TEST_CASE("constants, min and max, conditions and arguments") {
    const std::string text = "auto z = std::min(a, b) + h(0, 1, 0.5, 0.0f, 7u, c, d) + 1e-3;\nif (z) q();\n";
    const auto ms = m::find_mutants("f.cpp", text);
    const auto constants = changes(ms, "constant");
    CHECK(has(constants, "0 -> 1"));
    CHECK(has(constants, "1 -> 0"));
    CHECK(has(constants, "0.5 -> (2 * 0.5)"));
    CHECK(has(constants, "0.0f -> 1.0f"));
    CHECK(has(constants, "7u -> 8u"));
    CHECK(has(constants, "1e-3 -> (2 * 1e-3)"));
    CHECK(changes(ms, "min-max") == std::vector<std::string>{"min -> max"});
    CHECK(changes(ms, "negate") == std::vector<std::string>{"z -> !(z)"});
    // Only adjacent plain names are swapped, and never the arguments of min or max (they commute).
    CHECK(changes(ms, "swap-arguments") == std::vector<std::string>{"c, d -> d, c"});
}

TEST_CASE("a mutant applies to its place alone and describes itself") {
    const std::string text = "int f(int a) {\n    return a < 3 ? a : 0;\n}\n";
    const auto ms = m::find_mutants("lib/src/f.cpp", text);
    const auto it = std::find_if(ms.begin(), ms.end(), [](const m::Mutant& x) { return x.op == "relational"; });
    REQUIRE(it != ms.end());
    CHECK(m::apply(text, *it) == "int f(int a) {\n    return a <= 3 ? a : 0;\n}\n");
    CHECK(m::describe(*it) == "line 2: `<` -> `<=`");
    CHECK(it->file == "lib/src/f.cpp");
}

TEST_CASE("ids survive edits to other lines and change with their own line") {
    const std::string before = "int f(int a) {\n    return a < 3;\n}\n";
    const std::string after = "// a comment\nint f(int a) {\n    return a < 3;\n}\n";
    const std::string changed = "int f(int a) {\n    return a < 4;\n}\n";
    const auto id_of = [](const std::string& text) {
        for (const m::Mutant& x : m::find_mutants("f.cpp", text))
            if (x.op == "relational") return x.id;
        return std::string();
    };
    CHECK(!id_of(before).empty());
    CHECK(id_of(before) == id_of(after));
    CHECK(id_of(before) != id_of(changed));
    // Two copies of one line are two mutants.
    std::vector<std::string> ids;
    for (const m::Mutant& x : m::find_mutants("f.cpp", "x = a < 3;\ny = 0;\nx = a < 3;\n"))
        if (x.op == "relational") ids.push_back(x.id);
    REQUIRE(ids.size() == 2);
    CHECK(ids[0] != ids[1]);
    // The same change in another file is another mutant.
    CHECK(m::find_mutants("f.cpp", before)[0].id != m::find_mutants("g.cpp", before)[0].id);
}

TEST_CASE("the sample is deterministic, spread over the files and at most the size asked") {
    std::vector<m::Mutant> all;
    for (const char* file : {"a.cpp", "b.cpp", "c.cpp"}) {
        std::string text;
        const int lines = std::string(file) == "a.cpp" ? 100 : std::string(file) == "b.cpp" ? 20 : 2;
        for (int i = 0; i < lines; ++i) text.append("x").append(std::to_string(i)).append(" = y < z;\n");
        for (auto& x : m::find_mutants(file, text)) all.push_back(x);
    }
    const auto s = m::sample(all, 40, 5);
    CHECK(s.size() == 40);
    std::map<std::string, int> per_file;
    for (const auto& x : s) ++per_file[x.file];
    CHECK(per_file["c.cpp"] == 4);  // all it has (2 lines, 2 mutants each: the comparison and the deletion)
    CHECK(per_file["b.cpp"] >= 5);
    CHECK(per_file["a.cpp"] > per_file["b.cpp"]);
    const auto again = m::sample(all, 40, 5);
    CHECK(std::equal(s.begin(), s.end(), again.begin(), again.end(), [](const m::Mutant& a, const m::Mutant& b) { return a.id == b.id; }));
    // Taking more keeps what a smaller sample took.
    const auto more = m::sample(all, 60, 5);
    for (const auto& x : s)
        CHECK(std::any_of(more.begin(), more.end(), [&](const m::Mutant& y) { return y.id == x.id; }));
}
