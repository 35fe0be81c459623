// `attn info`: the numerics fingerprint, what decides the bits of every result on this machine.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "attn/machine.hpp"
#include "commands.hpp"

namespace attn::cli {

Action add_info_command(CLI::App& app) {
    auto json = std::make_shared<bool>(false);
    auto* info = app.add_subcommand("info", "What decides the bits here: CPU, SIMD targets, BLIS, compiler, threads");
    info->add_flag("--json", *json, "Print the fingerprint as one JSON object");
    return [info, json]() -> int {
        if (!info->parsed()) return not_mine;
        const NumericsFingerprint f = numerics_fingerprint();
        if (*json) {
            nlohmann::json j{{"id", f.id()}};
            for (const auto& [name, value] : f.fields()) j[name] = value;
            std::cout << j.dump(2) << "\n";
            return 0;
        }
        std::cout << "numerics fingerprint " << f.id() << "\n";
        for (const auto& [name, value] : f.fields()) std::cout << "  " << name << ": " << value << "\n";
        std::cout << "Results are bitwise reproducible for one fingerprint (any thread count); error bounds hold on "
                     "every one.\nForce a lower SIMD target with --simd-target NAME or ATTN_SIMD_TARGET=NAME.\n";
        return 0;
    };
}

}  // namespace attn::cli
