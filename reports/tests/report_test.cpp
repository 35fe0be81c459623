// The accuracy report: config strings, grids, seeded inputs, the JSON form, the drift margin, and the end-to-end
// proof that `attn report --check` fails when an implementation's error grows against the baseline of its numerics
// fingerprint, and only then.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <unistd.h>

#include "attn/report/report.hpp"
#include "attn/suite/recipe.hpp"
#include "attn/suite/registry.hpp"

using namespace attn;
using namespace attn::report;
namespace fs = std::filesystem;

namespace {

// FNV-1a 64 (Fowler, Noll, Vo), written out again here so the seed recipe is checked against the definition.
std::uint64_t fnv1a_64(const std::string& s) {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

std::string hex(std::uint64_t x) {
    std::ostringstream s;
    s << "0x" << std::hex << x;
    return s.str();
}

}  // namespace

TEST_CASE("report rows are named by the suite's config string, with the seed of their inputs") {
    CHECK(fnv1a_64("a") == 0xaf63dc4c8601ec8cull);  // the published FNV-1a 64 test vector
    const Case c{"grid", 1, 2, 7, 9, 16, 8, MaskKind::CausalBottomRight, Distribution::NearTies, 1};
    CHECK(seed_text(c) == "sdpa(B=1,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dist=near-ties)");
    CHECK(config_string(c, "reference", Dtype::Float) ==
          "sdpa(B=1,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dtype=float,values=near-ties,seed=" +
              hex(fnv1a_64(seed_text(c))) + ",empty_rows=zero,impl=reference)");
    const Case big{"logit-scale", 1, 1, 4, 96, 32, 16, MaskKind::None, Distribution::LargeLogits, 64};
    CHECK(seed_text(big) == "sdpa(B=1,H=1,Tq=4,Tk=96,Dk=32,Dv=16,mask=none,dist=large-logits,logit_std=64)");
    CHECK(config_string(big, "tiled", Dtype::Double) ==
          "sdpa(B=1,H=1,Tq=4,Tk=96,Dk=32,Dv=16,mask=none,dtype=double,values=large-logits,logit_std=64,seed=" +
              hex(fnv1a_64(seed_text(big))) + ",empty_rows=zero,impl=tiled)");
    const Case pad{"grid", 2, 2, 7, 9, 16, 8, MaskKind::Padding, Distribution::Normal, 16};
    CHECK(config_string(pad, "mha", Dtype::Float) ==
          "sdpa(B=2,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=padding-r4,dtype=float,seed=" + hex(fnv1a_64(seed_text(pad))) +
              ",empty_rows=zero,impl=mha)");
}

TEST_CASE("the quick grid covers what the report promises") {
    const auto cases = make_grid(GridKind::Quick);
    Index max_Tk = 0, max_Dk = 0;
    bool tq_ne_tk = false, saturated_cap = false;
    std::set<std::pair<int, int>> dist_mask;
    std::set<std::string> names;
    for (const Case& c : cases) {
        max_Tk = std::max(max_Tk, c.Tk);
        max_Dk = std::max(max_Dk, c.Dk);
        tq_ne_tk |= c.Tq != c.Tk;
        saturated_cap |= c.softcap > 0 && c.softcap * 10 <= c.logit_std;  // softcap near saturation
        dist_mask.insert({static_cast<int>(c.distribution), static_cast<int>(c.mask_kind)});
        CHECK(names.insert(seed_text(c)).second);  // every case has its own name, hence its own seed
    }
    CHECK(max_Tk >= 4096);
    CHECK(max_Dk >= 512);
    CHECK(tq_ne_tk);
    CHECK(saturated_cap);
    CHECK(dist_mask.size() == 30);  // 5 distributions x 6 masks (none, causal tl/br, padding, random, window)
    CHECK(make_grid(GridKind::Full).size() > cases.size());
}

TEST_CASE("inputs are seeded by the case: the same case gives the same bits") {
    const Case c{"grid", 2, 2, 7, 9, 16, 8, MaskKind::Random, Distribution::WideRange, 1};
    const suite::SdpaCase a = suite::make_case(row_config(c, "tiled", Dtype::Double));
    const suite::SdpaCase b = suite::make_case(row_config(c, "reference", Dtype::Double));
    for (Index i = 0; i < a.q.numel(); ++i) REQUIRE(a.q[i] == b.q[i]);
    for (Index i = 0; i < a.v.numel(); ++i) REQUIRE(a.v[i] == b.v[i]);
    REQUIRE(a.allowed_mask);
    CHECK(a.allowed_mask->shape() == Shape{2, 2, 7, 9});
    // Every query row of the random mask reads at least one key.
    for (Index row = 0; row < 2 * 2 * 7; ++row) {
        bool any = false;
        for (Index j = 0; j < 9; ++j) any |= (*a.allowed_mask)[row * 9 + j];
        CHECK(any);
    }
    // The float row sees the same draws, rounded to float.
    const suite::SdpaCase f = suite::make_case(row_config(c, "tiled", Dtype::Float));
    for (Index i = 0; i < a.q.numel(); ++i) REQUIRE(f.q[i] == static_cast<double>(static_cast<float>(a.q[i])));
}

template <class T>
void check_subnormal_values() {
    const Case c{"grid", 1, 1, 3, 5, 4, 4, MaskKind::None, Distribution::Subnormal, 1};
    const auto in = suite::make_inputs<T>(
        suite::make_case(row_config(c, "reference", std::is_same_v<T, float> ? Dtype::Float : Dtype::Double)));
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
    r.impl = "reference";
    r.dtype = Dtype::Double;
    r.grid_case = {"tk", 1, 1, 3, 64, 64, 32, MaskKind::Padding, Distribution::LargeLogits, 16};
    r.grid_case.bias = "keys";
    r.config = config_string(r.grid_case, r.impl, r.dtype);
    r.max_ulp = std::numeric_limits<double>::infinity();
    r.p99_ulp = 1.5;
    r.max_tightness = 0.25;
    r.violations = 3;
    r.worst_index = {0, 0, 2, 31};
    r.error = "boom";
    const Row back = row_from_json(nlohmann::json::parse(to_json(r).dump()));
    CHECK(back.config == r.config);
    // The case, the implementation and the dtype come back from the config string alone.
    CHECK(back.impl == "reference");
    CHECK(back.dtype == Dtype::Double);
    CHECK(back.grid_case.sweep == "tk");
    CHECK(back.grid_case.mask_kind == MaskKind::Padding);
    CHECK(back.grid_case.distribution == Distribution::LargeLogits);
    CHECK(back.grid_case.logit_std == 16);
    CHECK(back.grid_case.bias == "keys");
    CHECK(back.grid_case.Tq == 3);
    CHECK(back.grid_case.Tk == 64);
    CHECK(back.grid_case.Dv == 32);
    CHECK(std::isinf(back.max_ulp));
    CHECK(back.p99_ulp == 1.5);
    CHECK(back.worst_index == r.worst_index);
    CHECK(back.error == "boom");
    CHECK_THROWS_AS(row_from_json(nlohmann::json{{"config", "x"}}), IoError);
    nlohmann::json unparsable = to_json(r);
    unparsable["config"] = "sdpa(x)";
    CHECK_THROWS_AS(row_from_json(unparsable), IoError);
}

TEST_CASE("a row of schema 2, with its case written out, is still read") {
    Row r;
    r.grid_case = {"grid", 2, 2, 7, 9, 16, 8, MaskKind::Random, Distribution::NearTies, 16};
    r.config = config_string(r.grid_case, "tiled", Dtype::Float);
    nlohmann::json j = to_json(r);
    // Schema 2's fields, deliberately other than the config string's: they are the ones read.
    j.update({{"impl", "reference"}, {"dtype", "double"}, {"B", 3}, {"H", 1}, {"Tq", 5}, {"Tk", 6}, {"Dk", 4},
              {"Dv", 2}, {"mask", "none"}, {"dist", "normal"}, {"logit_std", 1.0}});
    const Row back = row_from_json(j);
    CHECK(back.impl == "reference");
    CHECK(back.dtype == Dtype::Double);
    CHECK(back.grid_case.B == 3);
    CHECK(back.grid_case.mask_kind == MaskKind::None);
    CHECK(back.grid_case.bias == "none");
}

TEST_CASE("drift: tightness growth or fall within the margin passes, beyond it is a regression; ULP growth alone is not") {
    Row base;
    base.config = "sdpa(x)";
    base.max_ulp = 3;
    base.max_tightness = 0.1;
    base.tightness_per_ulp = 0.01;
    Row now = base;
    const DriftMargin margin;  // factor 2, plus 1 ulp
    now.max_tightness = 0.21;  // == 2 * 0.1 + 0.01
    CHECK_FALSE(regressed(base, now, margin));
    // An output that cancels to almost nothing: thousands of ulps more, the error relative to its bound unchanged.
    now.max_ulp = 7760;
    CHECK_FALSE(regressed(base, now, margin));
    now.max_tightness = 0.2101;
    std::string why;
    CHECK(regressed(base, now, margin, &why));
    CHECK(why == "max tightness 0.1 -> 0.2101");
    now.max_ulp = 3;
    now.max_tightness = 0.1;
    now.violations = 1;
    CHECK(regressed(base, now, margin));
    now.violations = 0;
    now.max_tightness = std::numeric_limits<double>::quiet_NaN();
    CHECK(regressed(base, now, margin));
    now.max_tightness = 0.1;
    now.error = "threw";
    CHECK(regressed(base, now, margin, &why));
    CHECK(why == "now fails: threw");

    // A bound that loosened 1000x (same bits, same error): the tightness falls by 1000, and its ulp with it.
    now = base;
    now.max_tightness = base.max_tightness / 1000;
    now.tightness_per_ulp = base.tightness_per_ulp / 1000;
    CHECK(regressed(base, now, margin, &why));
    CHECK(why == "max tightness fell 0.1 -> 0.0001 (the bound loosened, or the error shrank)");
    // A fall within the margin (the same 1 ulp granularity, the factor 2) is noise.
    now.max_tightness = 0.046;
    now.tightness_per_ulp = 0.01;
    CHECK_FALSE(regressed(base, now, margin));

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

// The smoke grid into a temporary directory, baselines under it: never the committed reports/.
ReportOptions smoke_options(const TempDir& dir) {
    ReportOptions o;
    o.grid = GridKind::Smoke;
    o.out_dir = (dir.path / "out").string();
    o.baselines_dir = (dir.path / "baselines").string();
    o.check = true;
    o.plots = false;
    o.mutant_sweep = false;
    o.mutant_table = false;
    o.command = "attn report --grid smoke";
    return o;
}

// Where run_report looks for the baseline of this machine.
fs::path own_baseline(const ReportOptions& o) {
    return fs::path(o.baselines_dir) / (numerics_fingerprint().id() + ".json");
}

nlohmann::json read_json(const fs::path& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
}

void write_json(const fs::path& path, const nlohmann::json& j) {
    std::ofstream out(path);
    out << j.dump(1) << "\n";
    REQUIRE(out.good());
}

std::string read_text(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// Records the baseline of this fingerprint with the reference backend; returns its JSON.
nlohmann::json record_baseline(ReportOptions o) {
    std::ostringstream log;
    o.update_baseline = true;
    const ReportRun run = run_report(o, {&suite::implementation("reference")}, {}, log);
    INFO(log.str());
    REQUIRE(run.exit_code == 0);
    REQUIRE(fs::exists(own_baseline(o)));
    return read_json(own_baseline(o));
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
    REQUIRE(fs::exists(own_baseline(o)));
    // --update-baseline also leaves the run as the latest report.
    CHECK(fs::exists(fs::path(o.out_dir) / "accuracy.json"));

    // Same binary, same inputs, same fingerprint: bitwise the same errors, nothing flagged.
    o.update_baseline = false;
    const ReportRun again = run_report(o, {&reference}, {}, log);
    CHECK(again.exit_code == 0);
    CHECK(again.drift.checked);
    // Every forward row and every case's dq, dk and dv.
    Index gradient_rows = 0;
    for (const ReportRun::GradientSummary& g : first.gradients) gradient_rows += 3 * g.cases;
    CHECK(gradient_rows > 0);
    CHECK(again.drift.compared == static_cast<Index>(first.rows.size()) + gradient_rows);
    CHECK(again.drift.identical_rows == again.drift.compared);
    CHECK(again.drift.regressions.empty());
    CHECK(fs::exists(fs::path(o.out_dir) / "accuracy.md"));
    CHECK(fs::exists(fs::path(o.out_dir) / "index.html"));

    // Four ulps more on every element of the same backend: rows whose error at the worst element was below about
    // 3 ulps regress, in tightness (or in bound violations where the bound is that tight).
    const suite::Implementation degraded = perturbed_reference(four_ulps_more);
    const ReportRun worse = run_report(o, {&degraded}, {}, log);
    CHECK(worse.exit_code == 1);
    CHECK_FALSE(worse.drift.regressions.empty());
    for (const RowDrift& d : worse.drift.regressions)
        CHECK((d.current_tightness > d.baseline_tightness || d.reason.rfind("bound violations", 0) == 0));

    // The same four ulps on dq only: the forward rows are as they were, and gradient rows ("dq <case>") regress.
    suite::Implementation worse_dq = suite::implementation("reference");
    const auto backward_float = worse_dq.backward_float;
    const auto backward_double = worse_dq.backward_double;
    const auto push = [](auto g) {
        for (Index i = 0; i < g.dq.numel(); ++i) g.dq[i] = four_ulps_more(g.dq[i]);
        return g;
    };
    worse_dq.backward_float = [=](auto q, auto k, auto v, auto d, auto m, const SdpaOptions& o) {
        return push(backward_float(q, k, v, d, m, o));
    };
    worse_dq.backward_double = [=](auto q, auto k, auto v, auto d, auto m, const SdpaOptions& o) {
        return push(backward_double(q, k, v, d, m, o));
    };
    const ReportRun gradient_worse = run_report(o, {&worse_dq}, {}, log);
    CHECK(gradient_worse.exit_code == 1);
    REQUIRE_FALSE(gradient_worse.drift.regressions.empty());
    for (const RowDrift& d : gradient_worse.drift.regressions) CHECK(d.config.rfind("dq ", 0) == 0);
}

TEST_CASE("attn report --check passes without a baseline for this fingerprint and says drift was not checked") {
    TempDir dir;
    std::ostringstream log;
    const ReportOptions o = smoke_options(dir);
    const ReportRun run = run_report(o, {&suite::implementation("reference")}, {}, log);
    INFO(log.str());
    const std::string id = numerics_fingerprint().id();
    CHECK(run.exit_code == 0);
    CHECK_FALSE(run.drift.baseline_found);
    CHECK_FALSE(run.drift.checked);
    CHECK(run.drift.fingerprint == id);
    const std::string expected = "drift not checked: no baseline for fingerprint " + id + " (" +
                                 own_baseline(o).string() +
                                 "); record one with: ./attn report --grid smoke --update-baseline";
    CHECK(log.str().find(expected + "\n") != std::string::npos);
    CHECK(log.str().find("attn report --check: passed") != std::string::npos);
    // The report says it too, and names the machine.
    const std::string md = read_text(fs::path(o.out_dir) / "accuracy.md");
    CHECK(md.find("drift not checked: no baseline for fingerprint `" + id + "`") != std::string::npos);
    CHECK(md.find("## Machine") != std::string::npos);
    const nlohmann::json j = read_json(fs::path(o.out_dir) / "accuracy.json");
    CHECK(j.at("fingerprint").at("id") == id);
    for (const auto& [name, value] : numerics_fingerprint().fields()) CHECK(j.at("fingerprint").at(name) == value);
    // Without --update-baseline nothing is recorded.
    CHECK_FALSE(fs::exists(own_baseline(o)));
}

TEST_CASE("attn report does not compare drift with a baseline of another fingerprint, and says so") {
    TempDir dir;
    const ReportOptions recorded = smoke_options(dir);
    nlohmann::json baseline = record_baseline(recorded);
    const std::string id = numerics_fingerprint().id();
    // Every row of the baseline perfectly accurate: compared, every row with an error would regress.
    for (auto& row : baseline["rows"]) row["max_tightness"] = 0.0;
    const fs::path same = dir.path / "same.json", other = dir.path / "other.json", old = dir.path / "old.json";
    write_json(same, baseline);
    baseline["fingerprint"]["id"] = "zen3-avx2-0123abcd";
    write_json(other, baseline);
    baseline.erase("fingerprint");  // schema 1: made before fingerprints were recorded
    baseline["schema"] = "attn-accuracy/1";
    write_json(old, baseline);
    const suite::Implementation& reference = suite::implementation("reference");

    ReportOptions o = recorded;
    o.baseline_path = same.string();
    std::ostringstream same_log;
    const ReportRun compared = run_report(o, {&reference}, {}, same_log);
    CHECK(compared.drift.checked);
    CHECK(compared.exit_code == 1);  // the control: these rows are flagged when the fingerprint matches

    o.baseline_path = other.string();
    std::ostringstream other_log;
    const ReportRun elsewhere = run_report(o, {&reference}, {}, other_log);
    INFO(other_log.str());
    CHECK(elsewhere.exit_code == 0);
    CHECK(elsewhere.drift.baseline_found);
    CHECK_FALSE(elsewhere.drift.checked);
    CHECK(elsewhere.drift.baseline_fingerprint == "zen3-avx2-0123abcd");
    CHECK(elsewhere.drift.compared == 0);
    CHECK(elsewhere.drift.regressions.empty());
    CHECK(other_log.str().find("drift not checked: the baseline " + other.string() +
                               " was made on fingerprint zen3-avx2-0123abcd, not on this machine's " + id) !=
          std::string::npos);

    o.baseline_path = old.string();
    std::ostringstream old_log;
    const ReportRun unknown = run_report(o, {&reference}, {}, old_log);
    CHECK(unknown.exit_code == 0);
    CHECK_FALSE(unknown.drift.checked);
    CHECK(old_log.str().find("drift not checked: the baseline " + old.string() + " records no fingerprint") !=
          std::string::npos);
}

TEST_CASE("a row whose tightness grows beyond the margin is flagged against its fingerprint's baseline") {
    TempDir dir;
    const ReportOptions o = smoke_options(dir);
    nlohmann::json baseline = record_baseline(o);
    // One row with an error well above its last ulp gets a baseline a quarter as tight (this run is then 4 x the
    // baseline, beyond 2 x + 1 ulp); another row gets a baseline of 0 ulps where it has several (beyond the old
    // 2 x + 1 ulp rule on max ULP error), its tightness unchanged.
    std::string tighter, more_ulps;
    for (auto& row : baseline["rows"]) {
        const double t = number_from_json(row["max_tightness"]), per_ulp = number_from_json(row["tightness_per_ulp"]);
        if (tighter.empty() && row["error"].is_null() && std::isfinite(t) && t > 4 * per_ulp && per_ulp > 0) {
            tighter = row["config"].get<std::string>();
            row["max_tightness"] = t / 4;
        } else if (more_ulps.empty() && number_from_json(row["max_ulp"]) >= 2) {
            more_ulps = row["config"].get<std::string>();
            row["max_ulp"] = 0.0;
        }
    }
    REQUIRE_FALSE(tighter.empty());
    REQUIRE_FALSE(more_ulps.empty());
    write_json(own_baseline(o), baseline);

    std::ostringstream log;
    const ReportRun run = run_report(o, {&suite::implementation("reference")}, {}, log);
    INFO(log.str());
    CHECK(run.drift.checked);
    CHECK(run.exit_code == 1);
    REQUIRE(run.drift.regressions.size() == 1);
    CHECK(run.drift.regressions[0].config == tighter);
    CHECK(run.drift.regressions[0].reason.rfind("max tightness ", 0) == 0);
    CHECK(log.str().find("REGRESSED " + tighter + ": max tightness") != std::string::npos);
    CHECK(log.str().find("REGRESSED " + more_ulps) == std::string::npos);

    // The printed reproduction reruns exactly that row: one row, the same measurement, flagged again.
    CHECK(log.str().find("  reproduce: ./attn report --grid smoke --check --no-mutants --no-plots --filter '" + tighter +
                         "'\n") != std::string::npos);
    ReportOptions one = o;
    one.filter = tighter;
    std::ostringstream one_log;
    const ReportRun rerun = run_report(one, {&suite::implementation("reference")}, {}, one_log);
    REQUIRE(rerun.rows.size() == 1);
    CHECK(rerun.rows[0].config == tighter);
    CHECK(rerun.exit_code == 1);
    REQUIRE(rerun.drift.regressions.size() == 1);
    CHECK(rerun.drift.compared == 1);  // only the baseline rows that match the filter
    for (const Row& r : run.rows)
        if (r.config == tighter) CHECK(r.max_tightness == rerun.rows[0].max_tightness);
}

TEST_CASE("attn report --filter selects rows by fields and refuses what it cannot do") {
    TempDir dir;
    ReportOptions o = smoke_options(dir);
    o.filter = "impl=reference,dtype=float,mask=padding";
    std::ostringstream log;
    const ReportRun run = run_report(o, {&suite::implementation("reference"), &suite::implementation("tiled")}, {}, log);
    REQUIRE_FALSE(run.rows.empty());
    for (const Row& r : run.rows) {
        CHECK(r.impl == "reference");
        CHECK(r.dtype == Dtype::Float);
        CHECK(r.grid_case.mask_kind == MaskKind::Padding);
    }
    o.filter = "impl=nobody";
    CHECK_THROWS_AS(run_report(o, {&suite::implementation("reference")}, {}, log), ConfigError);
    o.filter = "colour=red";
    CHECK_THROWS_AS(run_report(o, {&suite::implementation("reference")}, {}, log), ConfigError);
    o.filter = "impl=reference";
    o.update_baseline = true;
    CHECK_THROWS_AS(run_report(o, {&suite::implementation("reference")}, {}, log), ConfigError);
}

TEST_CASE("attn report --check fails on a bound violation even without a baseline") {
    TempDir dir;
    std::ostringstream log;
    const ReportOptions o = smoke_options(dir);
    // A relative error of 2^-8 is far outside any bound of these small shapes, in float and in double.
    const suite::Implementation broken = perturbed_reference([](auto x) { return x + x * decltype(x)(0x1.0p-8); });
    const ReportRun run = run_report(o, {&broken}, {}, log);
    INFO(log.str());
    CHECK(run.exit_code == 1);
    CHECK_FALSE(run.drift.checked);
    Index violations = 0;
    for (const Row& r : run.rows) violations += r.violations;
    CHECK(violations > 0);
    CHECK(log.str().find("drift not checked: no baseline") != std::string::npos);
    CHECK(log.str().find("attn report --check: FAILED") != std::string::npos);

    // Every failed row is printed with the command that reruns it; rerun, it fails the same way.
    const Row* failed = nullptr;
    for (const Row& r : run.rows)
        if (!failed && r.violations > 0) failed = &r;
    REQUIRE(failed);
    CHECK(log.str().find("FAILED " + failed->config) != std::string::npos);
    CHECK(log.str().find("reproduce: " + reproduce_command(o, failed->config)) != std::string::npos);
    ReportOptions one = o;
    one.filter = failed->config;
    std::ostringstream one_log;
    const ReportRun rerun = run_report(one, {&broken}, {}, one_log);
    REQUIRE(rerun.rows.size() == 1);
    CHECK(rerun.exit_code == 1);
    CHECK(rerun.rows[0].violations == failed->violations);
    CHECK(rerun.rows[0].worst_index == failed->worst_index);
    CHECK(rerun.rows[0].worst_computed == failed->worst_computed);
}
