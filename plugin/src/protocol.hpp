// plugin/src/protocol.hpp: what attn and its kernel worker (attn-kernel-worker) say to each other over a
// SOCK_SEQPACKET socket pair, one fixed-size message per write. Tensors never cross the socket: they live in one
// shared memory file (memfd) both processes map, at the offsets a request names.
//
//   worker -> host, once after loading:   Hello (the kernel's description, or why it could not be loaded)
//   host -> worker, per forward call:     Request (sizes, offsets and strides in the shared region, options)
//   worker -> host, per forward call:     Reply (the kernel's status and message)
//
// The worker never judges the kernel (the host validates the description and the results): it only loads, copies
// strings with bounds, and calls.
#pragma once

#include <cstdint>

namespace attn::plugin::wire {

constexpr std::uint32_t kMagic = 0x61747431;  // "att1": both ends of one build
constexpr int kMessageBytes = 1024;

enum class HelloStatus : std::int32_t { Loaded = 0, NotLoadable = 1, NoEntryPoint = 2, NullDescription = 3 };

struct Hello {
    std::uint32_t magic = kMagic;
    HelloStatus status = HelloStatus::Loaded;
    char message[kMessageBytes] = {};  // dlopen's or dlsym's error
    // The description as the kernel gave it (strings cut at the sizes below; *_null when the pointer was NULL).
    std::uint32_t abi_version = 0;
    char name[128] = {}, version[128] = {}, description[512] = {}, error_model[64] = {};
    std::uint8_t name_null = 0, version_null = 0, description_null = 0, error_model_null = 0;
    std::uint8_t forward_null = 0, reserved_set = 0;
    std::uint32_t dtypes = 0, masks = 0, empty_rows = 0;
    std::int32_t gqa = 0, strided = 0, weights = 0;
    std::int64_t max_dk = 0, max_dv = 0, key_block = 0;
    double exp_ulps = 0;
};

// One tensor in the shared region: rank 4, strides in elements, data at byte `offset` (-1: absent).
struct TensorRef {
    std::int64_t offset = -1;
    std::int64_t shape[4] = {};
    std::int64_t strides[4] = {};
};

struct Request {
    std::uint32_t magic = kMagic;
    std::uint64_t region_bytes = 0;  // the shared region's size (the worker maps it again when it changed)
    std::uint8_t code = 2, bits = 32;  // DLDataType of q, k, v, out, weights
    TensorRef q, k, v, mask, out, weights;
    double scale = 1;
    std::int32_t causal = 0, empty_rows = 0, num_threads = 0;
};

struct Reply {
    std::uint32_t magic = kMagic;
    std::int32_t status = 0;
    char message[kMessageBytes] = {};
};

}  // namespace attn::plugin::wire
