// `attn properties`, `attn mutants` and `attn search`: the property suite from the command line.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"

#ifdef ATTN_HAVE_SUITE
#include "attn/plugin/kernel_process.hpp"
#include "attn/suite/property.hpp"
#include "attn/suite/recipe.hpp"
#include "attn/suite/registry.hpp"
#include "attn/suite/search.hpp"
#endif

namespace attn::cli {

namespace {

struct Args {
    std::string impl;
    std::string property;
    bool thorough = false;
    int restarts = 8, steps = 150;
    std::uint64_t seed = 1;
    bool save = false;
    std::string case_config;
    std::vector<std::string> replay;
    std::string kernel;  // an external kernel library (attn/kernel_abi.h)
    double kernel_timeout = 10;
    std::string cases_dir = "attn-cases";  // where an external kernel's failing cases are saved
    std::string kernel_connection;         // "SOCKET,MEMFD": a connected worker (the Python module)
    std::string json_path;
};

}  // namespace

#ifdef ATTN_HAVE_SUITE
namespace {

// `attn properties --case CONFIG`: one property on exactly the case a config string with a seed names.
int check_one_case(const std::string& config_text, const std::string& property_name) {
    using namespace attn::suite;
    const CaseConfig config = parse_config(config_text);
    const SdpaCase c = make_case(config);
    const Property& p = property(property_name.empty() ? "matches_oracle_within_bound" : property_name);
    const std::vector<const Implementation*> impls =
        config.impl == "all" ? correct_implementations() : std::vector<const Implementation*>{&implementation(config.impl)};
    int failed = 0;
    for (const Implementation* impl : impls) {
        if (!p.applies(*impl)) {
            std::printf("%-48s %-9s does not apply\n", p.name.c_str(), impl->name.c_str());
            continue;
        }
        Verdict v;
        try {
            v = check_case(p, *impl, c);
        } catch (const Unsupported& e) {
            std::printf("%-48s %-9s SKIP %s: %s\n", p.name.c_str(), impl->name.c_str(), config_string(c, impl->name).c_str(), e.what());
            continue;
        }
        failed += v.has_value();
        std::printf("%-48s %-9s %-4s %s\n", p.name.c_str(), impl->name.c_str(), v ? "FAIL" : "ok",
                    config_string(c, impl->name).c_str());
        if (v) std::printf("    %s\n", v->c_str());
    }
    return failed == 0 ? 0 : 1;
}

// `attn properties --replay FILE...`: what ctest's replay does, for the named files.
int replay_files(const std::vector<std::string>& paths) {
    using namespace attn::suite;
    int failed = 0;
    for (const std::string& path : paths) {
        std::vector<std::string> skipped;
        const std::vector<std::string> problems = replay_case(read_case_file(path), &skipped);
        std::printf("%s: %s%s\n", path.c_str(), problems.empty() ? "ok" : "FAIL",
                    skipped.empty() ? "" : (" (skipped for: " + skipped.front() + ": not in this build or not supported)").c_str());
        for (const std::string& problem : problems) std::printf("    %s\n", problem.c_str());
        failed += !problems.empty();
    }
    return failed == 0 ? 0 : 1;
}

std::string cases_dir() { return std::string(ATTN_SOURCE_DIR) + "/regressions/cases"; }

std::vector<const suite::Implementation*> selected(const Args& args) {
    return args.impl.empty() ? suite::correct_implementations()
                             : std::vector<const suite::Implementation*>{&suite::implementation(args.impl)};
}

// `attn properties`: every (selected) property against every (selected) implementation, both dtypes.
int run_properties(const Args& args, suite::RunSettings settings) {
    using namespace attn::suite;
    settings.regressions_dir = cases_dir();
    if (!args.property.empty() && std::none_of(properties().begin(), properties().end(),
                                               [&](const Property& p) { return p.name == args.property; })) {
        std::vector<std::string> known;
        for (const Property& p : properties()) known.push_back(p.name);
        std::cerr << "attn properties: no property named '" << args.property << "'" << did_you_mean(args.property, known)
                  << "; the names are the files in suite/invariants/\n";
        return 2;
    }
    int failed = 0, runs = 0, skipped_all = 0;
    nlohmann::json json_runs = nlohmann::json::array();
    for (const Implementation* impl : selected(args))
        for (const Property& p : properties()) {
            if (!args.property.empty() && p.name != args.property) continue;
            if (!p.applies(*impl)) {
                // An external kernel is told what it was not tested on; the library's own properties do not apply.
                if (!impl->kernel_path.empty()) {
                    std::printf("%-48s %-9s %-6s n/a  (a property of the library's own API)\n", p.name.c_str(),
                                impl->name.c_str(), "");
                    json_runs.push_back({{"property", p.name}, {"implementation", impl->name}, {"status", "n/a"}});
                }
                continue;
            }
            for (Dtype dtype : all_dtypes()) {
                // The suite's own implementations without a path in a dtype (the module's 16-bit) are not run there;
                // an external kernel is told what it was skipped on.
                if (impl->kernel_path.empty() && impl->dtype_unsupported.count(dtype)) continue;
                RunSettings s = settings;
                // A mutant failing is no regression: its case goes to the build directory. An external kernel's
                // failures are its own: they go where its user asked (attn's corpus is attn's).
                if (impl->is_mutant) s.regressions_dir = std::string(ATTN_BINARY_DIR) + "/property-failures";
                if (!impl->kernel_path.empty()) s.regressions_dir = args.cases_dir + "/" + impl->name;
                const RunOutcome o = run_property(p, *impl, dtype, s);
                ++runs;
                failed += !o.passed;
                skipped_all += o.skipped_all;
                std::printf("%-48s %-9s %-6s %-4s %6d cases %7.2f s  %s\n", p.name.c_str(), impl->name.c_str(),
                            to_string(dtype), o.skipped_all ? "SKIP" : o.passed ? "ok" : "FAIL", o.cases, o.seconds,
                            o.message.c_str());
                for (const auto& [reason, count] : o.skipped)
                    if (count) std::printf("    skipped %d cases: %s\n", count, reason.c_str());
                if (!o.reproduce.empty()) std::printf("    reproduce: %s\n", o.reproduce.c_str());
                std::fflush(stdout);
                nlohmann::json skipped = nlohmann::json::object();
                for (const auto& [reason, count] : o.skipped) skipped[reason] = count;
                json_runs.push_back({{"property", p.name}, {"sentence", p.sentence}, {"implementation", impl->name},
                                     {"dtype", to_string(dtype)},
                                     {"status", o.skipped_all ? "skipped" : o.passed ? "passed" : "failed"},
                                     {"cases", o.cases}, {"seconds", o.seconds}, {"message", o.message},
                                     {"skipped", skipped}, {"case_file", o.case_file}, {"reproduce", o.reproduce},
                                     {"config", o.config}});
            }
        }
    if (runs == 0) {  // a selection that runs nothing is no pass
        std::cerr << "attn properties: property " << args.property << " does not apply to implementation " << args.impl
                  << "\n";
        return 2;
    }
    std::printf("\nproperties: %d of %d runs passed", runs - failed - skipped_all, runs);
    if (skipped_all) std::printf(", %d skipped (nothing the implementation supports)", skipped_all);
    std::printf("%s\n", failed ? "" : "; none failed");
    if (!args.json_path.empty()) {
        std::ofstream file(args.json_path);
        file << nlohmann::json{{"seed", settings.seed}, {"settings", describe_settings(settings)}, {"runs", json_runs}}.dump(2)
             << "\n";
        if (!file) throw IoError("attn properties: cannot write " + args.json_path);
    }
    return failed == 0 ? 0 : 1;
}

// `attn mutants`: the mutant table; 1 when a mutant survives.
int run_mutants(const suite::RunSettings& settings) {
    const std::vector<suite::MutantRow> rows = suite::mutant_table(settings, &std::cout);
    std::cout << "\n" << suite::format_mutant_table(rows);
    for (const suite::MutantRow& r : rows)
        if (!r.killed) return 1;
    return 0;
}

// `attn search`: hill-climbing on error/bound; 1 when some input exceeds its bound.
int run_search(const Args& args) {
    using namespace attn::suite;
    std::printf("| implementation | dtype | worst error/bound | evaluations | seconds | worst case |\n|---|---|---:|---:|---:|---|\n");
    int violations = 0;
    for (const Implementation* impl : selected(args))
        for (Dtype dtype : all_dtypes()) {
            if (impl->dtype_unsupported.count(dtype)) continue;
            const SearchResult r = targeted_search(*impl, dtype, args.restarts, args.steps, args.seed);
            violations += r.tightness > 1;
            std::printf("| %s | %s | %.3g | %d | %.1f | %s |\n", impl->name.c_str(), to_string(dtype), r.tightness,
                        r.evaluations, r.seconds, config_string(r.worst, impl->name).c_str());
            if (args.save) {
                CaseFile file;
                file.sdpa = r.worst;
                file.property = "matches_oracle_within_bound";
                file.implementation = impl->name;
                file.source = "targeted search (seed " + std::to_string(args.seed) + ")";
                char note[160];
                std::snprintf(note, sizeof note, "worst input found by hill-climbing on error/bound: %.3g", r.tightness);
                file.note = note;
                const std::string dir = impl->kernel_path.empty() ? cases_dir() : args.cases_dir + "/" + impl->name;
                std::printf("    saved %s\n", write_case_file(file, dir).c_str());
            }
            std::fflush(stdout);
        }
    return violations == 0 ? 0 : 1;
}

}  // namespace
#endif

Action add_properties_commands(CLI::App& app) {
    static Args args;
    auto* props = app.add_subcommand("properties", "Run every property against every correct implementation (or one)");
    props->add_option("--impl", args.impl, "Only this implementation (reference, tiled, mha, or a mutant)");
    props->add_option("--property", args.property, "Only this property");
    props->add_flag("--thorough", args.thorough, "20x the cases (nightly)");
    props->add_option("--case", args.case_config,
                      "Check exactly the case this config string names (it needs a seed: a report row's config, e.g.) "
                      "with --property (default matches_oracle_within_bound), for its impl (impl=all: every correct one)");
    props->add_option("--replay", args.replay, "Replay these case files (what a failure prints), as ctest does");
    props->add_option("--kernel", args.kernel,
                      "An external kernel (a shared library exporting attn_kernel_get, attn/kernel_abi.h): run the "
                      "properties on it instead, in a worker process of its own");
    props->add_option("--kernel-timeout", args.kernel_timeout, "Seconds one call of --kernel may take before it counts as hung")
        ->check(CLI::PositiveNumber);
    props->add_option("--kernel-connection", args.kernel_connection,
                      "SOCKET_FD,MEMFD of a kernel worker that is already running (how the Python module's "
                      "attn.properties serves a Python function)");
    props->add_option("--json", args.json_path, "Also write every run (status, cases, skips, reproduction) as JSON");
    props->add_option("--cases-dir", args.cases_dir,
                      "Where the failing cases of --kernel are saved, one directory per kernel (default attn-cases, "
                      "relative to where attn runs)");
    auto* muts = app.add_subcommand("mutants", "Run the suite against every mutant: killed or survived, by what, how fast");
    muts->add_flag("--thorough", args.thorough, "20x the cases per property");
    auto* search = app.add_subcommand("search", "Targeted search: hill-climb on error/bound per implementation and dtype");
    search->add_option("--impl", args.impl, "Only this implementation");
    search->add_option("--restarts", args.restarts, "Random starting cases per implementation and dtype");
    search->add_option("--steps", args.steps, "Mutations per start");
    search->add_option("--seed", args.seed, "Search seed");
    search->add_flag("--save", args.save, "Save the worst input per implementation and dtype as a regression case");
    search->add_option("--kernel", args.kernel, "An external kernel (attn/kernel_abi.h) to search instead");
    return [props, muts, search]() -> int {
        if (!props->parsed() && !muts->parsed() && !search->parsed()) return not_mine;
#ifndef ATTN_HAVE_SUITE
        std::cerr << "attn: this build has no property suite (it needs the oracle)\n";
        return 2;
#else
        // An external kernel, from a library or a connected worker (the Python module), becomes the implementation
        // under test; one that cannot be used is refused (exit 2) before anything runs.
        const auto use_kernel = [&](const auto& load) {
            try {
                const suite::Implementation& k = load();
                args.impl = k.name;
                std::cout << "kernel " << k.name << ": " << k.description << "\n  declares: " << k.capabilities
                          << "\n  what it does not declare is skipped and counted below\n";
                return 0;
            } catch (const plugin::LoadError& e) {
                std::cerr << "attn: " << e.what() << "\n";
                return 2;
            }
        };
        if (!args.kernel.empty() && (!args.impl.empty() || !args.kernel_connection.empty())) {
            std::cerr << "attn: --kernel, --kernel-connection and --impl each name the implementation; give one\n";
            return 2;
        }
        if (!args.kernel_connection.empty()) {
            int socket = -1, memfd = -1;
            if (std::sscanf(args.kernel_connection.c_str(), "%d,%d", &socket, &memfd) != 2 || socket < 0 || memfd < 0) {
                std::cerr << "attn: --kernel-connection takes SOCKET_FD,MEMFD, got '" << args.kernel_connection << "'\n";
                return 2;
            }
            if (use_kernel([&]() -> const suite::Implementation& { return suite::connect_external(socket, memfd, "python"); }))
                return 2;
        }
        if (!args.kernel.empty() &&
            use_kernel([&]() -> const suite::Implementation& { return suite::load_external(args.kernel, args.kernel_timeout); }))
            return 2;
        if (props->parsed() && !args.case_config.empty()) return check_one_case(args.case_config, args.property);
        if (props->parsed() && !args.replay.empty()) return replay_files(args.replay);
        if (search->parsed()) return run_search(args);
        const suite::RunSettings settings = suite::settings_from_environment(args.thorough);
        std::cout << describe_settings(settings) << "\n";
        return props->parsed() ? run_properties(args, settings) : run_mutants(settings);
#endif
    };
}

}  // namespace attn::cli
