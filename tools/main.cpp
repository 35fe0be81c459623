// attn: the command-line program (tests, verification, and attention on .npy files).
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/machine.hpp"
#include "commands.hpp"

namespace attn::cli {

std::vector<std::string> closest_names(const std::string& word, const std::vector<std::string>& known) {
    const auto distance = [](const std::string& a, const std::string& b) {
        std::vector<std::size_t> row(b.size() + 1);
        for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
        for (std::size_t i = 1; i <= a.size(); ++i) {
            std::size_t diagonal = row[0];
            row[0] = i;
            for (std::size_t j = 1; j <= b.size(); ++j) {
                const std::size_t up = row[j];
                row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
                diagonal = up;
            }
        }
        return row[b.size()];
    };
    std::vector<std::pair<std::size_t, std::string>> scored;
    for (const std::string& name : known) {
        const std::size_t d = distance(word, name);
        if (d <= 2 || (word.size() >= 3 && name.rfind(word, 0) == 0)) scored.emplace_back(d, name);
    }
    std::sort(scored.begin(), scored.end());
    std::vector<std::string> names;
    for (const auto& [d, name] : scored) names.push_back(name);
    return names;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& known) {
    const std::vector<std::string> names = closest_names(word, known);
    if (names.empty()) return "";
    std::string s = " (did you mean " + names[0];
    for (std::size_t i = 1; i < names.size() && i < 3; ++i) s += (i + 1 == std::min<std::size_t>(names.size(), 3) ? " or " : ", ") + names[i];
    return s + "?)";
}

}  // namespace attn::cli

int main(int argc, char** argv) {
    CLI::App app{"attn: a verified attention library and its verification suite"};
    app.require_subcommand(1);
    std::string simd_target;
    app.add_option("--simd-target", simd_target,
                   "Run the tiled kernel on this SIMD target (attn info lists them); child processes inherit it");
    // One line per command family; each action answers not_mine unless its subcommand was parsed. `attn --help`
    // lists them in two groups: the commands for attention and for checking a kernel (tools/), and the project's
    // harness, how attn measures and mutates itself (tools/workshop/).
    std::vector<attn::cli::Action> actions;
    const auto family = [&](attn::cli::Action (*add)(CLI::App&), const char* group) {
        const std::size_t before = app.get_subcommands([](CLI::App*) { return true; }).size();
        actions.push_back(add(app));
        const std::vector<CLI::App*> all = app.get_subcommands([](CLI::App*) { return true; });
        for (std::size_t i = before; i < all.size(); ++i) all[i]->group(group);
    };
    const char* commands = "Commands";
    const char* harness = "Project harness (tools/workshop)";
    family(attn::cli::add_run_commands, commands);
    family(attn::cli::add_sdpa_command, commands);
    family(attn::cli::add_mha_command, commands);
    family(attn::cli::add_oracle_commands, commands);
    family(attn::cli::add_properties_commands, commands);
    family(attn::cli::add_report_command, commands);
    family(attn::cli::add_fuzz_command, commands);
    family(attn::cli::add_info_command, commands);
    family(attn::cli::add_bench_command, harness);
    family(attn::cli::add_coverage_command, harness);
    family(attn::cli::add_mutate_command, harness);
    // Two harness commands share their files with the user's: the oracle's self-check and the mutant table.
    for (const char* name : {"oracle-sweep", "mutants"}) app.get_subcommand(name)->group(harness);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // A mistyped command: name it and the closest ones rather than only "A subcommand is required".
        if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty() &&
            (dynamic_cast<const CLI::ExtrasError*>(&e) || dynamic_cast<const CLI::RequiredError*>(&e))) {
            std::vector<std::string> known;
            for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) known.push_back(sub->get_name());
            std::cerr << "attn: unknown command '" << argv[1] << "'" << attn::cli::did_you_mean(argv[1], known)
                      << "; attn --help lists the commands\n";
            return 2;
        }
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
        std::cerr << "attn: " << e.message(attn::Interface::Cli) << "\n";
        return 2;
    }
}
