// Fuzz target `safetensors`: the .safetensors reader on arbitrary bytes. A clean IoError naming the file, or
// tensors whose bytes match their shapes and dtypes, lie inside the input, and survive serialize -> parse
// unchanged. Never a crash, a leak, an over-read (ASan) or an allocation the input does not pay for.
#include "../decode.hpp"
#include "attn/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace attn;
    // An exact-size copy, so ASan catches any read past the input.
    std::vector<unsigned char> bytes(data, data + size);
    fuzz::current_config() = "safetensors(" + std::to_string(size) + " bytes)";
    std::vector<safetensors::Entry> entries;
    try {
        entries = safetensors::parse(std::span<const unsigned char>(bytes.data(), bytes.size()), "fuzz.safetensors");
    } catch (const IoError& e) {
        ATTN_FUZZ_REQUIRE(fuzz::contains(e.what(), "fuzz.safetensors"),
                          std::string("the message does not name the file: ") + e.what());
        return 0;
    } catch (const std::exception& e) {
        fuzz::fail(__FILE__, __LINE__, std::string("parse threw something other than IoError: ") + e.what());
    }
    std::size_t total = 0;
    for (const safetensors::Entry& e : entries) {
        ATTN_FUZZ_REQUIRE(e.array.data.size() == static_cast<std::size_t>(numel(e.array.shape)) * npy::item_size(e.array.dtype),
                          "tensor '" + e.name + "': " + std::to_string(e.array.data.size()) + " bytes for shape " +
                              to_string(e.array.shape));
        total += e.array.data.size();
    }
    ATTN_FUZZ_REQUIRE(total <= size, "more element bytes than the input holds");
    try {
        const std::vector<safetensors::Entry> again = safetensors::parse(safetensors::serialize(entries), "round-trip");
        ATTN_FUZZ_REQUIRE(again.size() == entries.size(), "serialize -> parse changed the number of tensors");
        for (std::size_t i = 0; i < entries.size(); ++i)
            ATTN_FUZZ_REQUIRE(again[i].name == entries[i].name && again[i].array.dtype == entries[i].array.dtype &&
                                  again[i].array.shape == entries[i].array.shape && again[i].array.data == entries[i].array.data,
                              "serialize -> parse changed tensor '" + entries[i].name + "'");
    } catch (const std::exception& e) {
        fuzz::fail(__FILE__, __LINE__, std::string("parsed tensors failed to round-trip: ") + e.what());
    }
    return 0;
}
