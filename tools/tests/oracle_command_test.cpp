// `attn oracle` and `attn check` end to end: the library's own output passes, an output with one element moved just
// past its bound fails and that element is named; bad input exits with 2.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "attn/attn.hpp"
#include "attn/oracle/oracle.hpp"
#include "cli_run.hpp"
#include "attn/io/npy.hpp"

using namespace attn;

namespace {

namespace fs = std::filesystem;
using test::Run;
using test::run_attn;
using test::slurp;
struct Scratch : test::Scratch {
    Scratch() : test::Scratch("attn_oracle_command_test") {}
};

// q (2, 4, 8), k (2, 6, 8), v (2, 6, 3), random normal.
template <class T>
void write_inputs(const Scratch& scratch) {
    std::mt19937_64 rng(11);
    std::normal_distribution<double> normal(0.0, 1.0);
    const auto random = [&](Shape shape) {
        Tensor<T> t(std::move(shape));
        for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(normal(rng));
        return t;
    };
    npy::write_file<T>(scratch / "q.npy", random({2, 4, 8}).view());
    npy::write_file<T>(scratch / "k.npy", random({2, 6, 8}).view());
    npy::write_file<T>(scratch / "v.npy", random({2, 6, 3}).view());
}

// bfloat16 goes to .npy as its int16 bits, read with --dtype bfloat16 (as a PyTorch user's view(torch.int16) dump).
template <class T = float>
std::string inputs(const Scratch& scratch) {
    return " --q '" + (scratch / "q.npy") + "' --k '" + (scratch / "k.npy") + "' --v '" + (scratch / "v.npy") + "'" +
           (std::is_same_v<T, bfloat16> ? " --dtype bfloat16" : "");
}

template <class T>
Tensor<T> read(const std::string& path) {
    npy::Array a = npy::read_file(path);
    if constexpr (std::is_same_v<T, bfloat16>) a = npy::as_dtype(std::move(a), npy::DType::BFloat16, path);
    return npy::to_tensor<T>(a, path);
}

// The next T above x.
template <class T>
T step_up(T x) {
    if constexpr (is_half_v<T>) {
        const float f = x;
        if (f == 0) return std::numeric_limits<T>::denorm_min();
        return T::from_bits(static_cast<std::uint16_t>(f > 0 ? x.bits + 1 : x.bits - 1));
    } else {
        return std::nextafter(x, std::numeric_limits<T>::infinity());
    }
}

}  // namespace

