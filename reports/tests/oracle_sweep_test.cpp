// The oracle's self-check sweep: every correct implementation of the registry, run on random and adversarial
// cases, stays within the bound of its error model, and the bound is not vacuous (some case comes within 1% of it).
#include <catch2/catch.hpp>

#include <iostream>

#include "attn/report/oracle_sweep.hpp"
#include "attn/suite/config.hpp"
#include "attn/suite/registry.hpp"

using namespace attn;

TEMPLATE_TEST_CASE("no implementation violates its bound over a short sweep, and the bound is not vacuous",
                   "[oracle][sweep]", float, double) {
    using T = TestType;
    for (const suite::Implementation* impl : suite::correct_implementations()) {
        report::SweepOptions options;
        options.impl = impl->name;
        options.cases = 60;  // a few seconds; the slow test and `attn oracle-sweep` run longer sweeps
        const report::SweepStats st = report::oracle_sweep<T>(options);
        std::cout << impl->name << " sweep " << st.summary() << "\n  worst: " << st.worst_summary << "\n";
        INFO(impl->name << ": " << st.summary());
        INFO(st.first_violation);
        CHECK(st.violations == 0);
        CHECK(st.cases >= 50);
        CHECK(st.worst_tightness >= 1e-2);  // a bound 100x too loose would fail here
        CHECK(st.max_oracle_error_ratio <= oracle::max_oracle_error_ratio);
        INFO(st.first_unbounded);
        CHECK(st.unbounded_outside_wide == 0);
        CHECK(suite::parse_config(st.worst_case).to_config() == st.worst_case);  // its name round-trips
    }
}

TEST_CASE("a sweep names its cases by config strings, and a broken implementation fails it") {
    report::SweepOptions options;
    options.impl = "no_scale";
    options.cases = 30;
    const report::SweepStats st = report::oracle_sweep<double>(options);
    CHECK(st.violations > 0);
    CHECK(st.first_violation.rfind("sdpa(B=", 0) == 0);
    CHECK(st.first_violation.find(",impl=no_scale)") != std::string::npos);
}
