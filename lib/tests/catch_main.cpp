// The one Catch2 main shared by every test executable. Under ATTN_SIMD_TARGET=<name> (ctest's per-target runs)
// the tiled kernel runs that Highway target; a target this CPU cannot run skips the test (exit 77, ctest's
// SKIP_RETURN_CODE) and a name that is no compiled target fails it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

#include "attn/error.hpp"
#include "attn/machine.hpp"

int main(int argc, char** argv) {
    if (const char* name = std::getenv("ATTN_SIMD_TARGET"); name && *name) {
        if (!attn::is_compiled_simd_target(name)) {
            std::cerr << "ATTN_SIMD_TARGET=" << name << " is not a SIMD target of this build\n";
            return 2;
        }
        try {
            attn::force_simd_target(name);
        } catch (const attn::ConfigError&) {
            // simd_targets(), not the fingerprint: anything that dispatches would read ATTN_SIMD_TARGET again
            // and throw outside this handler (seen on an AVX2-only CPU).
            std::string runs;
            for (const std::string& t : attn::simd_targets()) runs += (runs.empty() ? "" : " ") + t;
            std::cout << "skipped: this CPU cannot run SIMD target " << name << " (it runs " << runs << ")\n";
            return 77;
        }
        std::cout << "tiled kernel on SIMD target " << attn::simd_target() << "\n";
    }
    return Catch::Session().run(argc, argv);
}
