// Test helper: the message of the exception of type E that f must throw (the test fails on any other outcome).
#pragma once

#include <catch2/catch.hpp>

#include <exception>
#include <string>

namespace attn::test {

template <class E, class F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL("threw the wrong exception type, with message: " << e.what());
    }
    FAIL("threw nothing");
    return {};
}

}  // namespace attn::test
