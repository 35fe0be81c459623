// Internal: the storage type's rounding units that the error models charge (oracle/BOUNDS.md section 11), shared by
// the forward's bound (softmax_bound.hpp, engine.hpp) and the backward's (backward.cpp).
#pragma once

#include <limits>

#include "attn/oracle/oracle.hpp"

namespace attn::oracle::detail {

// Section 11: the unit roundoff of the storage type T and half its smallest subnormal, as the model's roundings to
// T inside the computation charge them (ErrorModel::logit_storage_roundings, probabilities_in_storage; for float and
// double targets T itself, so the roundings count as more of the computation's own).
template <class T>
struct StorageUnits {
    static constexpr double u = static_cast<double>(static_cast<compute_t<T>>(std::numeric_limits<T>::epsilon())) / 2;
    static constexpr double half_denorm =
        static_cast<double>(static_cast<compute_t<T>>(std::numeric_limits<T>::denorm_min())) / 2;
};

}  // namespace attn::oracle::detail
