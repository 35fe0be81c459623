// attn: the command-line program (tests, verification, and attention on .npy files).
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/machine.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
    CLI::App app{"attn: a verified attention library and its verification suite"};
    app.require_subcommand(1);
    std::string simd_target;
    app.add_option("--simd-target", simd_target,
                   "Run the tiled kernel on this SIMD target (attn info lists them); child processes inherit it");
    // One line per command family; each action answers not_mine unless its subcommand was parsed.
    const std::vector<attn::cli::Action> actions = {
        attn::cli::add_run_commands(app),
        attn::cli::add_report_command(app),
        attn::cli::add_properties_commands(app),
        attn::cli::add_sdpa_command(app),
        attn::cli::add_oracle_commands(app),
        attn::cli::add_mha_command(app),
        attn::cli::add_bench_command(app),
        attn::cli::add_fuzz_command(app),
        attn::cli::add_info_command(app),
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        if (!simd_target.empty()) {
            attn::force_simd_target(simd_target);  // checks the name before the environment carries it on
            setenv("ATTN_SIMD_TARGET", simd_target.c_str(), 1);
        }
        for (const auto& action : actions) {
            const int code = action();
            if (code != attn::cli::not_mine) return code;
        }
        return 2;
    } catch (const attn::Error& e) {
        std::cerr << "attn: " << e.what() << "\n";
        return 2;
    }
}
