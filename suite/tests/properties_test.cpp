// The property suite under ctest: every property against one correct implementation (ATTN_SUITE_IMPL), the
// mutant table, the replay of every case file, and a failure demonstrably written as a replayable case file.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <cassert>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>

#include "attn/machine.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/suite/property.hpp"
#include "checks.hpp"
#include "attn/suite/registry.hpp"

using namespace attn;
using namespace attn::suite;

namespace {

std::string impl_under_test() {
    const char* name = std::getenv("ATTN_SUITE_IMPL");
    return name ? name : "reference";
}

void print_seed(const RunSettings& s) { std::cout << describe_settings(s) << "\n"; }

}  // namespace

TEST_CASE("every property holds for the implementation under test", "[suite]") {
    const Implementation& impl = implementation(impl_under_test());
    RunSettings settings = settings_from_environment(false);
    settings.regressions_dir = "regressions/cases";
    print_seed(settings);
    // A run under ATTN_SIMD_TARGET (ctest's properties_tiled_simd_<TARGET>) checks the target it names: the tiled
    // kernel dispatches there (SCALAR and EMU128 both name the portable fallback). Before the properties (the target the
    // test main forced, lib/tests/catch_main.cpp, before the library could read the variable itself: the library's own
    // reading is the unit tests' attn_machine_env_* to check) and after them (the machine property forces targets,
    // and puts the variable's back by calling force_simd_target itself).
    const auto check_target = [](const char* when) {
        const char* forced = std::getenv("ATTN_SIMD_TARGET");
        if (forced == nullptr || *forced == '\0') return;
        const std::string want = forced, got = simd_target();
        const auto fallback = [](const std::string& t) { return t == "SCALAR" || t == "EMU128"; };
        INFO("ATTN_SIMD_TARGET=" << want << " but the tiled kernel dispatched to " << got << " " << when);
        CHECK((got == want || (fallback(want) && fallback(got))));
    };
    check_target("before the properties");
    // ATTN_SUITE_PROPERTY: that property alone (a coverage or sanitizer build, which has no `attn properties`).
    const char* only = std::getenv("ATTN_SUITE_PROPERTY");
    if (only && *only) (void)property(only);  // a name no property has is an error, not an empty run
    for (const Property& p : properties()) {
        if (!p.applies(impl) || (only && *only && p.name != only)) continue;
        for (Dtype dtype : all_dtypes()) {
            if (impl.dtype_unsupported.count(dtype)) continue;  // no path in that dtype (the module's 16-bit)
            const RunOutcome o = run_property(p, impl, dtype, settings);
            std::printf("%-48s %-9s %-6s %-4s %6d cases %7.2f s  %s\n", p.name.c_str(), impl.name.c_str(), to_string(dtype),
                        o.passed ? "ok" : "FAIL", o.cases, o.seconds, o.passed ? "" : o.message.c_str());
            std::fflush(stdout);
            INFO(p.sentence << "\n" << o.message << (o.reproduce.empty() ? "" : "\nreproduce: " + o.reproduce));
            CHECK(o.passed);
        }
    }
    check_target("after the properties");
}

TEST_CASE("every mutant is killed by some property", "[mutants]") {
    RunSettings settings = settings_from_environment(false);
    print_seed(settings);
    const std::vector<MutantRow> rows = mutant_table(settings, &std::cout);
    const std::string table = format_mutant_table(rows);
    std::cout << "\n" << table;
    if (const char* path = std::getenv("ATTN_MUTANT_TABLE")) std::ofstream(path) << table;
    REQUIRE(!rows.empty());
    for (const MutantRow& r : rows) {
        INFO("mutant " << r.mutant << " (" << r.description << ") survived every property: a property is missing");
        CHECK(r.killed);
    }
}

TEST_CASE("every regression case file replays", "[replay]") {
    const std::filesystem::path dir = "regressions/cases";
    REQUIRE(std::filesystem::is_directory(dir));
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".json") continue;
        ++files;
        const CaseFile file = read_case_file(entry.path().string());
        std::vector<std::string> skipped;
        const std::vector<std::string> problems = replay_case(file, &skipped);
        std::cout << entry.path().filename().string() << ": " << (problems.empty() ? "ok" : "FAIL")
                  << (skipped.empty() ? "" : " (implementation not in this build: " + skipped.front() + ")") << "\n";
        for (const std::string& problem : problems) {
            INFO(entry.path().string());
            FAIL_CHECK(problem);
        }
    }
    CHECK(files > 0);
}

