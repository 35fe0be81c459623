// The attn program's subcommands: each registers its options on the CLI11 app and returns its exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace attn::cli {

// A registered subcommand's action, run after parsing; returns the process exit code.
using Action = std::function<int()>;

// `attn test` and `attn verify`: the suite and the main job.
Action add_run_commands(CLI::App& app);

}  // namespace attn::cli
