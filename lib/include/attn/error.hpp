// attn/error.hpp: the one error hierarchy of the library; every message names function, tensors and shapes.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

// Base of everything the library throws on bad input.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
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
