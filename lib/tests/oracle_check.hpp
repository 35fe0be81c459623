// Test helper: one call through both backends, each against the oracle under its own error model (`tiled` with the
// call's key block): every output element must be within its bound. Returns the worst error/bound of each.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <optional>

#include "attn/attn.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/tiled.hpp"

namespace attn::test {

template <class T>
std::array<double, 2> backends_within_oracle_bounds(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                    std::optional<TensorView<const bool>> mask, SdpaOptions options) {
    std::array<double, 2> tightness{};  // tiled, reference
    const Index key_block = options.tiled_key_block > 0 ? options.tiled_key_block : tiled_key_block;
    for (const Backend backend : {Backend::Tiled, Backend::Reference}) {
        oracle::OracleOptions oo;
        oo.model = backend == Backend::Tiled ? oracle::library_tiled_model(key_block) : oracle::reference_model();
        const oracle::Result<T> exact = oracle::scaled_dot_product_attention<T>(q, k, v, mask, options, oo);
        options.backend = backend;
        const auto out = scaled_dot_product_attention(q.view(), k.view(), v.view(), mask, options);
        const oracle::Comparison cmp = oracle::compare_output<T>(out.output.view(), exact);
        INFO(to_string(backend) << ": " << cmp.summary());
        CHECK(cmp.pass());
        CHECK(cmp.unbounded == 0);
        tightness[backend == Backend::Tiled ? 0 : 1] = cmp.max_tightness;
    }
    return tightness;
}

}  // namespace attn::test
