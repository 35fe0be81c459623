// The option table and the spellings (attn/options.hpp): one row per field, names that do not collide, defaults
// that are the structs' defaults, and the default scale rule.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>

#include "attn/mha.hpp"
#include "attn/options.hpp"
#include "attn/sdpa.hpp"

using namespace attn;

TEST_CASE("every field has one row, and no two rows share a name in an interface", "[options]") {
    std::set<std::string> fields, python, config;
    for (const OptionSpec& o : option_table()) {
        CHECK(fields.insert(o.field).second);
        if (*o.python) CHECK(python.insert(o.python).second);
        if (*o.config) CHECK(config.insert(o.config).second);
        CHECK(std::string(o.help).size() > 10);
        CHECK(&option_spec(o.field) == &o);
    }
    CHECK_THROWS_AS(option_spec("no_such_option"), std::logic_error);
    // Two commands use --weights for two fields (SDPA's weights, the module's), never one command both.
    CHECK(std::string(option_spec("return_weights").cli) == option_spec("weights").cli);
}

TEST_CASE("the spellings are unique across the enumerations and parse back", "[options]") {
    std::set<std::string> names;
    for (const auto& s : empty_row_spellings) CHECK(names.insert(s.name).second);
    for (const auto& s : backend_spellings) CHECK(names.insert(s.name).second);
    for (const auto& s : alignment_spellings) CHECK(names.insert(s.name).second);
    for (const auto& s : empty_row_spellings) CHECK(parse_spelling<EmptyRowPolicy>(s.name, "f", "empty_rows") == s.value);
    for (const auto& s : backend_spellings) CHECK(parse_spelling<Backend>(s.name, "f", "backend") == s.value);
    CHECK(std::string(to_string(EmptyRowPolicy::Nan)) == "nan");
    CHECK(std::string(to_string(Backend::Tiled)) == "tiled");
    CHECK(std::string(to_string(CausalAlignment::BottomRight)) == "bottom-right");
    try {
        parse_spelling<EmptyRowPolicy>("none", "attn.sdpa", "empty_rows");
        FAIL("no error");
    } catch (const ConfigError& e) {
        CHECK(std::string(e.what()) == "attn.sdpa: empty_rows must be throw, zero or nan, got 'none'");
    }
}

TEST_CASE("the table's defaults are the structs' defaults", "[options]") {
    const AttentionOptions o;
    CHECK(option_spec("empty_rows").default_text == std::string(to_string(o.empty_rows)));
    CHECK(option_spec("backend").default_text == std::string(to_string(o.backend)));
    CHECK(option_spec("window.alignment").default_text == std::string(to_string(SlidingWindow{}.alignment)));
    CHECK(option_spec("num_threads").default_text == std::to_string(o.num_threads));
    CHECK(option_spec("softcap").default_text == std::string(o.softcap == 0 ? "0" : "?"));
    CHECK(option_spec("check_finite").default_text == std::string(o.check_finite ? "on" : "off"));
    CHECK(!o.scale);
    // SDPA and the module share the fields themselves, not copies of them.
    STATIC_REQUIRE(std::is_base_of_v<AttentionOptions, SdpaOptions>);
    STATIC_REQUIRE(std::is_base_of_v<AttentionOptions, MhaOptions>);
}

TEST_CASE("the default scale is 1/sqrt(Dk), and 1 where no logit exists", "[options]") {
    CHECK(default_scale(64) == 0.125);
    CHECK(default_scale(3) == 1.0 / std::sqrt(3.0));
    CHECK(default_scale(0) == 1.0);
    CHECK(resolved_scale(0.5, 64) == 0.5);
    CHECK(resolved_scale(std::nullopt, 16) == 0.25);
}
