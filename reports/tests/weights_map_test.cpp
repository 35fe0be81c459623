// The weights heatmap: which cells it marks blocked, which batch element it reads, and the SVG it writes.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "attn/attn.hpp"
#include "attn/report/weights_map.hpp"

using namespace attn;

TEST_CASE("the weights map marks exactly the cells the call's contract blocks", "[report][weights_map]") {
    // B=2 batch elements, Tq=3, Tk=5; bottom-right causal: query i reads keys j <= i + 2; batch element 1's bias
    // blocks key 0 (-inf); batch element 0's weights are 0.25 everywhere they are read, element 1's 0.5.
    Tensor<double> q({2, 3, 4}, 0.0), k({2, 5, 4}, 0.0), v({2, 5, 2}, 0.0);
    Tensor<double> bias({2, 1, 5}, 0.0);
    bias[5] = -std::numeric_limits<double>::infinity();  // (1, 0, 0)
    SdpaOptions options;
    options.is_causal = true;
    options.alignment = CausalAlignment::BottomRight;
    options.bias = bias;
    Tensor<double> weights({2, 3, 5});
    for (Index n = 0; n < weights.numel(); ++n) weights[n] = n < 15 ? 0.25 : 0.5;
    for (Index b = 0; b < 2; ++b) {
        const report::WeightsMap map =
            report::weights_map<double>("test", q.view(), k.view(), v.view(), std::nullopt, options, weights.view(), b,
                                        "t");
        REQUIRE(map.Tq == 3);
        REQUIRE(map.Tk == 5);
        for (Index i = 0; i < 3; ++i)
            for (Index j = 0; j < 5; ++j) {
                const std::size_t n = static_cast<std::size_t>(i * 5 + j);
                const bool blocked = j > i + 2 || (b == 1 && j == 0);
                INFO("batch " << b << ", query " << i << ", key " << j);
                CHECK(static_cast<bool>(map.blocked[n]) == blocked);
                CHECK(map.weights[n] == (b == 0 ? 0.25 : 0.5));
            }
    }
    // Weights of another shape, or a batch element outside the batch, are refused by name.
    CHECK_THROWS_WITH(report::weights_map<double>("test", q.view(), k.view(), v.view(), std::nullopt, options,
                                                  Tensor<double>({2, 3, 4}).view(), 0, "t"),
                      Catch::Contains("test: weights [2,3,4] are not (batch..., Tq, Tk) = [2,3,5]"));
    CHECK_THROWS_AS(report::weights_map<double>("test", q.view(), k.view(), v.view(), std::nullopt, options,
                                                weights.view(), 2, "t"),
                    ShapeError);
}

TEST_CASE("the weights map is drawn as an SVG with its title, and refuses what it cannot draw", "[report][weights_map]") {
    report::WeightsMap map;
    map.Tq = 2, map.Tk = 3;
    map.weights = {1, 0, 0, 0.5, 0.5, 0};
    map.blocked = {0, 1, 1, 0, 0, 1};
    map.positions.is_causal = true;
    map.title = "a 2 x 3 map";
    const std::filesystem::path svg = std::filesystem::temp_directory_path() / "attn_weights_map_test.svg";
    std::filesystem::remove(svg);
    const std::string problem = report::write_weights_map(map, svg.string());
    INFO(problem);
    REQUIRE(problem.empty());
    std::ifstream in(svg);
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str().find("<svg") != std::string::npos);
    CHECK(text.str().find("a 2 x 3 map") != std::string::npos);
    CHECK(text.str().find("blocked") != std::string::npos);  // the colour band's label
    std::filesystem::remove(svg);

    map.Tq = 4096;
    CHECK(report::write_weights_map(map, svg.string()).find("at most 2048 per side") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(svg));
}
