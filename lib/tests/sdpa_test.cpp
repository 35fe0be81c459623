// SDPA: the course module's worked example, masks, policies, cross-attention, errors.
#include <catch2/catch.hpp>

#include "attn/attn.hpp"

using namespace attn;

TEST_CASE("the course module's worked example (Part 2) comes out right", "[sdpa][example]") {
    // q (1,3,4), k (1,3,4), v (1,3,2)
    const Tensor<float> q({1, 3, 4}, {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0});
    const Tensor<float> k({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0});
    const Tensor<float> v({1, 3, 2}, {10, 0, 0, 10, 5, 5});
    SdpaOptions options;
    options.return_weights = true;
    const auto r = scaled_dot_product_attention(q, k, v, std::nullopt, options);
    const float weights[] = {0.3837f, 0.2327f, 0.3837f, 0.2327f, 0.3837f, 0.3837f, 0.2741f, 0.2741f, 0.4519f};
    const float output[] = {5.7548f, 4.2452f, 4.2452f, 5.7548f, 5.0f, 5.0f};
    REQUIRE(r.weights->shape() == Shape{1, 3, 3});
    REQUIRE(r.output.shape() == Shape{1, 3, 2});
    for (int i = 0; i < 9; ++i) CHECK((*r.weights)[i] == Approx(weights[i]).margin(1e-4));
    for (int i = 0; i < 6; ++i) CHECK(r.output[i] == Approx(output[i]).margin(1e-4));
}
