// `attn sdpa` end to end: the course module's worked example from .npy files, and its errors (stderr, exit code 2).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "attn/attn.hpp"
#include "cli_run.hpp"
#include "attn/io/npy.hpp"

using namespace attn;

namespace {

namespace fs = std::filesystem;
using test::Run;
using test::run_attn;
using test::slurp;
struct Scratch : test::Scratch {
    Scratch() : test::Scratch("attn_sdpa_command_test") {}
};

// The course module's Part 2 inputs: q (1,3,4), k (1,3,4), v (1,3,2).
template <class T>
void write_worked_example(const Scratch& scratch) {
    npy::write_file<T>(scratch / "q.npy", Tensor<T>({1, 3, 4}, {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0}).view());
    npy::write_file<T>(scratch / "k.npy", Tensor<T>({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0}).view());
    npy::write_file<T>(scratch / "v.npy", Tensor<T>({1, 3, 2}, {10, 0, 0, 10, 5, 5}).view());
}

std::string worked_example_args(const Scratch& scratch) {
    return "sdpa --q '" + (scratch / "q.npy") + "' --k '" + (scratch / "k.npy") + "' --v '" + (scratch / "v.npy") +
           "' --out '" + (scratch / "out.npy") + "'";
}

}  // namespace

TEMPLATE_TEST_CASE("attn sdpa reproduces the course module's worked example from .npy files", "[cli][example]", float,
                   double) {
    const Scratch scratch;
    write_worked_example<TestType>(scratch);
    const Run run = run_attn(scratch, worked_example_args(scratch) + " --backend reference --weights '" +
                                          (scratch / "w.npy") + "'");
    INFO(run.stderr_text);
    REQUIRE(run.exit_code == 0);
    // The output dtype follows the inputs.
    const auto output = npy::to_tensor<TestType>(npy::read_file(scratch / "out.npy"), "out.npy");
    const auto weights = npy::to_tensor<TestType>(npy::read_file(scratch / "w.npy"), "w.npy");
    REQUIRE(output.shape() == Shape{1, 3, 2});
    REQUIRE(weights.shape() == Shape{1, 3, 3});
    // The module's figures are printed to 4 decimals, hence the 1e-4 margin.
    const double expected_weights[] = {0.3837, 0.2327, 0.3837, 0.2327, 0.3837, 0.3837, 0.2741, 0.2741, 0.4519};
    const double expected_output[] = {5.7548, 4.2452, 4.2452, 5.7548, 5.0, 5.0};
    for (Index i = 0; i < 9; ++i) CHECK(static_cast<double>(weights[i]) == Approx(expected_weights[i]).margin(1e-4));
    for (Index i = 0; i < 6; ++i) CHECK(static_cast<double>(output[i]) == Approx(expected_output[i]).margin(1e-4));
}

TEST_CASE("attn sdpa applies the allowed mask, causal rule and empty-row policy it is given", "[cli]") {
    const Scratch scratch;
    write_worked_example<float>(scratch);
    // Query 0 may read no key: an error under the default policy, zeros under --empty-rows zero.
    npy::write_file<bool>(scratch / "m.npy",
                          Tensor<bool>({3, 3}, {false, false, false, true, true, false, true, true, true}).view());
    const std::string masked = worked_example_args(scratch) + " --allowed-mask '" + (scratch / "m.npy") + "'";
    const Run thrown = run_attn(scratch, masked);
    CHECK(thrown.exit_code == 2);
    CHECK(thrown.stderr_text.find("query row 0") != std::string::npos);
    // In the command line's terms: the flag that allows it, not the C++ enum.
    CHECK(thrown.stderr_text.find("pass --empty-rows zero or --empty-rows nan to allow empty rows") != std::string::npos);
    CHECK(thrown.stderr_text.find("EmptyRowPolicy") == std::string::npos);
    const Run zero = run_attn(scratch, masked + " --empty-rows zero --causal top-left --scale 0.5");
    INFO(zero.stderr_text);
    REQUIRE(zero.exit_code == 0);
    const auto output = npy::to_tensor<float>(npy::read_file(scratch / "out.npy"), "out.npy");
    CHECK(output[0] == 0.0f);
    CHECK(output[1] == 0.0f);
    // Query 1 reads keys 0 and 1 (mask and causal agree) with logits 0.5 * (0, 1): weights (1, e^0.5) / (1 + e^0.5).
    const double w1 = std::exp(0.5) / (1.0 + std::exp(0.5));
    CHECK(static_cast<double>(output[2]) == Approx(10.0 * (1.0 - w1)).epsilon(1e-6));
    CHECK(static_cast<double>(output[3]) == Approx(10.0 * w1).epsilon(1e-6));
}

