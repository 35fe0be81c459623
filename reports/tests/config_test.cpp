// Config strings round-trip: every string the suite and the report write parses back and is written again
// identically, a report row's config names its inputs exactly, and malformed strings are refused by name.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "attn/options.hpp"
#include "attn/report/report.hpp"
#include "attn/suite/case.hpp"
#include "attn/suite/config.hpp"
#include "attn/suite/recipe.hpp"
#include "attn/suite/registry.hpp"
#include "generators.hpp"

using namespace attn;
using namespace attn::suite;
namespace fs = std::filesystem;

namespace {

void require_round_trip(const std::string& config) {
    INFO(config);
    const CaseConfig parsed = parse_config(config);
    REQUIRE(parsed.to_config() == config);
    REQUIRE(parse_config(parsed.to_config()) == parsed);
}

}  // namespace

TEST_CASE("every config string of the report's grids round-trips") {
    Index n = 0;
    for (report::GridKind grid : {report::GridKind::Smoke, report::GridKind::Quick, report::GridKind::Full})
        for (const report::Case& c : report::make_grid(grid))
            for (const Implementation* impl : correct_implementations())
                for (Dtype dtype : {Dtype::Float, Dtype::Double}) {
                    const std::string config = report::config_string(c, impl->name, dtype);
                    require_round_trip(config);
                    REQUIRE(parse_config(config) == report::row_config(c, impl->name, dtype));
                    ++n;
                }
    CHECK(n > 1000);
}

TEST_CASE("every config string of the property generator round-trips") {
    // The generator's cases outside a property run: RapidCheck generators are callable with a Random and a size.
    for (Dtype dtype : {Dtype::Float, Dtype::Double})
        for (gen::Masks masks : {gen::Masks::Any, gen::Masks::Explicit, gen::Masks::Broadcast, gen::Masks::EmptyRows}) {
            gen::CaseSpec spec;
            spec.masks = masks;
            const rc::Gen<SdpaCase> g = gen::sdpa_case(dtype, spec);
            for (int k = 0; k < 150; ++k) {
                const SdpaCase c = g(rc::Random(static_cast<std::uint64_t>(1000 * k + 7)), k % 100).value();
                for (const Implementation& impl : implementations()) require_round_trip(config_string(c, impl.name));
            }
        }
}

TEST_CASE("every regression case file's config and file name round-trip") {
    Index n = 0;
    for (const auto& entry : fs::directory_iterator("regressions/cases")) {
        if (entry.path().extension() != ".json") continue;
        std::ifstream in(entry.path());
        std::stringstream text;
        text << in.rdbuf();
        const CaseFile f = case_from_json(text.str(), entry.path().string());
        const std::string name = entry.path().filename().string();
        const std::string stem = name.substr(0, name.find(")." ) + 1);  // <config>.<property>.json
        require_round_trip(stem);
        const std::string impl = f.implementation == "*" ? "all" : f.implementation;
        CHECK(stem == config_string(f.sdpa, impl));
        ++n;
    }
    CHECK(n >= 10);
}

TEST_CASE("a report row's config string names its inputs: make_case redraws them bit for bit") {
    const report::Case c{"grid", 2, 2, 7, 9, 16, 8, report::MaskKind::Padding, report::Distribution::LargeLogits, 16};
    const std::string config = report::config_string(c, "tiled", Dtype::Float);
    const SdpaCase a = make_case(parse_config(config));
    const SdpaCase b = make_case(report::row_config(c, "tiled", Dtype::Float));
    REQUIRE(a.q.numel() == 2 * 2 * 7 * 16);
    for (Index i = 0; i < a.q.numel(); ++i) REQUIRE(a.q[i] == b.q[i]);
    for (Index i = 0; i < a.k.numel(); ++i) REQUIRE(a.k[i] == b.k[i]);
    for (Index i = 0; i < a.v.numel(); ++i) REQUIRE(a.v[i] == b.v[i]);
    REQUIRE(a.allowed_mask);
    CHECK(a.allowed_mask->shape() == Shape{2, 1, 1, 9});
    CHECK(a.options.empty_rows == EmptyRowPolicy::Zero);
    // The case made from the config is named by that config again.
    CHECK(config_string(a, "tiled") == config);
}

TEST_CASE("the canonical form: defaults left out, any field order accepted, floats written as floats") {
    const CaseConfig c =
        parse_config("sdpa(impl=tiled,dtype=float,B=2,H=4,Tq=3,Tk=5,Dk=8,Dv=8,mask=random-r3-stride0,values=normal,"
                     "empty_rows=throw,check_finite=on,threads=0,scale=0.3)");
    CHECK(c.mask == "random");
    CHECK(c.mask_rank == 3);
    CHECK(c.mask_stride0);
    CHECK(c.kv_heads == 4);
    CHECK(c.scale == static_cast<double>(0.3f));
    CHECK(c.to_config() == "sdpa(B=2,H=4,Tq=3,Tk=5,Dk=8,Dv=8,mask=random-r3-stride0,dtype=float,scale=0.3,impl=tiled)");
    // A double scale keeps every digit it needs.
    CHECK(parse_config("sdpa(B=1,H=1,Tq=1,Tk=1,Dk=1,Dv=1,mask=none,dtype=double,scale=0.1,impl=x)").scale == 0.1);
    CaseConfig d = c;
    d.dtype = Dtype::Double;
    d.scale = 1.0 / 3.0;
    CHECK(parse_config(d.to_config()).scale == 1.0 / 3.0);
    d.seed = 0xfedcba9876543210ull;
    CHECK(parse_config(d.to_config()).seed == 0xfedcba9876543210ull);
}

