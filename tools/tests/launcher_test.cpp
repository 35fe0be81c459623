// The `attn` launcher as a user calls it from a folder of dumps: relative paths are the caller's.
#include <catch2/catch.hpp>

#include <string>

#include "attn/attn.hpp"
#include "cli_run.hpp"
#include "attn/io/npy.hpp"

using namespace attn;

TEST_CASE("the launcher, called from another directory, reads and writes relative paths there", "[cli][launcher]") {
    const test::Scratch scratch("attn_launcher_test");
    // The course module's Part 2 inputs: q (1,3,4), k (1,3,4), v (1,3,2).
    npy::write_file<float>(scratch / "q.npy", Tensor<float>({1, 3, 4}, {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0}).view());
    npy::write_file<float>(scratch / "k.npy", Tensor<float>({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0}).view());
    npy::write_file<float>(scratch / "v.npy", Tensor<float>({1, 3, 2}, {10, 0, 0, 10, 5, 5}).view());
    const std::string launcher = std::string("'") + ATTN_SOURCE_DIR + "/attn'";
    const std::string in_scratch = "cd '" + scratch.dir.string() + "' && " + launcher;
    const auto run = [&](const std::string& args) {
        return test::run_shell(scratch, in_scratch + " " + args);
    };
    const test::Run sdpa = run("sdpa --q q.npy --k k.npy --v v.npy --out out.npy");
    INFO(sdpa.out << sdpa.stderr_text);
    REQUIRE(sdpa.exit_code == 0);
    const test::Run check = run("check --q q.npy --k k.npy --v v.npy --candidate out.npy");
    INFO(check.out << check.stderr_text);
    CHECK(check.exit_code == 0);
    // and a missing relative file is reported by the name the caller gave, from the caller's directory
    const test::Run missing = run("check --q nothere.npy --k k.npy --v v.npy --candidate out.npy");
    CHECK(missing.exit_code == 2);
    CHECK_THAT(missing.stderr_text, Catch::Contains("nothere.npy"));
}
