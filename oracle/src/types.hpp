// Internal: the fixed-precision Boost.Multiprecision types the oracle runs on, and a backend switch for benchmarks.
#pragma once

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <boost/multiprecision/mpfr.hpp>
#include <optional>

#include "attn/oracle/oracle.hpp"

namespace attn::oracle::detail {

namespace mp = boost::multiprecision;

// Precision fixed at compile time and stack-allocated: no process-wide MPFR default precision (a data race in
// Boost 1.74). et_off: no expression templates at all, so `auto` can never hold one.
using Mpfr114 = mp::number<mp::mpfr_float_backend<34, mp::allocate_stack>, mp::et_off>;   // 114 bits
using Mpfr261 = mp::number<mp::mpfr_float_backend<78, mp::allocate_stack>, mp::et_off>;   // 261 bits
using Mpfr516 = mp::number<mp::mpfr_float_backend<155, mp::allocate_stack>, mp::et_off>;  // 516 bits
using BinFloat113 = mp::number<mp::cpp_bin_float<113, mp::digit_base_2>, mp::et_off>;
using BinFloat256 = mp::number<mp::cpp_bin_float<256, mp::digit_base_2>, mp::et_off>;

// CppBinFloat is for the backend benchmark only: its exp is not correctly rounded, which the oracle's self-error
// bound (BOUNDS.md section 5) assumes.
enum class Backend { Mpfr, CppBinFloat };

}  // namespace attn::oracle::detail

namespace attn::oracle {

// The oracle on a chosen backend (scaled_dot_product_attention uses Mpfr); for the backend benchmark.
template <class T>
Result<T> solve_with_backend(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                             const OracleOptions& oracle_options, detail::Backend backend);

}  // namespace attn::oracle