TEMPLATE_TEST_CASE("attn check passes the library's output and names an element moved just past its bound",
                   "[cli][oracle]", float, double, float16, bfloat16) {
    using T = TestType;
    const Scratch scratch;
    write_inputs<T>(scratch);
    const Run lib = run_attn(scratch, "sdpa" + inputs<T>(scratch) + " --backend reference --out '" + (scratch / "lib.npy") + "'");
    INFO(lib.stderr_text);
    REQUIRE(lib.exit_code == 0);

    const Run good = run_attn(scratch, "check" + inputs<T>(scratch) + " --model reference --candidate '" +
                                           (scratch / "lib.npy") + "' --json '" + (scratch / "good.json") + "'");
    INFO(good.out << good.stderr_text);
    CHECK(good.exit_code == 0);
    CHECK(good.out.find("over the bound       0 of 24 elements") != std::string::npos);
    CHECK(good.out.find("max ULP error") != std::string::npos);
    CHECK(nlohmann::json::parse(slurp(scratch / "good.json"))["pass"] == true);

    // `attn oracle` writes the correctly rounded output and the bound of the chosen model.
    const Run orc = run_attn(scratch, "oracle" + inputs<T>(scratch) + " --model reference --out '" + (scratch / "o.npy") +
                                          "' --bound '" + (scratch / "b.npy") + "'");
    INFO(orc.stderr_text);
    REQUIRE(orc.exit_code == 0);
    const Tensor<T> q = read<T>(scratch / "q.npy");
    const Tensor<T> k = read<T>(scratch / "k.npy");
    const Tensor<T> v = read<T>(scratch / "v.npy");
    oracle::OracleOptions oo;
    oo.model = oracle::reference_model();
    const oracle::Result<T> r = oracle::scaled_dot_product_attention<T>(q.view(), k.view(), v.view(), std::nullopt, {}, oo);
    const Tensor<T> o = read<T>(scratch / "o.npy");
    const Tensor<double> b = npy::to_tensor<double>(npy::read_file(scratch / "b.npy"), "b");
    for (Index e = 0; e < o.numel(); ++e) {
        CHECK(std::memcmp(&o[e], &r.output[e], sizeof(T)) == 0);
        CHECK(b[e] == r.output_bound[e]);
    }

    // Element (1, 2, 1) moved to the first T beyond exact + bound.
    Tensor<T> moved = read<T>(scratch / "lib.npy");
    const Index flat = (1 * 4 + 2) * 3 + 1;
    const long double limit = r.output_exact[flat] + r.output_exact_lo[flat] + r.output_bound[flat];
    T x = static_cast<T>(limit);
    while (static_cast<long double>(x) <= limit) x = step_up(x);
    moved[flat] = x;
    npy::write_file<T>(scratch / "moved.npy", moved.view());
    const Run bad = run_attn(scratch, "check" + inputs<T>(scratch) + " --model reference --candidate '" +
                                          (scratch / "moved.npy") + "' --json '" + (scratch / "bad.json") + "'");
    INFO(bad.out << bad.stderr_text);
    CHECK(bad.exit_code == 1);
    CHECK(bad.out.find("over the bound       1 of 24 elements") != std::string::npos);
    CHECK(bad.out.find("worst element        [1,2,1]") != std::string::npos);
    const auto report = nlohmann::json::parse(slurp(scratch / "bad.json"));
    CHECK(report["pass"] == false);
    CHECK(report["output"]["worst"]["index"] == nlohmann::json::array({1, 2, 1}));
    CHECK(report["output"]["over_bound"] == 1);

    // A failing 16-bit candidate is checked again under the models that round in more places; the exit status stays
    // the verdict of the model asked for. One element a step past the bound fits a looser model; one far off none.
    if constexpr (is_half_v<T>) {
        CHECK(bad.out.find("16-bit rounding models (the reference model otherwise as asked)") != std::string::npos);
        const auto& ladder = report["storage_models"]["tried"];
        REQUIRE(ladder.size() == 5);
        CHECK(ladder[0]["logit_storage_roundings"] == 1);
        CHECK(ladder[0]["probabilities_in_storage"] == false);
        CHECK(ladder[4]["logit_storage_roundings"] == 2);
        CHECK(ladder[4]["probabilities_in_storage"] == true);
        std::string first;
        for (const auto& m : ladder)
            if (m["pass"] == true) {
                first = (m["logit_storage_roundings"] == 0 ? std::string() : "--logit-storage-roundings " +
                         std::to_string(m["logit_storage_roundings"].get<int>())) +
                        (m["probabilities_in_storage"] == true ? std::string(m["logit_storage_roundings"] == 0 ? "" : " ") +
                         "--probabilities-in-storage" : "");
                break;
            }
        REQUIRE(!first.empty());
        CHECK(report["storage_models"]["first_that_fits"] == first);
        CHECK(bad.out.find("first model that fits: --model reference " + first) != std::string::npos);

        // Asked with logits rounded once and P in storage: only the one looser model remains.
        const Run asked = run_attn(scratch, "check" + inputs<T>(scratch) + " --model reference --candidate '" +
                                                (scratch / "moved.npy") + "' --logit-storage-roundings 1 "
                                                "--probabilities-in-storage --json '" + (scratch / "asked.json") + "'");
        INFO(asked.out);
        if (asked.exit_code != 0) {
            const auto tried = nlohmann::json::parse(slurp(scratch / "asked.json"))["storage_models"]["tried"];
            REQUIRE(tried.size() == 1);
            CHECK(tried[0]["logit_storage_roundings"] == 2);
        } else {
            CHECK(!nlohmann::json::parse(slurp(scratch / "asked.json")).contains("storage_models"));
        }

        Tensor<T> far = read<T>(scratch / "lib.npy");
        far[flat] = static_cast<T>(static_cast<float>(far[flat]) + 4.0f);
        npy::write_file<T>(scratch / "far.npy", far.view());
        const Run none = run_attn(scratch, "check" + inputs<T>(scratch) + " --candidate '" + (scratch / "far.npy") +
                                               "' --json '" + (scratch / "far.json") + "'");
        INFO(none.out);
        CHECK(none.exit_code == 1);
        CHECK(none.out.find("no 16-bit rounding model fits") != std::string::npos);
        CHECK(nlohmann::json::parse(slurp(scratch / "far.json"))["storage_models"]["first_that_fits"].is_null());
    } else {
        CHECK(bad.out.find("16-bit rounding models") == std::string::npos);
        CHECK(!report.contains("storage_models"));
    }
}

