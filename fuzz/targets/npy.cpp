// Fuzz target `npy`: the .npy reader on arbitrary bytes. A clean IoError naming the file, or an array whose byte
// count matches its shape and dtype, converts to a tensor of exactly its dtype, and survives serialize -> parse
// unchanged. Never a crash, a leak, an over-read (ASan) or an allocation the input does not pay for.
#include <cstring>

#include "../decode.hpp"
#include "attn/io/npy.hpp"

namespace attn::fuzz {
namespace {

template <class T>
void check_tensor(const npy::Array& array) {
    Tensor<T> tensor;
    try {
        tensor = npy::to_tensor<T>(array, "fuzz.npy");
    } catch (const IoError& e) {
        // Only bool arrays may be refused after parsing (a byte other than 0 or 1 is no bool).
        ATTN_FUZZ_REQUIRE(array.dtype == npy::DType::Bool, std::string("to_tensor refused a parsed array: ") + e.what());
        return;
    }
    ATTN_FUZZ_REQUIRE(tensor.shape() == array.shape, "to_tensor changed the shape to " + to_string(tensor.shape()));
    const std::vector<unsigned char> bytes = npy::serialize<T>(tensor.view());
    npy::Array again = npy::parse(bytes, "round-trip.npy");
    // bfloat16 goes to .npy as its bits ('<i2'), and comes back as bfloat16 when named so.
    if constexpr (std::is_same_v<T, bfloat16>) {
        ATTN_FUZZ_REQUIRE(again.dtype == npy::DType::Int16, "a bfloat16 tensor was not written as int16 bits");
        again = npy::as_dtype(std::move(again), npy::DType::BFloat16, "round-trip.npy");
    }
    ATTN_FUZZ_REQUIRE(again.dtype == array.dtype && again.shape == array.shape, "serialize -> parse changed dtype or shape");
    ATTN_FUZZ_REQUIRE(again.data == array.data, "serialize -> parse changed the element bytes");
}

// Every other dtype is refused by to_tensor<T> with an IoError.
template <class T>
void check_refused(const npy::Array& array) {
    if (array.dtype == npy::dtype_of<T>()) return;
    try {
        (void)npy::to_tensor<T>(array, "fuzz.npy");
        fail(__FILE__, __LINE__, std::string("to_tensor<") + npy::to_string(npy::dtype_of<T>()) + "> accepted a " +
                                     npy::to_string(array.dtype) + " array");
    } catch (const IoError& e) {
        ATTN_FUZZ_REQUIRE(contains(e.what(), "fuzz.npy"), std::string("the message does not name the file: ") + e.what());
    }
}

}  // namespace
}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace attn;
    // An exact-size copy, so ASan catches any read past the input.
    std::vector<unsigned char> bytes(data, data + size);
    fuzz::current_config() = "npy(" + std::to_string(size) + " bytes)";
    npy::Array array;
    try {
        array = npy::parse(std::span<const unsigned char>(bytes.data(), bytes.size()), "fuzz.npy");
    } catch (const IoError& e) {
        ATTN_FUZZ_REQUIRE(fuzz::contains(e.what(), "fuzz.npy"), std::string("the message does not name the file: ") + e.what());
        return 0;
    } catch (const std::exception& e) {
        fuzz::fail(__FILE__, __LINE__, std::string("parse threw something other than IoError: ") + e.what());
    }
    fuzz::current_config() = "npy(" + std::to_string(size) + " bytes, " + npy::to_string(array.dtype) +
                             to_string(array.shape) + ")";
    ATTN_FUZZ_REQUIRE(array.data.size() == static_cast<std::size_t>(numel(array.shape)) * npy::item_size(array.dtype),
                      std::to_string(array.data.size()) + " data bytes");
    ATTN_FUZZ_REQUIRE(array.data.size() <= size, "more element bytes than the input holds");
    try {
        switch (array.dtype) {
            case npy::DType::Float32: fuzz::check_tensor<float>(array); break;
            case npy::DType::Float64: fuzz::check_tensor<double>(array); break;
            case npy::DType::Bool: fuzz::check_tensor<bool>(array); break;
            case npy::DType::Int64: fuzz::check_tensor<std::int64_t>(array); break;
            case npy::DType::Float16: fuzz::check_tensor<float16>(array); break;
            case npy::DType::BFloat16: fuzz::check_tensor<bfloat16>(array); break;
            case npy::DType::Int16:
            case npy::DType::UInt16:
                // 16-bit integers are read only as the bits of a 16-bit float (--dtype): both keep every byte.
                for (const npy::DType as : {npy::DType::BFloat16, npy::DType::Float16}) {
                    const npy::Array view = npy::as_dtype(array, as, "fuzz.npy");
                    ATTN_FUZZ_REQUIRE(view.data == array.data && view.shape == array.shape, "as_dtype changed the array");
                    if (as == npy::DType::BFloat16) fuzz::check_tensor<bfloat16>(view);
                    else fuzz::check_tensor<float16>(view);
                }
                break;
        }
        fuzz::check_refused<float16>(array);
        fuzz::check_refused<bfloat16>(array);
        fuzz::check_refused<float>(array);
        fuzz::check_refused<double>(array);
        fuzz::check_refused<bool>(array);
        fuzz::check_refused<std::int64_t>(array);
    } catch (const std::exception& e) {
        fuzz::fail(__FILE__, __LINE__, std::string("a parsed array failed to convert or round-trip: ") + e.what());
    }
    return 0;
}
