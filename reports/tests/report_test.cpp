// The accuracy report: config strings, grids, seeded inputs, the JSON form, the drift margin, and the end-to-end
// proof that `attn report --check` fails when an implementation's error grows.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <unistd.h>

#include "attn/report/report.hpp"
#include "attn/suite/registry.hpp"

using namespace attn;
using namespace attn::report;
namespace fs = std::filesystem;

TEST_CASE("report rows are named by the suite's config string") {
    const Case c{"grid", 1, 2, 7, 9, 16, 8, MaskKind::CausalBottomRight, Distribution::NearTies, 1};
    CHECK(config_string(c, "reference", DType::Float) ==
          "sdpa(B=1,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dist=near-ties,impl=reference,dtype=float)");
    const Case big{"logit-scale", 1, 1, 4, 96, 32, 16, MaskKind::None, Distribution::LargeLogits, 64};
    CHECK(config_string(big, "tiled", DType::Double) ==
          "sdpa(B=1,H=1,Tq=4,Tk=96,Dk=32,Dv=16,mask=none,dist=large-logits,logit_std=64,impl=tiled,dtype=double)");
}

TEST_CASE("the quick grid covers what the report promises") {
    const auto cases = make_grid(GridKind::Quick);
    Index max_Tk = 0, max_Dk = 0;
    bool tq_ne_tk = false;
    std::set<std::pair<int, int>> dist_mask;
    std::set<std::string> names;
    for (const Case& c : cases) {
        max_Tk = std::max(max_Tk, c.Tk);
        max_Dk = std::max(max_Dk, c.Dk);
        tq_ne_tk |= c.Tq != c.Tk;
        dist_mask.insert({static_cast<int>(c.distribution), static_cast<int>(c.mask_kind)});
        CHECK(names.insert(case_string(c)).second);  // every case has its own name, hence its own seed
    }
    CHECK(max_Tk >= 4096);
    CHECK(max_Dk >= 512);
    CHECK(tq_ne_tk);
    CHECK(dist_mask.size() == 25);  // 5 distributions x 5 masks
    CHECK(make_grid(GridKind::Full).size() > cases.size());
}

TEST_CASE("inputs are seeded by the case: the same case gives the same bits") {
    const Case c{"grid", 2, 2, 7, 9, 16, 8, MaskKind::Random, Distribution::WideRange, 1};
    const auto a = make_inputs<double>(c), b = make_inputs<double>(c);
    for (Index i = 0; i < a.q.numel(); ++i) REQUIRE(a.q[i] == b.q[i]);
    for (Index i = 0; i < a.v.numel(); ++i) REQUIRE(a.v[i] == b.v[i]);
    REQUIRE(a.allowed_mask);
    // Every query row of the random mask reads at least one key.
    for (Index row = 0; row < 2 * 2 * 7; ++row) {
        bool any = false;
        for (Index j = 0; j < 9; ++j) any |= (*a.allowed_mask)[row * 9 + j];
        CHECK(any);
    }
}

template <class T>
void check_subnormal_values() {
    const Case c{"grid", 1, 1, 3, 5, 4, 4, MaskKind::None, Distribution::Subnormal, 1};
    const auto in = make_inputs<T>(c);
    Index subnormal = 0;
    for (Index i = 0; i < in.v.numel(); ++i) subnormal += std::fpclassify(in.v[i]) == FP_SUBNORMAL;
    CHECK(subnormal >= in.v.numel() / 2);
}

TEST_CASE("the subnormal distribution is subnormal in the dtype of the row") {
    check_subnormal_values<float>();
    check_subnormal_values<double>();
}

TEST_CASE("a row survives its JSON form, non-finite numbers included") {
    Row r;
    r.config = "sdpa(x)";
    r.impl = "reference";
    r.dtype = DType::Double;
    r.grid_case = {"tk", 1, 1, 3, 64, 64, 32, MaskKind::Padding, Distribution::LargeLogits, 16};
    r.max_ulp = std::numeric_limits<double>::infinity();
    r.p99_ulp = 1.5;
    r.max_tightness = 0.25;
    r.violations = 3;
    r.worst_index = {0, 0, 2, 31};
    r.error = "boom";
    const Row back = row_from_json(nlohmann::json::parse(to_json(r).dump()));
    CHECK(back.config == r.config);
    CHECK(back.dtype == DType::Double);
    CHECK(back.grid_case.mask_kind == MaskKind::Padding);
    CHECK(back.grid_case.Tk == 64);
    CHECK(std::isinf(back.max_ulp));
    CHECK(back.p99_ulp == 1.5);
    CHECK(back.worst_index == r.worst_index);
    CHECK(back.error == "boom");
    CHECK_THROWS_AS(row_from_json(nlohmann::json{{"config", "x"}}), IoError);
}

