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
