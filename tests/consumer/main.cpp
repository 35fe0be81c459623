// A user's test through the installed package: one SDPA checked by hand, then a float case checked against the
// oracle's bound exactly as `attn check` decides (attn::oracle::check_candidate), and a wrong candidate that must fail.
#include <attn/attn.hpp>
#include <attn/oracle/metrics.hpp>
#include <attn/oracle/oracle.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

namespace {

// q (1, 2), k (2, 2), v (2, 1): logits (1, 0) / sqrt(2), output = weight of key 0.
bool hand_checked_case() {
    const attn::Tensor<double> q({1, 2}, {1, 0});
    const attn::Tensor<double> k({2, 2}, {1, 0, 0, 1});
    const attn::Tensor<double> v({2, 1}, {1, 0});
    const auto result = attn::scaled_dot_product_attention(q.view(), k.view(), v.view());
    const double expected = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
    std::printf("attn consumer: output %.17g, expected %.17g\n", result.output[0], expected);
    // 100 u (u = 2^-53): this checks that the package links and runs; the oracle case below checks accuracy.
    return std::abs(result.output[0] - expected) <= 100 * 0x1p-53;
}

// Deterministic inputs in [-1, 1], different for each tensor.
attn::Tensor<float> filled(attn::Shape shape, float phase) {
    attn::Tensor<float> t(std::move(shape));
    for (attn::Index i = 0; i < t.numel(); ++i) t[i] = std::sin(0.7f * static_cast<float>(i) + phase);
    return t;
}

bool oracle_checked_case() {
    const attn::Tensor<float> q = filled({2, 3, 4}, 0.1f);  // (B, Tq, Dk)
    const attn::Tensor<float> k = filled({2, 5, 4}, 1.3f);  // (B, Tk, Dk)
    const attn::Tensor<float> v = filled({2, 5, 3}, 2.9f);  // (B, Tk, Dv)
    attn::SdpaOptions options;
    options.is_causal = true;
    options.return_weights = true;
    const auto computed = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    // The generic model (attn check's default): a bound for any kernel, so it holds whichever backend ran.
    const auto exact = attn::oracle::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), std::nullopt,
                                                                         options);
    const attn::oracle::CheckVerdict verdict =
        attn::oracle::check_candidate<float>(computed.output.view(), exact, computed.weights->view());
    std::printf("attn consumer: library vs oracle: output %s\n", verdict.output.summary().c_str());
    if (!verdict.pass() || verdict.output.elements != 2 * 3 * 3 || !verdict.weights) {
        std::printf("attn consumer: the library's output should pass the oracle's check on all 18 elements\n");
        return false;
    }

    // A wrong candidate: output element (1, 2, 0) moved by 1 (outputs are averages of values in [-1, 1]).
    attn::Tensor<float> wrong = attn::Tensor<float>::copy_of(computed.output.view());
    const attn::Index flat = (1 * 3 + 2) * 3 + 0;
    wrong[flat] += 1.0f;
    const attn::oracle::CheckVerdict rejected = attn::oracle::check_candidate<float>(wrong.view(), exact);
    std::printf("attn consumer: perturbed candidate: %s\n", rejected.output.summary().c_str());
    if (rejected.pass() || rejected.output.violations != 1 || rejected.output.worst_flat != flat) {
        std::printf("attn consumer: the perturbed candidate should fail on exactly element %lld\n",
                    static_cast<long long>(flat));
        return false;
    }
    return true;
}

}  // namespace

int main() {
    try {
        const bool hand = hand_checked_case();
        const bool oracle = oracle_checked_case();
        return hand && oracle ? 0 : 1;
    } catch (const attn::Error& e) {
        std::printf("attn consumer: %s\n", e.what());
        return 1;
    }
}