TEST_CASE("drift: growth within the margin passes, beyond it is a regression") {
    Row base;
    base.config = "sdpa(x)";
    base.max_ulp = 3;
    base.max_tightness = 0.1;
    base.tightness_per_ulp = 0.01;
    Row now = base;
    const DriftMargin margin;  // factor 2, plus 1 ulp
    now.max_ulp = 7;  // == 2 * 3 + 1
    now.max_tightness = 0.21;
    CHECK_FALSE(regressed(base, now, margin));
    now.max_ulp = 7.5;
    std::string why;
    CHECK(regressed(base, now, margin, &why));
    CHECK(why == "max ULP error 3 -> 7.5");
    now.max_ulp = 3;
    now.max_tightness = 0.2101;
    CHECK(regressed(base, now, margin));
    now.max_tightness = 0.1;
    now.violations = 1;
    CHECK(regressed(base, now, margin));
    now.violations = 0;
    now.max_ulp = std::numeric_limits<double>::quiet_NaN();
    CHECK(regressed(base, now, margin));

    const Drift d = compare_with_baseline({base}, {base, Row{}});
    CHECK(d.compared == 1);
    CHECK(d.identical_rows == 1);
    CHECK(d.new_rows == 1);
    CHECK(d.regressions.empty());
}

namespace {

// The reference backend with `perturb` applied to every output element: a deliberately degraded backend, for
// this test only (it is not in the registry).
template <class F>
suite::Implementation perturbed_reference(F perturb) {
    suite::Implementation impl = suite::implementation("reference");
    const auto push = [perturb](auto result) {
        for (Index i = 0; i < result.output.numel(); ++i) result.output[i] = perturb(result.output[i]);
        return result;
    };
    const auto run_float = impl.run_float;
    const auto run_double = impl.run_double;
    impl.run_float = [=](auto q, auto k, auto v, auto m, const SdpaOptions& o) { return push(run_float(q, k, v, m, o)); };
    impl.run_double = [=](auto q, auto k, auto v, auto m, const SdpaOptions& o) { return push(run_double(q, k, v, m, o)); };
    return impl;
}

// Four representable numbers further from zero.
const auto four_ulps_more = [](auto x) {
    using T = decltype(x);
    for (int n = 0; n < 4; ++n)
        x = std::nextafter(x, std::signbit(x) ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity());
    return x;
};

struct TempDir {
    fs::path path = fs::temp_directory_path() / ("attn-report-test-" + std::to_string(::getpid()));
    TempDir() { fs::create_directories(path); }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

ReportOptions smoke_options(const TempDir& dir) {
    ReportOptions o;
    o.grid = GridKind::Smoke;
    o.out_dir = (dir.path / "out").string();
    o.baseline_path = (dir.path / "baseline.json").string();
    o.check = true;
    o.plots = false;
    o.mutant_sweep = false;
    o.mutant_table = false;
    return o;
}

}  // namespace

TEST_CASE("attn report --check fails when a backend's error grows by a few ulps, and only then") {
    TempDir dir;
    std::ostringstream log;
    const suite::Implementation& reference = suite::implementation("reference");

    ReportOptions o = smoke_options(dir);
    o.update_baseline = true;
    const ReportRun first = run_report(o, {&reference}, {}, log);
    INFO(log.str());
    REQUIRE(first.exit_code == 0);
    REQUIRE(fs::exists(o.baseline_path));

    // Same binary, same inputs: bitwise the same errors, nothing flagged.
    o.update_baseline = false;
    const ReportRun again = run_report(o, {&reference}, {}, log);
    CHECK(again.exit_code == 0);
    CHECK(again.drift.compared == static_cast<Index>(first.rows.size()));
    CHECK(again.drift.identical_rows == again.drift.compared);
    CHECK(again.drift.regressions.empty());
    CHECK(fs::exists(fs::path(o.out_dir) / "accuracy.md"));
    CHECK(fs::exists(fs::path(o.out_dir) / "index.html"));

    // Four ulps more on every element of the same backend: rows whose error was below 3 ulps regress (in ulps or
    // in tightness, whichever element is now the worst).
    const suite::Implementation degraded = perturbed_reference(four_ulps_more);
    const ReportRun worse = run_report(o, {&degraded}, {}, log);
    CHECK(worse.exit_code == 1);
    CHECK_FALSE(worse.drift.regressions.empty());
    for (const RowDrift& d : worse.drift.regressions)
        CHECK((d.current_ulp > d.baseline_ulp || d.current_tightness > d.baseline_tightness));
}

TEST_CASE("attn report --check fails on a bound violation even without a baseline") {
    TempDir dir;
    std::ostringstream log;
    ReportOptions o = smoke_options(dir);
    o.baseline_path.clear();
    // A relative error of 2^-8 is far outside any bound of these small shapes, in float and in double.
    const suite::Implementation broken = perturbed_reference([](auto x) { return x + x * decltype(x)(0x1.0p-8); });
    const ReportRun run = run_report(o, {&broken}, {}, log);
    CHECK(run.exit_code == 1);
    Index violations = 0;
    for (const Row& r : run.rows) violations += r.violations;
    CHECK(violations > 0);
}