TEST_CASE("every option the option table gives a config key is a field of the config string, by that key") {
    // A value of each such option other than its default, written by to_config under the table's key and read back.
    const std::map<std::string, std::string> value = {{"scale", "0.5"},       {"softcap", "30"},
                                                      {"bias", "large"},      {"alibi_slopes", "heads"},
                                                      {"empty_rows", "zero"}, {"check_finite", "off"},
                                                      {"num_threads", "2"},   {"window", "4:1:br"}};
    int keyed = 0;
    for (const OptionSpec& spec : option_table()) {
        if (std::string(spec.config).empty()) continue;
        ++keyed;
        INFO(spec.field << " (config key " << spec.config << ")");
        REQUIRE(value.count(spec.field));
        const std::string field = std::string(spec.config) + "=" + value.at(spec.field);
        const std::string text = "sdpa(B=1,H=1,Tq=1,Tk=1,Dk=1,Dv=1,mask=none,dtype=double," + field + ",impl=tiled)";
        const std::string written = parse_config(text).to_config();
        CHECK_THAT(written, Catch::Contains("," + field + ","));
    }
    CHECK(keyed == static_cast<int>(value.size()));
}

TEST_CASE("malformed config strings are refused with the field named") {
    const auto refused = [](const std::string& text, const std::string& says) {
        INFO(text);
        try {
            (void)parse_config(text);
            FAIL("accepted");
        } catch (const ConfigError& e) {
            CHECK_THAT(e.what(), Catch::Contains(says));
        }
    };
    const std::string ok = "B=1,H=1,Tq=1,Tk=1,Dk=1,Dv=1,mask=none,dtype=float,impl=tiled";
    refused("sdpa(" + ok + ",colour=red)", "unknown field 'colour'");
    refused("sdpa(" + ok + ",B=2)", "field B given twice");
    refused("sdpa(H=1,Tq=1,Tk=1,Dk=1,Dv=1,mask=none,dtype=float,impl=tiled)", "field B is missing");
    refused("sdpa(" + ok.substr(0, ok.size() - 11) + ")", "field impl is missing");
    refused("sdpa(B=x,H=1,Tq=1,Tk=1,Dk=1,Dv=1,mask=none,dtype=float,impl=tiled)", "B=x is not an integer");
    refused("sdpa(" + ok + ",dtype=half)", "given twice");
    refused("sdpa(B=1,H=1,Tq=1,Tk=1,Dk=1,Dv=1,mask=none,dtype=half,impl=tiled)", "dtype=half");
    refused("sdpa(" + ok + ",seed=12)", "seed must be 0x<hex>");
    refused("sdpa(" + ok + ",scale=inf)", "scale=inf is not a finite number");
    refused("sdpa(" + ok + ",threads)", "'threads' is not field=value");
    refused("sdpa(" + ok, "expected op(field=value,...)");
    refused("impl=tiled", "expected op(field=value,...)");
}

TEST_CASE("filters select by fields, defaults and bare mask kinds included") {
    const std::string row = "sdpa(B=1,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=random-r4,dtype=float,seed=0x1f,empty_rows=zero,impl=tiled)";
    CHECK(config_matches(row, ""));
    CHECK(config_matches(row, row));
    CHECK_FALSE(config_matches(row, "sdpa(B=1)"));
    CHECK(config_matches(row, "impl=tiled"));
    CHECK(config_matches(row, "impl=tiled,dtype=float,Tk=9"));
    CHECK_FALSE(config_matches(row, "impl=tiled,dtype=double"));
    CHECK(config_matches(row, "mask=random"));
    CHECK(config_matches(row, "mask=random-r4"));
    CHECK_FALSE(config_matches(row, "mask=padding"));
    CHECK(config_matches(row, "values=normal"));
    CHECK(config_matches(row, "kv_heads=2,check_finite=on,threads=0"));
    CHECK_THROWS_AS(config_matches(row, "colour=red"), ConfigError);
    CHECK_NOTHROW(check_filter(""));
    CHECK_NOTHROW(check_filter("impl=tiled,mask=random"));
    CHECK_NOTHROW(check_filter(row));
    CHECK_THROWS_AS(check_filter("impl=tiled,colour=red"), ConfigError);
    CHECK_THROWS_AS(check_filter("sdpa(B=1)"), ConfigError);  // a whole config string must be one
    // Alternatives: any of them.
    CHECK(config_matches(row, "impl=reference|mask=random"));
    CHECK(config_matches(row, "impl=tiled,dtype=double|" + row));
    CHECK_FALSE(config_matches(row, "impl=reference|mask=padding"));
    CHECK_NOTHROW(check_filter("impl=blis|mask=window,Tq=16384"));
    CHECK_THROWS_AS(check_filter("impl=blis|"), ConfigError);
    CHECK_THROWS_AS(check_filter("impl=blis|colour=red"), ConfigError);
}
