// cli_run.hpp: runs the built `attn` program from a test (its path comes from the build as ATTN_CLI_PATH).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace attn::test {

// A scratch directory per test process (name + pid), removed when the test case ends.
struct Scratch {
    std::filesystem::path dir;
    explicit Scratch(const std::string& name)
        : dir(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
        std::filesystem::create_directories(dir);
    }
    ~Scratch() { std::filesystem::remove_all(dir); }
    std::string operator/(const std::string& file) const { return (dir / file).string(); }
};

inline std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

struct Run {
    int exit_code;
    std::string out;          // stdout
    std::string stderr_text;  // stderr
};

// A shell command with stdout and stderr captured in the scratch directory.
inline Run run_shell(const Scratch& scratch, const std::string& shell_command) {
    const std::string command =
        "(" + shell_command + ") >'" + (scratch / "stdout.txt") + "' 2>'" + (scratch / "stderr.txt") + "'";
    const int status = std::system(command.c_str());
    REQUIRE(status != -1);
    REQUIRE(WIFEXITED(status));
    return {WEXITSTATUS(status), slurp(scratch / "stdout.txt"), slurp(scratch / "stderr.txt")};
}

#ifdef ATTN_CLI_PATH
// `attn ARGS` (the built program) with stdout and stderr captured in the scratch directory.
inline Run run_attn(const Scratch& scratch, const std::string& args) {
    return run_shell(scratch, std::string("'") + ATTN_CLI_PATH + "' " + args);
}
#endif

}  // namespace attn::test
