// `attn test` (ctest) and `attn verify` (the main job: every stage with a one-line status and a summary).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"

namespace attn::cli {

namespace {

std::string ctest_command(const std::string& extra) {
    return std::string("ctest --test-dir '") + ATTN_BINARY_DIR + "' --output-on-failure -j 2 " + extra;
}

int run(const std::string& command) {
    std::cout.flush();
    const int status = std::system(command.c_str());
    if (status == -1) return 2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

struct Stage {
    std::string name;
    int code;
    double seconds;
};

}  // namespace

Action add_run_commands(CLI::App& app) {
    auto* test = app.add_subcommand("test", "Run the test suite (ctest): unit tests, properties, replays");
    static std::string label_storage;
    auto* test_label = &label_storage;
    test->add_option("-L,--label", *test_label, "Only tests with this ctest label");
    auto* verify = app.add_subcommand("verify", "The main job: run every stage and print a summary");
    return [&app, test, verify, test_label]() -> int {
        if (test->parsed()) return run(ctest_command(test_label->empty() ? "" : "-L '" + *test_label + "'"));
        if (verify->parsed()) {
            std::vector<Stage> stages;
            const auto stage = [&](const std::string& name, const std::string& command) {
                std::cout << "== " << name << "\n";
                const auto t0 = std::chrono::steady_clock::now();
                const int code = run(command);
                const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                stages.push_back({name, code, s});
                std::cout << "== " << name << ": " << (code == 0 ? "ok" : "FAILED") << " (" << s << " s)\n";
            };
            stage("unit tests", ctest_command("-LE properties"));
            // The property suite (every correct implementation, the mutants, the case-file replays); the mutant
            // test leaves its table in the build dir for the summary.
            const std::string mutant_table = std::string(ATTN_BINARY_DIR) + "/properties/mutants.md";
            std::remove(mutant_table.c_str());
            stage("properties", ctest_command("-L properties"));
            int worst = 0;
            std::cout << "\nattn verify summary\n";
            for (const Stage& s : stages) {
                std::printf("  %-16s %-7s %8.1f s\n", s.name.c_str(), s.code == 0 ? "ok" : "FAILED", s.seconds);
                if (s.code != 0) worst = 1;
            }
            if (std::FILE* table = std::fopen(mutant_table.c_str(), "r")) {
                std::cout << "\nmutants (properties_mutants_all_killed)\n";
                char line[512];
                while (std::fgets(line, sizeof line, table)) std::cout << "  " << line;
                std::fclose(table);
            }
            return worst;
        }
        (void)app;
        return not_mine;
    };
}

}  // namespace attn::cli