TEST_CASE("attn sdpa reports bad input on stderr with exit code 2", "[cli][errors]") {
    const Scratch scratch;
    write_worked_example<float>(scratch);
    SECTION("q, k and v of different dtypes") {
        npy::write_file<double>(scratch / "v.npy", Tensor<double>({1, 3, 2}).view());
        const Run run = run_attn(scratch, worked_example_args(scratch));
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("q, k and v must share a dtype") != std::string::npos);
        CHECK(run.stderr_text.find("v (" + (scratch / "v.npy") + ") is float64 [1,3,2]") != std::string::npos);
    }
    SECTION("a missing input file") {
        fs::remove(scratch / "k.npy");
        const Run run = run_attn(scratch, worked_example_args(scratch));
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find(scratch / "k.npy") != std::string::npos);
    }
    SECTION("a truncated input file") {
        fs::resize_file(scratch / "q.npy", fs::file_size(scratch / "q.npy") - 4);  // the last float32 cut off
        const Run run = run_attn(scratch, worked_example_args(scratch));
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("(truncated)") != std::string::npos);
    }
    SECTION("a mask that is not bool") {
        npy::write_file<float>(scratch / "m.npy", Tensor<float>({3, 3}).view());
        const Run run = run_attn(scratch, worked_example_args(scratch) + " --allowed-mask '" + (scratch / "m.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("must be bool") != std::string::npos);
    }
    SECTION("shapes the library rejects") {
        npy::write_file<float>(scratch / "k.npy", Tensor<float>({1, 3, 5}).view());
        const Run run = run_attn(scratch, worked_example_args(scratch));
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("q has Dk=4 but k has Dk=5") != std::string::npos);
    }
    SECTION("weights from the tiled backend, in the command line's terms") {
        const Run run = run_attn(scratch, worked_example_args(scratch) + " --backend tiled --weights '" +
                                              (scratch / "w.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("pass --backend reference or --backend auto to ask for the weights") != std::string::npos);
    }
    SECTION("--plot-weights draws the batch element --head names, and refuses one outside the batch") {
        const Run run = run_attn(scratch, worked_example_args(scratch) + " --causal top-left --plot-weights '" +
                                              (scratch / "w.svg") + "' --head 0");
        INFO(run.stderr_text);
        CHECK(run.exit_code == 0);
        CHECK(slurp(scratch / "w.svg").find("batch element [0]") != std::string::npos);
        const Run outside = run_attn(scratch, worked_example_args(scratch) + " --plot-weights '" +
                                                  (scratch / "w.svg") + "' --head 1");
        CHECK(outside.exit_code == 2);
        CHECK(outside.stderr_text.find("--head 1 is not an element of the batch shape [1]") != std::string::npos);
    }
    SECTION("a NaN where a query reads, in the command line's terms") {
        npy::write_file<float>(scratch / "q.npy", Tensor<float>({1, 3, 4}, {1, 0, 1, 0, 0, NAN, 0, 1, 1, 1, 0, 0}).view());
        const Run run = run_attn(scratch, worked_example_args(scratch));
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("pass --no-check-finite to allow it") != std::string::npos);
    }
    SECTION("a mistyped command names the closest one") {
        const Run run = run_attn(scratch, "sdap");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("unknown command 'sdap' (did you mean sdpa?)") != std::string::npos);
    }
    SECTION("an option value outside its set") {
        const Run run = run_attn(scratch, worked_example_args(scratch) + " --causal sideways");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("--causal") != std::string::npos);
    }
}

