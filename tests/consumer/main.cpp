// One SDPA through the installed package: two keys, the query matches the first, so it gets the larger weight.
#include <attn/attn.hpp>
#include <cmath>
#include <cstdio>

int main() {
    // q (1, 2), k (2, 2), v (2, 1): logits (1, 0) / sqrt(2), output = weight of key 0.
    const attn::Tensor<double> q({1, 2}, {1, 0});
    const attn::Tensor<double> k({2, 2}, {1, 0, 0, 1});
    const attn::Tensor<double> v({2, 1}, {1, 0});
    const auto result = attn::scaled_dot_product_attention(q.view(), k.view(), v.view());
    const double expected = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
    std::printf("attn consumer: output %.17g, expected %.17g\n", result.output[0], expected);
    // 100 u (u = 2^-53): this checks that the package links and runs; lib/tests check accuracy with derived bounds.
    return std::abs(result.output[0] - expected) <= 100 * 0x1p-53 ? 0 : 1;
}
