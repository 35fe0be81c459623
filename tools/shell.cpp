// Running shell commands from the attn program: the one place exit statuses are decoded.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <iostream>
#include <string>

#include "commands.hpp"

namespace attn::cli {

int exit_code(int status) {
    if (status == -1) return 2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int run(const std::string& command) {
    std::cout.flush();
    std::cerr.flush();
    return exit_code(std::system(command.c_str()));
}

std::string quote(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string fixed(double x, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return buf;
}

std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string jobs() {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return std::to_string(n > 0 ? n : 1);
}

}  // namespace attn::cli
