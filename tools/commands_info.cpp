// `attn info`: the numerics fingerprint (what decides the bits of every result on this machine), the BLIS
// configurations the library chose, and the machine's measured limit.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "attn/machine.hpp"
#include "commands.hpp"

namespace attn::cli {

nlohmann::json choice_json(const BlisChoice& c) {
    return {{"name", c.name()},         {"gemm", c.gemm},     {"packed_float", c.packed_float},
            {"packed_double", c.packed_double}, {"own", c.own}, {"reason", c.reason}, {"runnable", c.runnable}};
}

nlohmann::json limit_json(const MachineLimit& m) {
    nlohmann::json configurations = nlohmann::json::array();
    for (const GemmSpeed& g : m.configurations)
        configurations.push_back({{"configuration", g.configuration}, {"sgemm_gflops", g.sgemm_gflops},
                                  {"dgemm_gflops", g.dgemm_gflops}});
    return {{"n", m.n},
            {"threads", 1},
            {"configurations", configurations},
            {"packed", {{"sgemm_gflops", m.packed.sgemm_gflops}, {"dgemm_gflops", m.packed.dgemm_gflops}}},
            {"sgemm_gflops", m.limit_sgemm.sgemm_gflops},
            {"sgemm_configuration", m.limit_sgemm.configuration},
            {"dgemm_gflops", m.limit_dgemm.dgemm_gflops},
            {"dgemm_configuration", m.limit_dgemm.configuration},
            {"fma_width", m.fma_width},
            {"peak_fma_float_gflops", m.peak_fma_float_gflops},
            {"peak_fma_double_gflops", m.peak_fma_double_gflops}};
}

// BLIS's picks against the fastest BLIS configuration (the ones the library could run its general gemm on).
std::vector<std::string> limit_warnings(const BlisChoice& c, const MachineLimit& m) {
    std::vector<std::string> w;
    const auto pct = [](double x, double of) { return fixed(of > 0 ? 100 * x / of : 0, 1) + "%"; };
    const double s = m.fastest_sgemm.sgemm_gflops;
    if (m.own.sgemm_gflops < 0.9 * s)
        w.push_back("BLIS's own pick for this CPU (" + c.own + ") runs sgemm at " + pct(m.own.sgemm_gflops, s) +
                    " of the fastest BLIS configuration (" + m.fastest_sgemm.configuration + "); " +
                    (c.gemm == c.own ? "the library runs it (" + c.reason + ")"
                                     : "the library runs " + c.name() + " instead"));
    if (m.chosen.sgemm_gflops < 0.97 * s)
        w.push_back("the library's gemm configuration (" + c.gemm + ") runs sgemm at " +
                    pct(m.chosen.sgemm_gflops, s) + " of the fastest BLIS configuration (" +
                    m.fastest_sgemm.configuration + ")");
    if (m.chosen.dgemm_gflops < 0.97 * m.fastest_dgemm.dgemm_gflops)
        w.push_back("the library's gemm configuration (" + c.gemm + ") runs dgemm at " +
                    pct(m.chosen.dgemm_gflops, m.fastest_dgemm.dgemm_gflops) + " of the fastest BLIS configuration (" +
                    m.fastest_dgemm.configuration + ")");
    return w;
}

void print_limit(const BlisChoice& c, const MachineLimit& m) {
    std::cout << "measured limit (one thread, square gemm n=" << m.n << ", CPU time; GFLOP/s):\n";
    std::printf("  %-12s %8s %8s\n", "BLIS config", "sgemm", "dgemm");
    for (const GemmSpeed& g : m.configurations)
        std::printf("  %-12s %8.1f %8.1f%s\n", g.configuration.c_str(), g.sgemm_gflops, g.dgemm_gflops,
                    g.configuration == c.gemm ? "  <- the library's gemm" : g.configuration == c.own ? "  <- BLIS's own pick" : "");
    std::printf("  %-12s %8.1f %8.1f  <- the tiled kernels' micro-kernels (%s, %s) in a blocked gemm\n", "packed",
                m.packed.sgemm_gflops, m.packed.dgemm_gflops, c.packed_float.c_str(), c.packed_double.c_str());
    std::printf("  limit: sgemm %.1f (%s), dgemm %.1f (%s)\n", m.limit_sgemm.sgemm_gflops,
                m.limit_sgemm.configuration.c_str(), m.limit_dgemm.dgemm_gflops, m.limit_dgemm.configuration.c_str());
    std::printf("  peak FMA (%s, one core): float %.1f, double %.1f; the sgemm limit is %.1f%% of it\n",
                m.fma_width.c_str(), m.peak_fma_float_gflops, m.peak_fma_double_gflops,
                m.peak_fma_float_gflops > 0 ? 100 * m.limit_sgemm.sgemm_gflops / m.peak_fma_float_gflops : 0.0);
    for (const std::string& w : limit_warnings(c, m)) std::cout << "  WARNING: " << w << "\n";
}

Action add_info_command(CLI::App& app) {
    auto json = std::make_shared<bool>(false);
    auto no_limit = std::make_shared<bool>(false);
    auto* info = app.add_subcommand(
        "info", "What decides the bits here (CPU, SIMD targets, BLIS, compiler, threads) and the measured limit");
    info->add_flag("--json", *json, "Print the fingerprint, the BLIS choice and the limit as one JSON object");
    info->add_flag("--no-limit", *no_limit, "Leave out the measured limit (a few seconds of gemms)");
    return [info, json, no_limit]() -> int {
        if (!info->parsed()) return not_mine;
        const NumericsFingerprint f = numerics_fingerprint();
        const BlisChoice choice = blis_choice();
        // A short measure: n = 1024 reaches BLIS's steady state within a few percent (the bench uses 2048).
        const std::optional<MachineLimit> limit =
            *no_limit ? std::nullopt : std::optional<MachineLimit>(measure_machine_limit(1024, 1));
        if (*json) {
            nlohmann::json j{{"id", f.id()}};
            for (const auto& [name, value] : f.fields()) j[name] = value;
            j["blis_choice"] = choice_json(choice);
            if (limit) j["limit"] = limit_json(*limit);
            std::cout << j.dump(2) << "\n";
            return 0;
        }
        std::cout << "numerics fingerprint " << f.id() << "\n";
        for (const auto& [name, value] : f.fields()) std::cout << "  " << name << ": " << value << "\n";
        std::cout << "BLIS configurations (" << choice.reason << "): gemm " << choice.gemm
                  << ", the tiled kernel's micro-kernel " << choice.packed_float << " (float), "
                  << choice.packed_double << " (double); BLIS's own pick " << choice.own << "; this CPU runs";
        for (const std::string& r : choice.runnable) std::cout << " " << r;
        std::cout << "\n";
        if (limit) print_limit(choice, *limit);
        std::cout << "Results are bitwise reproducible for one fingerprint (any thread count); error bounds hold on "
                     "every one.\nForce a lower SIMD target with --simd-target NAME or ATTN_SIMD_TARGET=NAME, other "
                     "BLIS kernels with ATTN_BLIS_ARCH=NAME.\n";
        return 0;
    };
}

}  // namespace attn::cli