TEST_CASE("attn check reports bad input with exit code 2", "[cli][oracle][errors]") {
    const Scratch scratch;
    write_inputs<float>(scratch);
    SECTION("a candidate of the wrong shape") {
        const Run run = run_attn(scratch, "check" + inputs(scratch) + " --candidate '" + (scratch / "v.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("[2,6,3]") != std::string::npos);
        CHECK(run.stderr_text.find("[2,4,3]") != std::string::npos);
    }
    SECTION("a candidate of another dtype than q") {
        npy::write_file<double>(scratch / "c.npy", Tensor<double>({2, 4, 3}).view());
        const Run run = run_attn(scratch, "check" + inputs(scratch) + " --candidate '" + (scratch / "c.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("must have q's dtype") != std::string::npos);
    }
    SECTION("--dtype bfloat16 on float32 files: their values are no 16-bit patterns") {
        const Run run = run_attn(scratch, "check" + inputs(scratch) + " --dtype bfloat16 --candidate '" +
                                              (scratch / "q.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("float32 [2,4,8], which does not hold bfloat16 bits") != std::string::npos);
    }
    SECTION("an unknown model") {
        const Run run = run_attn(scratch, "check" + inputs(scratch) + " --candidate '" + (scratch / "q.npy") +
                                              "' --model fastest");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("--model") != std::string::npos);
    }
    SECTION("a precision the oracle does not offer") {
        const Run run = run_attn(scratch, "check" + inputs(scratch) + " --candidate '" + (scratch / "q.npy") +
                                              "' --bits 100");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("--bits: 100 not in {0,114,261,516}") != std::string::npos);
    }    SECTION("nothing to check, or --dout without a candidate gradient") {
        Run run = run_attn(scratch, "check" + inputs(scratch));
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("give --candidate") != std::string::npos);
        run = run_attn(scratch, "check" + inputs(scratch) + " --dout '" + (scratch / "v.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("--dout and at least one of --candidate-dq") != std::string::npos);
    }
    SECTION("a candidate gradient of the wrong shape") {
        npy::write_file<float>(scratch / "dout.npy", Tensor<float>({2, 4, 3}).view());
        const Run run = run_attn(scratch, "check" + inputs(scratch) + " --dout '" + (scratch / "dout.npy") +
                                              "' --candidate-dk '" + (scratch / "q.npy") + "'");
        CHECK(run.exit_code == 2);
        CHECK(run.stderr_text.find("candidate [2,4,8] but the oracle's dk is [2,6,8]") != std::string::npos);
    }
}

TEST_CASE("attn check exits with 3 when the output is within its rigorous bound but over its statistical one",
          "[cli][oracle]") {
    // Long rows (Tk = 1024), where the statistical bound (sqrt(n) where the rigorous one has n) is well below the
    // rigorous one; one element moved just past the statistical bound.
    const Scratch scratch;
    std::mt19937_64 rng(12);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    const auto random = [&](Shape shape, double offset) {
        Tensor<float> t(std::move(shape));
        for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(offset + uniform(rng));
        return t;
    };
    const Tensor<float> q = random({1, 2, 4}, 0), k = random({1, 1024, 4}, 0), v = random({1, 1024, 2}, 2);
    npy::write_file<float>(scratch / "q.npy", q.view());
    npy::write_file<float>(scratch / "k.npy", k.view());
    npy::write_file<float>(scratch / "v.npy", v.view());
    oracle::OracleOptions oo;
    oo.model = oracle::reference_model();
    oo.statistical = true;
    const oracle::Result<float> r = oracle::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), std::nullopt, {}, oo);
    const Index flat = 3;  // row 1, column 1
    // lambda sqrt(1024) u against 1024 u, lambda = 9.3 at this call's 2052 elements: about 0.28 of the rigorous bound.
    REQUIRE(r.output_stat_bound[flat] < r.output_bound[flat] / 3);
    const long double limit = r.output_exact[flat] + r.output_exact_lo[flat] + r.output_stat_bound[flat];
    Tensor<float> moved = r.output;
    float x = static_cast<float>(limit);
    while (static_cast<long double>(x) <= limit) x = std::nextafter(x, std::numeric_limits<float>::infinity());
    moved[flat] = x;
    npy::write_file<float>(scratch / "moved.npy", moved.view());
    const Run run = run_attn(scratch, "check" + inputs(scratch) + " --model reference --candidate '" +
                                          (scratch / "moved.npy") + "' --json '" + (scratch / "stat.json") + "'");
    INFO(run.out << run.stderr_text);
    CHECK(run.exit_code == 3);
    CHECK(run.out.find("statistical verdict") != std::string::npos);
    CHECK(run.out.find("SUSPICIOUS") != std::string::npos);
    const auto report = nlohmann::json::parse(slurp(scratch / "stat.json"));
    CHECK(report["pass"] == true);
    CHECK(report["statistical"]["suspicious"] == true);
    CHECK(report["statistical"]["output"]["over_bound"] == 1);
    CHECK(report["statistical"]["false_alarm_per_call"] == oracle::statistical_false_alarm);

    // The oracle's own output is not suspicious.
    npy::write_file<float>(scratch / "exact.npy", r.output.view());
    const Run exact = run_attn(scratch, "check" + inputs(scratch) + " --model reference --candidate '" +
                                            (scratch / "exact.npy") + "'");
    INFO(exact.out);
    CHECK(exact.exit_code == 0);
    CHECK(exact.out.find("not suspicious") != std::string::npos);
}
