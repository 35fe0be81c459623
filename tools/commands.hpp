// The attn program's subcommands: each registers its options on the CLI11 app and returns the action to run
// when that subcommand was parsed (the action returns the process exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "attn/machine.hpp"
#include "attn/sdpa.hpp"
#include "options.hpp"

namespace attn::cli {

// Where the committed accuracy baselines live, one per numerics fingerprint (reports/README.md, "Drift").
inline std::string baselines_dir() { return std::string(ATTN_SOURCE_DIR) + "/reports/baselines"; }

// The known names closest to `word` (edit distance at most 2, or a prefix of it), best first: for "did you mean".
std::vector<std::string> closest_names(const std::string& word, const std::vector<std::string>& known);
// " (did you mean a or b?)", or "" when nothing is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& known);

// Shell commands (shell.cpp): a wait status as an exit code (128 + signal when killed, 2 when it could not run);
// a command run with stdout and stderr flushed first, returning its exit code; the core count, for -j.
int exit_code(int status);
int run(const std::string& command);
std::string jobs();
// A path single-quoted for the shell, and the seconds since t0.
std::string quote(const std::filesystem::path& p);
double seconds_since(std::chrono::steady_clock::time_point t0);
// x with `digits` digits after the point, for the commands' summaries.
std::string fixed(double x, int digits);
// The whole contents of a file ("" when it cannot be read).
std::string read_text(const std::filesystem::path& p);

// The BLIS choice and the measured limit (commands_info.cpp), for `attn info` and `attn bench`: as JSON, the
// warnings when BLIS's own pick or the library's gemm configuration is slower than the limit, and the table.
nlohmann::json choice_json(const BlisChoice& choice);
nlohmann::json limit_json(const MachineLimit& limit);
std::vector<std::string> limit_warnings(const BlisChoice& choice, const MachineLimit& limit);
void print_limit(const BlisChoice& choice, const MachineLimit& limit);

using Action = std::function<int()>;

// What an action returns when none of its subcommands was the one parsed.
inline constexpr int not_mine = -1;

// `attn test` and `attn verify`: the suite and the main job (commands_run.cpp).
Action add_run_commands(CLI::App& app);

// `attn coverage`: line and branch coverage of lib/src and oracle/src, properties alone and with the fuzz replays
// (commands_coverage.cpp).
Action add_coverage_command(CLI::App& app);

// `attn mutate`: the property suite against automatic mutations of lib/src, in a scratch copy (commands_mutate.cpp).
Action add_mutate_command(CLI::App& app);

// `attn report`: the accuracy report and its drift check (commands_report.cpp).
Action add_report_command(CLI::App& app);

// `attn properties`, `attn mutants` and `attn search`: the property suite (commands_properties.cpp).
Action add_properties_commands(CLI::App& app);

// `attn sdpa`: scaled dot-product attention on .npy files (commands_sdpa.cpp).
Action add_sdpa_command(CLI::App& app);
// `attn fuzz`: libFuzzer runs, corpus merge, crash minimisation, smoke runs, mutants (commands_fuzz.cpp).
Action add_fuzz_command(CLI::App& app);

// `attn oracle`, `attn check` and `attn oracle-sweep`: the oracle on .npy files (commands_oracle.cpp).
Action add_oracle_commands(CLI::App& app);

// `attn mha`: multi-head attention on .npy files, PyTorch parameter layouts (commands_mha.cpp).
Action add_mha_command(CLI::App& app);

// `attn info [--json]`: the numerics fingerprint (commands_info.cpp).
Action add_info_command(CLI::App& app);

// `attn bench [--quick] [--json FILE]`: speed and memory of the backends (commands_bench.cpp).
Action add_bench_command(CLI::App& app);

}  // namespace attn::cli