TEST_CASE("attn sdpa, oracle and check apply the sliding window they are given", "[cli]") {
    const Scratch scratch;
    write_worked_example<double>(scratch);
    const std::string inputs = " --q '" + (scratch / "q.npy") + "' --k '" + (scratch / "k.npy") + "' --v '" +
                               (scratch / "v.npy") + "'";
    // (1, 0), Tq = Tk = 3: query 0 reads key 0 alone, query i keys i-1 and i. Top-left (0, 0): key i alone.
    const Run banded = run_attn(scratch, worked_example_args(scratch) + " --window 1,0 --backend tiled");
    INFO(banded.stderr_text);
    REQUIRE(banded.exit_code == 0);
    const auto out = npy::to_tensor<double>(npy::read_file(scratch / "out.npy"), "out.npy");
    CHECK(out[0] == 10.0);
    CHECK(out[1] == 0.0);
    // Query 2 reads keys 1 and 2 with logits (1, 2) / 2: weights (1, e^0.5) / (1 + e^0.5) on v1 = (0, 10), v2 = (5, 5).
    const double w1 = 1.0 / (1.0 + std::exp(0.5)), w2 = 1.0 - w1;
    CHECK(out[4] == Approx(5 * w2).epsilon(1e-12));
    CHECK(out[5] == Approx(10 * w1 + 5 * w2).epsilon(1e-12));
    // attn check accepts it under the same window, and refuses it without (query 0 then reads every key).
    const std::string check = "check" + inputs + " --model tiled --key-block 256 --candidate '" + (scratch / "out.npy") + "'";
    CHECK(run_attn(scratch, check + " --window 1,0").exit_code == 0);
    CHECK(run_attn(scratch, check).exit_code == 1);
    const Run diagonal = run_attn(scratch, worked_example_args(scratch) + " --window 0,0 --window-alignment top-left");
    REQUIRE(diagonal.exit_code == 0);
    const auto diag = npy::to_tensor<double>(npy::read_file(scratch / "out.npy"), "out.npy");
    for (Index x = 0; x < 6; ++x) CHECK(diag[x] == std::vector<double>{10, 0, 0, 10, 5, 5}[std::size_t(x)]);
    // The oracle writes the same diagonal.
    const Run oracle = run_attn(scratch, "oracle" + inputs + " --window 0,0 --window-alignment top-left --out '" +
                                             (scratch / "exact.npy") + "'");
    REQUIRE(oracle.exit_code == 0);
    const auto exact = npy::to_tensor<double>(npy::read_file(scratch / "exact.npy"), "exact.npy");
    for (Index x = 0; x < 6; ++x) CHECK(exact[x] == diag[x]);
    // Bad windows: exit 2, naming the window.
    const Run unparsed = run_attn(scratch, worked_example_args(scratch) + " --window 3");
    CHECK(unparsed.exit_code == 2);
    CHECK(unparsed.stderr_text.find("the window must be LEFT,RIGHT") != std::string::npos);
    const Run below = run_attn(scratch, worked_example_args(scratch) + " --window -2,0");
    CHECK(below.exit_code == 2);
    CHECK(below.stderr_text.find("window (-2, 0) bottom-right") != std::string::npos);
    // A window that leaves query 0 with no key (top-left (0, 0) shifted: bottom-right with Tk < Tq).
    npy::write_file<double>(scratch / "k.npy", Tensor<double>({1, 2, 4}, {1, 0, 0, 0, 0, 1, 0, 0}).view());
    npy::write_file<double>(scratch / "v.npy", Tensor<double>({1, 2, 2}, {10, 0, 0, 10}).view());
    const Run empty = run_attn(scratch, worked_example_args(scratch) + " --window 0,0");
    CHECK(empty.exit_code == 2);
    CHECK(empty.stderr_text.find("query row 0") != std::string::npos);
    CHECK(empty.stderr_text.find("window (0, 0) bottom-right") != std::string::npos);
}

