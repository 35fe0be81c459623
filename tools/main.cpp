// attn: the command-line program (tests, verification, and attention on .npy files).
#include <iostream>
#include <vector>

#include "attn/error.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
    CLI::App app{"attn: a verified attention library and its verification suite"};
    app.require_subcommand(1);
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
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
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
