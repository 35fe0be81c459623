// attn/error.hpp: the one error hierarchy of the library; every message names function, tensors and shapes.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn {

// The interfaces an option has a spelling in (attn/options.hpp, the option table).
enum class Interface { Cpp, Cli, Python };

// An option setting that would have allowed what an error refuses: set the option named `field` (its name in the
// option table) to one of `values` (their spellings in the table: "zero", "nan"; "false" for a bool) `purpose`
// ("to allow empty rows"). An error carries it apart from its message, so that each interface says it in its own
// terms (Error::message) and nothing rewrites the message.
struct Remedy {
    std::string field;
    std::vector<std::string> values;
    std::string purpose;
};

// Base of everything the library throws on bad input.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
    // what() is "<problem>; <the remedy in C++ terms>".
    Error(const std::string& problem, Remedy remedy);

    // The message in an interface's terms: what() for C++, the remedy spelled for the command line or Python.
    std::string message(Interface interface) const;
    const Remedy* remedy() const { return parts_ ? &parts_->remedy : nullptr; }

private:
    struct Parts {
        std::string problem;
        Remedy remedy;
    };
    std::shared_ptr<const Parts> parts_;  // null without a remedy; shared: copying an exception must not throw
};

// Ranks, sizes or broadcasting do not fit (e.g. q has Dk=64 but k has Dk=32).
class ShapeError : public Error {
public:
    using Error::Error;
};

// A mask is malformed or leaves a query row with no allowed key under EmptyRowPolicy::Throw.
class MaskError : public Error {
public:
    using Error::Error;
};

// A readable input value is NaN or Inf while finite-input checking is on.
class ValueError : public Error {
public:
    using Error::Error;
};

// An option or configuration is impossible (negative scale count, embed_dim % num_heads != 0, ...).
class ConfigError : public Error {
public:
    using Error::Error;
};

// A file could not be read or written, or its contents are malformed (.npy reader and writer).
class IoError : public Error {
public:
    using Error::Error;
};

}  // namespace attn