TEST_CASE("attn sdpa, oracle and check apply the softcap they are given", "[cli]") {
    const Scratch scratch;
    write_worked_example<double>(scratch);
    const std::string inputs = " --q '" + (scratch / "q.npy") + "' --k '" + (scratch / "k.npy") + "' --v '" +
                               (scratch / "v.npy") + "'";
    for (const char* backend : {"tiled", "reference"}) {
        const Run capped = run_attn(scratch, worked_example_args(scratch) + " --softcap 0.1 --backend " + backend);
        INFO(capped.stderr_text);
        REQUIRE(capped.exit_code == 0);
        // attn check accepts it under the same cap and its backend's model, and refuses it uncapped: a cap of 0.1
        // pulls the weights of the worked example's logits (up to 1) nearly level.
        const std::string check = "check" + inputs + " --model " + backend + " --candidate '" + (scratch / "out.npy") + "'";
        CHECK(run_attn(scratch, check + " --softcap 0.1").exit_code == 0);
        CHECK(run_attn(scratch, check).exit_code == 1);
    }
    // Query 0's logits are (1, 0, 1) / 2 before the cap (the worked example), (t, 0, t) after it, t = 0.1 tanh(5):
    // the oracle's first output element is 10 w0 + 5 w2 = 15 e^t / (2 e^t + 1).
    const Run oracle = run_attn(scratch, "oracle" + inputs + " --softcap 0.1 --out '" + (scratch / "exact.npy") + "'");
    REQUIRE(oracle.exit_code == 0);
    const auto exact = npy::to_tensor<double>(npy::read_file(scratch / "exact.npy"), "exact.npy");
    const double t = 0.1 * std::tanh(5.0);
    CHECK(exact[0] == Approx(15 * std::exp(t) / (2 * std::exp(t) + 1)).epsilon(1e-14));
    // Bad caps: exit 2, naming the softcap.
    for (const char* bad : {"-1", "inf", "1e-320"}) {
        const Run refused = run_attn(scratch, worked_example_args(scratch) + " --softcap " + bad);
        CHECK(refused.exit_code == 2);
        CHECK(refused.stderr_text.find("softcap must be 0 (off) or a positive number") != std::string::npos);
    }
}

TEST_CASE("attn sdpa, oracle and check add the bias they are given", "[cli][bias]") {
    const Scratch scratch;
    write_worked_example<double>(scratch);
    const std::string inputs = " --q '" + (scratch / "q.npy") + "' --k '" + (scratch / "k.npy") + "' --v '" +
                               (scratch / "v.npy") + "'";
    // A (Tk) bias broadcast over the queries: key 2 blocked, key 1 raised by 1. Query 0's logits (1, 0, 1) / 2 become
    // (0.5, 1, -inf): its output is w0 (10, 0) + w1 (0, 10), w0 = e^0.5 / (e^0.5 + e).
    const double inf = std::numeric_limits<double>::infinity();
    npy::write_file<double>(scratch / "bias.npy", Tensor<double>({3}, {0, 1, -inf}).view());
    const std::string bias = " --bias '" + (scratch / "bias.npy") + "'";
    const double w0 = std::exp(0.5) / (std::exp(0.5) + std::exp(1.0)), w1 = 1 - w0;
    for (const char* backend : {"tiled", "reference"}) {
        const Run biased = run_attn(scratch, worked_example_args(scratch) + bias + " --backend " + backend);
        INFO(biased.stderr_text);
        REQUIRE(biased.exit_code == 0);
        const auto out = npy::to_tensor<double>(npy::read_file(scratch / "out.npy"), "out.npy");
        CHECK(out[0] == Approx(10 * w0).epsilon(1e-14));
        CHECK(out[1] == Approx(10 * w1).epsilon(1e-14));
        const std::string check = "check" + inputs + " --model " + backend + " --candidate '" + (scratch / "out.npy") + "'";
        CHECK(run_attn(scratch, check + bias).exit_code == 0);
        CHECK(run_attn(scratch, check).exit_code == 1);
    }
    const Run oracle = run_attn(scratch, "oracle" + inputs + bias + " --out '" + (scratch / "exact.npy") + "'");
    REQUIRE(oracle.exit_code == 0);
    const auto exact = npy::to_tensor<double>(npy::read_file(scratch / "exact.npy"), "exact.npy");
    CHECK(exact[0] == Approx(10 * w0).epsilon(1e-15));
    // Bad biases: exit 2, naming the bias.
    npy::write_file<float>(scratch / "bias32.npy", Tensor<float>({3}, {0, 0, 0}).view());
    const Run dtype = run_attn(scratch, worked_example_args(scratch) + " --bias '" + (scratch / "bias32.npy") + "'");
    CHECK(dtype.exit_code == 2);
    CHECK(dtype.stderr_text.find("sdpa: bias must have the dtype of q, k and v") != std::string::npos);
    npy::write_file<double>(scratch / "bias4.npy", Tensor<double>({4}, {0, 0, 0, 0}).view());
    const Run shape = run_attn(scratch, worked_example_args(scratch) + " --bias '" + (scratch / "bias4.npy") + "'");
    CHECK(shape.exit_code == 2);
    CHECK(shape.stderr_text.find("bias [4] does not broadcast to the scores") != std::string::npos);
    npy::write_file<double>(scratch / "bias_nan.npy", Tensor<double>({3}, {0, std::nan(""), 0}).view());
    const Run nan = run_attn(scratch, worked_example_args(scratch) + " --bias '" + (scratch / "bias_nan.npy") + "'");
    CHECK(nan.exit_code == 2);
    CHECK(nan.stderr_text.find("bias [1,3,3] holds nan") != std::string::npos);
}

