// The suite's adapter for external kernels (suite/external.cpp) on the example kernel, for what the properties
// never draw: calls with no batch element at all.
#include <catch2/catch.hpp>

#include "attn/suite/registry.hpp"

TEST_CASE("a call with no batch element gives the empty output without dividing by zero heads (found by attn fuzz --kernel)",
          "[plugin]") {
    const attn::suite::Implementation& k = attn::suite::load_external(ATTN_EXAMPLE_KERNEL);
    for (const attn::Shape& batch : {attn::Shape{0, 3}, attn::Shape{2, 0}, attn::Shape{0}}) {
        attn::Shape qs = batch, ks = batch, vs = batch;
        qs.insert(qs.end(), {4, 8});
        ks.insert(ks.end(), {5, 8});
        vs.insert(vs.end(), {5, 2});
        const attn::Tensor<float> q(qs), key(ks), v(vs);
        const attn::SdpaResult<float> r = k.run<float>(q.view(), key.view(), v.view(), std::nullopt, {});
        attn::Shape expected = batch;
        expected.insert(expected.end(), {4, 2});
        CHECK(r.output.shape() == expected);
    }
}
