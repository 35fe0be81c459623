// `attn properties` reproduction lines end to end: a failure prints a command, and that command reruns exactly the
// failing case (the same failure, the same worst element); `--case` checks the case a config string with a seed
// names, and refuses one without a seed.
#include <catch2/catch.hpp>

#include <string>

#include "cli_run.hpp"

using namespace attn;

namespace {

using test::Run;
using test::run_attn;
struct Scratch : test::Scratch {
    Scratch() : test::Scratch("attn_properties_command_test") {}
};

// The text after `prefix` up to the end of its line.
std::string line_after(const std::string& text, const std::string& prefix) {
    const auto at = text.find(prefix);
    if (at == std::string::npos) return "";
    const auto begin = at + prefix.size();
    return text.substr(begin, text.find('\n', begin) - begin);
}

// A row of the report's quick grid: its config names the inputs (seeded).
const std::string row =
    "sdpa(B=2,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dtype=float,values=near-ties,seed=0xb401df7af4c124ac,"
    "empty_rows=zero,impl=";

}  // namespace

TEST_CASE("a property failure prints the command that reruns exactly that case") {
    Scratch scratch;
    const Run found = run_attn(scratch, "properties --impl no_scale --property matches_oracle_within_bound");
    INFO(found.out << found.stderr_text);
    REQUIRE(found.exit_code == 1);
    const std::string reproduce = line_after(found.out, "    reproduce: ./attn ");
    REQUIRE(reproduce.rfind("properties --replay '", 0) == 0);
    // The first failure's message: "<config>: output vs oracle: FAIL: ... worst [..] computed .. exact .. bound ..".
    const std::string message = line_after(found.out, "FAIL ");
    const std::string failure = message.substr(message.find("output vs oracle"));
    REQUIRE_FALSE(failure.empty());

    const Run again = run_attn(scratch, reproduce);
    INFO(again.out << again.stderr_text);
    CHECK(again.exit_code == 1);
    CHECK(again.out.find(failure) != std::string::npos);
}

TEST_CASE("a property name that matches nothing is an error naming the closest, not an empty pass") {
    Scratch scratch;
    const Run run = run_attn(scratch, "properties --property rows_sum_to_on");
    CHECK(run.exit_code == 2);
    CHECK(run.stderr_text.find("no property named 'rows_sum_to_on' (did you mean rows_sum_to_one?)") !=
          std::string::npos);
}

TEST_CASE("attn properties --case checks the case a seeded config string names") {
    Scratch scratch;
    const Run good = run_attn(scratch, "properties --case '" + row + "all)'");
    INFO(good.out << good.stderr_text);
    CHECK(good.exit_code == 0);
    for (const char* impl : {"reference", "tiled", "mha"}) CHECK(good.out.find(row + impl + ")") != std::string::npos);

    const Run bad = run_attn(scratch, "properties --case '" + row + "softmax_over_queries)' --property matches_oracle_within_bound");
    INFO(bad.out);
    CHECK(bad.exit_code == 1);
    CHECK(bad.out.find("FAIL " + row + "softmax_over_queries)") != std::string::npos);

    const std::string unseeded = "sdpa(B=2,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=none,dtype=float,impl=tiled)";
    const Run refused = run_attn(scratch, "properties --case '" + unseeded + "'");
    CHECK(refused.exit_code == 2);
    CHECK(refused.stderr_text.find("has no seed") != std::string::npos);
}
