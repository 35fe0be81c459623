// The error hierarchy: every library error is an attn::Error, so one catch handles all bad input.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <type_traits>

#include "attn/error.hpp"

using namespace attn;

TEST_CASE("every error kind derives from attn::Error and std::runtime_error", "[error]") {
    STATIC_REQUIRE(std::is_base_of_v<std::runtime_error, Error>);
    STATIC_REQUIRE(std::is_base_of_v<Error, ShapeError>);
    STATIC_REQUIRE(std::is_base_of_v<Error, MaskError>);
    STATIC_REQUIRE(std::is_base_of_v<Error, ValueError>);
    STATIC_REQUIRE(std::is_base_of_v<Error, ConfigError>);
    STATIC_REQUIRE(std::is_base_of_v<Error, IoError>);
    // The kinds are distinct: a handler for one does not catch another.
    STATIC_REQUIRE_FALSE(std::is_base_of_v<ShapeError, MaskError>);
    STATIC_REQUIRE_FALSE(std::is_base_of_v<ValueError, ConfigError>);
    try {
        throw MaskError("sdpa: query row 1 of batch index [0] has no allowed key");
    } catch (const Error& e) {
        CHECK(std::string(e.what()) == "sdpa: query row 1 of batch index [0] has no allowed key");
    }
}

TEST_CASE("a remedy is said in each interface's terms, from the option table", "[error][options]") {
    const MaskError e("sdpa: query row 1 of batch index [0] has no allowed key",
                      Remedy{"empty_rows", {"zero", "nan"}, "to allow empty rows"});
    CHECK(std::string(e.what()) ==
          "sdpa: query row 1 of batch index [0] has no allowed key; set options.empty_rows to EmptyRowPolicy::Zero or "
          "EmptyRowPolicy::Nan to allow empty rows");
    CHECK(e.message(Interface::Cpp) == e.what());
    CHECK(e.message(Interface::Cli) == "sdpa: query row 1 of batch index [0] has no allowed key; pass --empty-rows "
                                       "zero or --empty-rows nan to allow empty rows");
    CHECK(e.message(Interface::Python) == "sdpa: query row 1 of batch index [0] has no allowed key; pass "
                                          "empty_rows='zero' or empty_rows='nan' to allow empty rows");
    const ValueError v("sdpa: q [1] holds nan at index 0", Remedy{"check_finite", {"false"}, "to allow it"});
    CHECK(v.message(Interface::Cli) == "sdpa: q [1] holds nan at index 0; pass --no-check-finite to allow it");
    CHECK(v.message(Interface::Python) == "sdpa: q [1] holds nan at index 0; pass check_finite=False to allow it");
    // Copies share the remedy; an error without one says the same in every interface.
    const MaskError copy = e;
    REQUIRE(copy.remedy() != nullptr);
    CHECK(copy.remedy()->field == "empty_rows");
    const ShapeError plain("sdpa: q has Dk=4 but k has Dk=3");
    CHECK(plain.remedy() == nullptr);
    CHECK(plain.message(Interface::Cli) == plain.what());
}