TEST_CASE("attn sdpa, oracle and check add the ALiBi slopes they are given", "[cli][alibi]") {
    const Scratch scratch;
    write_worked_example<double>(scratch);
    const std::string inputs = " --q '" + (scratch / "q.npy") + "' --k '" + (scratch / "k.npy") + "' --v '" +
                               (scratch / "v.npy") + "'";
    // One slope of 1 for the batch shape (1): query 0 (Tq = Tk) gets -|0 - j| = (0, -1, -2) on its logits
    // (1, 0, 1) / 2, so (0.5, -1, -1.5); v = (10, 0), (0, 10), (5, 5).
    npy::write_file<double>(scratch / "slopes.npy", Tensor<double>({1}, {1.0}).view());
    const std::string alibi = " --alibi-slopes '" + (scratch / "slopes.npy") + "'";
    const double e0 = std::exp(0.5), e1 = std::exp(-1.0), e2 = std::exp(-1.5), sum = e0 + e1 + e2;
    for (const char* backend : {"tiled", "reference"}) {
        const Run run = run_attn(scratch, worked_example_args(scratch) + alibi + " --backend " + backend);
        INFO(run.stderr_text);
        REQUIRE(run.exit_code == 0);
        const auto out = npy::to_tensor<double>(npy::read_file(scratch / "out.npy"), "out.npy");
        CHECK(out[0] == Approx((10 * e0 + 5 * e2) / sum).epsilon(1e-14));
        CHECK(out[1] == Approx((10 * e1 + 5 * e2) / sum).epsilon(1e-14));
        const std::string check = "check" + inputs + " --model " + backend + " --candidate '" + (scratch / "out.npy") + "'";
        CHECK(run_attn(scratch, check + alibi).exit_code == 0);
        CHECK(run_attn(scratch, check).exit_code == 1);
    }
    npy::write_file<double>(scratch / "slopes2.npy", Tensor<double>({2}, {1.0, 2.0}).view());
    const Run shape = run_attn(scratch, worked_example_args(scratch) + " --alibi-slopes '" + (scratch / "slopes2.npy") + "'");
    CHECK(shape.exit_code == 2);
    CHECK(shape.stderr_text.find("alibi_slopes [2] does not broadcast to the batch shape [1]") != std::string::npos);
}

TEST_CASE("attn sdpa, mha, oracle and check take the option table's flags with its help", "[cli][options]") {
    const Scratch scratch;
    for (const char* command : {"sdpa", "mha", "oracle", "check"}) {
        const Run help = run_attn(scratch, std::string(command) + " --help");
        INFO(command << "\n" << help.out);
        REQUIRE(help.exit_code == 0);
        std::vector<std::string_view> fields(std::begin(problem_option_fields), std::end(problem_option_fields));
        if (std::string(command) == "sdpa" || std::string(command) == "mha")
            fields.insert(fields.end(), std::begin(execution_option_fields), std::end(execution_option_fields));
        for (const std::string_view field : fields) {
            const OptionSpec& o = option_spec(field);
            INFO(std::string(field));
            CHECK(help.out.find(std::string(o.cli) + " ") != std::string::npos);
            // CLI11 wraps long help; the first words are on the flag's line.
            CHECK(help.out.find(std::string(o.help).substr(0, 20)) != std::string::npos);
        }
    }
    // A value outside the spellings is refused by the parser, naming the allowed ones.
    const Run bad = run_attn(scratch, "sdpa --q a --k b --v c --out d --empty-rows none");
    CHECK(bad.exit_code == 2);
    CHECK(bad.stderr_text.find("throw") != std::string::npos);
}
