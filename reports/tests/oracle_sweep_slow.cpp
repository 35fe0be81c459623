// The long self-check sweep: the reference backend against the oracle's bound over thousands of random and
// adversarial cases per dtype (minutes; label `slow`).
#include <catch2/catch.hpp>

#include <iostream>

#include "attn/report/oracle_sweep.hpp"

namespace oracle = attn::oracle;
namespace report = attn::report;

TEMPLATE_TEST_CASE("over a long sweep the reference backend never violates its bound", "[oracle][slow]", float, double) {
    report::SweepOptions options;
    options.seed = 7;
    options.cases = 2000;
    const report::SweepStats st = report::oracle_sweep<TestType>(options);
    std::cout << "sweep " << st.summary() << "\n  worst: " << st.worst_summary << "\n";
    INFO(st.first_violation);
    CHECK(st.violations == 0);
    CHECK(st.worst_tightness >= 1e-2);
    CHECK(st.max_oracle_error_ratio <= oracle::max_oracle_error_ratio);
}
