// attn/suite/property.hpp: a property (one invariant, one file), its coverage contract, and the runner that checks
// it against an implementation with RapidCheck, saves failures as case files and enforces coverage.
//
// Adding a property takes two edits: a file suite/invariants/<name>.cpp defining `Property <name>()`, and one
// line in suite/invariants/all.cpp.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "attn/suite/case.hpp"
#include "attn/suite/registry.hpp"

namespace attn::suite {

// The numeric regimes a run must reach (RapidCheck's RC_CLASSIFY only prints them; the suite enforces them).
enum class Regime {
    TieForRowMax,        // two allowed keys share a row's maximal logit exactly
    MaskedLogit,         // a -inf logit from a mask in a row that has allowed keys
    ExpOverflowLogits,   // a row whose largest allowed logit exceeds log(max finite): exp overflows unshifted
    Subnormal,           // a subnormal input value
    SingleAllowedKey,    // a row with exactly one allowed key
    LongRows,            // Tk >= 64: the Tk*u term of the bound is not negligible
    MaskRank2, MaskRank3, MaskRank4, MaskStride0,  // each way a mask broadcasts
    GroupedKv,           // K/V heads broadcast (shared or grouped)
};
const char* to_string(Regime regime);
// Every regime the case is in (logits computed in long double from the exact inputs).
std::set<Regime> classify(const SdpaCase& c);

// The numeric regimes (for properties that compare numbers) and the broadcast ones.
std::set<Regime> numeric_regimes();
std::set<Regime> broadcast_regimes();

// A check's verdict: nullopt when the property holds for the case, else what went wrong.
using Verdict = std::optional<std::string>;

struct Property {
    std::string name;      // snake_case, the file name: rows_sum_to_one
    std::string sentence;  // the full sentence it checks
    std::function<rc::Gen<SdpaCase>(Dtype)> generator;
    std::function<Verdict(const Implementation&, const SdpaCase&)> check;
    std::set<Regime> required;  // the coverage contract
    // Every case it draws carries a bias or ALiBi slopes: skipped outright for an implementation with
    // bias_unsupported.
    bool needs_bias = false;
    // Whether it applies to an implementation (default: all).
    std::function<bool(const Implementation&)> applies = [](const Implementation&) { return true; };
    int cost = 1;  // relative cost per case; the runner divides the case budget by it
    // A multiplier of the case budget, for a cheap property that draws one of many kinds of case (refusals): so
    // that every kind is drawn in every run.
    int breadth = 1;
};

// Every property, in the order the mutant table tries them.
const std::vector<Property>& properties();
const Property& property(const std::string& name);

struct RunSettings {
    int cases = 100;          // successful cases per (property, implementation, dtype), before dividing by cost
    int max_size = 100;       // RapidCheck's max size (keep <= 100: larger trips UBSan inside RapidCheck)
    std::uint64_t seed = 0;   // RapidCheck seed
    bool shrink = true;
    bool enforce_coverage = true;
    std::string regressions_dir;  // where failing cases are written ("" = do not write)
};

// Settings from RC_PARAMS (seed, max_success, max_size, noshrink) with the suite's defaults; `thorough` multiplies
// the case count by 20.
RunSettings settings_from_environment(bool thorough);

// The run's header line: the seed and how to reproduce it, and what the case budget means (per property and dtype,
// divided by a property's cost, topped up with fresh seeds up to 8 times until its coverage contract is met, so a
// run may evaluate more cases than the budget).
std::string describe_settings(const RunSettings& settings);

struct RunOutcome {
    bool passed = false;
    int cases = 0;               // cases run (including the failing one)
    double seconds = 0;
    std::string message;         // failure (with the config string) or coverage summary
    std::string case_file;       // path of the written case file, if any
    std::string reproduce;       // the command that reruns exactly the failing case (replay_command(case_file))
    std::optional<SdpaCase> counterexample;
    std::string config;          // config string of the counter-example
    // Cases skipped because the implementation does not support them (Unsupported), by reason; skipped_all when
    // no case could be judged (the run then passes and says so).
    std::map<std::string, int> skipped;
    bool skipped_all = false;
};

RunOutcome run_property(const Property& p, const Implementation& impl, Dtype dtype, const RunSettings& settings);

// The property's verdict on one case; an exception from the implementation or the check is a failure too.
Verdict check_case(const Property& p, const Implementation& impl, const SdpaCase& c);

// `./attn properties [--kernel '<kernel>'] --replay '<case file>'`: the command that reruns the case file (runner
// failures print it); kernel_path: the external kernel it failed for.
std::string replay_command(const std::string& case_file, const std::string& kernel_path = "");

// One row of the mutant table: the first property (in properties() order, float then double) that killed it.
struct MutantRow {
    std::string mutant;
    std::string description;
    bool killed = false;
    std::string killed_by;  // property name
    std::string dtype;
    std::string config;     // the killing case
    std::string reason;
    int cases = 0;          // cases run until the kill (all properties tried so far)
    double seconds = 0;
};

// Runs every property against every mutant until one kills it (no shrinking, no coverage contract, nothing
// written). `progress` (may be null) gets one line per mutant as it finishes.
std::vector<MutantRow> mutant_table(const RunSettings& settings, std::ostream* progress);
// The table as Markdown (mutant | killed | first killing property | cases | seconds), with the mutation score.
std::string format_mutant_table(const std::vector<MutantRow>& rows);

// Replays one case file: the property must hold for the named implementation(s) (every correct one for "*"),
// and fail for every mutant in `kills`. Returns the problems found (empty = replay passes); implementations not
// registered in this build are reported in `skipped`.
std::vector<std::string> replay_case(const CaseFile& file, std::vector<std::string>* skipped = nullptr);

}  // namespace attn::suite
