// attn: the command-line program (tests, verification, and attention on .npy files).
#include <iostream>

#include "attn/error.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
    CLI::App app{"attn: a verified attention library and its verification suite"};
    app.require_subcommand(1);
    attn::cli::Action action = attn::cli::add_run_commands(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        return action();
    } catch (const attn::Error& e) {
        std::cerr << "attn: " << e.what() << "\n";
        return 2;
    }
}