// The split-KV model option is needed, not only charged: on this case FlashDecoding's arithmetic leaves the bound
// of the same model without it (its combine errs by u |lse| per split) and stays within the bound with it.
TEST_CASE("the flash_decoding kernel needs the split_kv term of its error model", "[replay]") {
    const CaseFile file = read_case_file(
        "regressions/cases/sdpa(B=1,H=2,Tq=8,Tk=64,Dk=2,Dv=2,mask=random-r3,kv_heads=1,dtype=double,"
        "values=large-logits,threads=2,impl=flash_decoding).matches_oracle_within_bound.json");
    Implementation impl = implementation("flash_decoding");
    REQUIRE(impl.error_model.split_kv);
    const Tensor<double> out = run_impl<double>(impl, file.sdpa);
    CHECK(oracle::compare_output<double>(out.view(), oracle_for<double>(impl, file.sdpa)).pass());
    impl.error_model.split_kv = false;
    CHECK_FALSE(oracle::compare_output<double>(out.view(), oracle_for<double>(impl, file.sdpa)).pass());
}

// The backward's storage term is needed, not only charged: FlashAttention-2's 16-bit backward rounds P and dS to
// bfloat16 before its products; at Tq = 32, Tk = 512, D = 64 (normal inputs) dv leaves the bound of the model
// without probabilities_in_storage (15x over it when the flag was ignored for gradients) and stays within it with it.
TEST_CASE("the fa2_bf16_backward kernel needs probabilities_in_storage in its gradient bound", "[replay]") {
    Implementation impl = implementation("fa2_bf16_backward");
    REQUIRE(impl.error_model.probabilities_in_storage);
    Rng rng(2024);
    const Tensor<bfloat16> q = normal_tensor<bfloat16>({32, 64}, rng), k = normal_tensor<bfloat16>({512, 64}, rng),
                           v = normal_tensor<bfloat16>({512, 64}, rng), dout = normal_tensor<bfloat16>({32, 64}, rng);
    const SdpaOptions options;
    const SdpaGradients<bfloat16> g = impl.backward<bfloat16>(q.view(), k.view(), v.view(), dout.view(), std::nullopt, options);
    const auto worst = [&](bool in_storage) {
        oracle::OracleOptions oo;
        oo.model = impl.error_model;
        oo.model.probabilities_in_storage = in_storage;
        const oracle::Gradients<bfloat16> exact =
            oracle::sdpa_backward<bfloat16>(q.view(), k.view(), v.view(), dout.view(), std::nullopt, options, oo);
        double ratio = 0;
        for (const auto which : {oracle::Gradient::Dq, oracle::Gradient::Dk, oracle::Gradient::Dv}) {
            const Tensor<bfloat16>& got = which == oracle::Gradient::Dq ? g.dq : which == oracle::Gradient::Dk ? g.dk : g.dv;
            const oracle::Comparison cmp = oracle::compare_gradient<bfloat16>(got.view(), exact, which);
            INFO(oracle::gradient_name(which) << (in_storage ? " with" : " without") << " the storage term: " << cmp.summary());
            ratio = std::max(ratio, cmp.max_tightness);
        }
        return ratio;
    };
    const double with = worst(true), without = worst(false);
    INFO("largest error / bound: " << with << " with the storage term, " << without << " without");
    CHECK(with <= 1);
    CHECK(without > 1);
}

TEST_CASE("a failing property writes its shrunk counter-example as a replayable case file", "[case-file]") {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "attn-case-file-test";
    std::filesystem::remove_all(dir);
    RunSettings settings = settings_from_environment(false);
    settings.regressions_dir = dir.string();
    const Property& p = property("matches_oracle_within_bound");
    const Implementation& mutant = implementation("no_scale");
    const RunOutcome o = run_property(p, mutant, Dtype::Float, settings);
    REQUIRE_FALSE(o.passed);
    REQUIRE(!o.case_file.empty());
    REQUIRE(std::filesystem::exists(o.case_file));
    std::cout << "the mutant no_scale fails " << p.name << "; shrunk case written to " << o.case_file << "\n";
    CHECK(o.reproduce == "./attn properties --replay '" + o.case_file + "'");
    const CaseFile file = read_case_file(o.case_file);
    CHECK(file.property == p.name);
    CHECK(file.implementation == "no_scale");
    // Every float comes back exactly.
    REQUIRE(o.counterexample);
    REQUIRE(file.sdpa.q.shape() == o.counterexample->q.shape());
    for (Index x = 0; x < file.sdpa.q.numel(); ++x) CHECK(file.sdpa.q[x] == o.counterexample->q[x]);
    for (Index x = 0; x < file.sdpa.k.numel(); ++x) CHECK(file.sdpa.k[x] == o.counterexample->k[x]);
    // Replaying it fails for the mutant it was found on and passes for every correct implementation.
    CHECK(p.check(mutant, file.sdpa).has_value());
    for (const Implementation* impl : correct_implementations()) {
        if (impl->dtype_unsupported.count(file.sdpa.dtype)) continue;  // no path in the case's dtype
        INFO(impl->name);
        CHECK_FALSE(p.check(*impl, file.sdpa).has_value());
    }
    std::filesystem::remove_all(dir);
}
