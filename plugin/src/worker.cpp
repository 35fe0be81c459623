// attn-kernel-worker SOCKET_FD MEMFD KERNEL.so: loads one kernel library and runs the forward calls the host sends
// (protocol.hpp). A separate process, so that whatever the kernel does to its address space (a crash, a stray
// write, a hang) is seen by the host as this process failing, never as the host failing. Started by
// attn::plugin::KernelProcess; not meant to be run by hand.
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "attn/kernel_abi.h"
#include "protocol.hpp"

namespace {

using namespace attn::plugin::wire;

void copy_string(char* to, std::size_t size, const char* from, std::uint8_t* was_null) {
    if (!from) {
        *was_null = 1;
        return;
    }
    std::size_t n = 0;
    while (n + 1 < size && from[n] != '\0') ++n;
    std::memcpy(to, from, n);
    to[n] = '\0';
}

bool send_all(int fd, const void* message, std::size_t size) {
    for (;;) {
        const ssize_t n = send(fd, message, size, MSG_NOSIGNAL);
        if (n == static_cast<ssize_t>(size)) return true;
        if (n < 0 && errno == EINTR) continue;
        return false;
    }
}

DLTensor tensor_at(char* region, const TensorRef& ref, DLDataType dtype) {
    DLTensor t{};
    t.data = region + ref.offset;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 4;
    t.dtype = dtype;
    // The host's TensorRef outlives the call: DLTensor points into the request itself.
    t.shape = const_cast<std::int64_t*>(ref.shape);
    t.strides = const_cast<std::int64_t*>(ref.strides);
    t.byte_offset = 0;
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "attn-kernel-worker: started by attn (attn properties --kernel FILE), not by hand\n");
        return 2;
    }
    const int sock = std::atoi(argv[1]);
    const int memfd = std::atoi(argv[2]);
    // The kernel's own printing goes to stderr: stdout belongs to the host's report.
    dup2(2, 1);

    Hello hello;
    void* lib = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
    attn_kernel_get_fn get = nullptr;
    const attn_kernel* kernel = nullptr;
    if (!lib) {
        hello.status = HelloStatus::NotLoadable;
        const char* why = dlerror();
        std::snprintf(hello.message, sizeof hello.message, "%s", why ? why : "dlopen failed");
    } else if (!(get = reinterpret_cast<attn_kernel_get_fn>(dlsym(lib, ATTN_KERNEL_ENTRY_POINT)))) {
        hello.status = HelloStatus::NoEntryPoint;
        const char* why = dlerror();
        std::snprintf(hello.message, sizeof hello.message, "%s", why ? why : "no such symbol");
    } else if (!(kernel = get())) {
        hello.status = HelloStatus::NullDescription;
    } else {
        hello.abi_version = kernel->abi_version;
        // Only the first field is read whatever the version: a kernel of another ABI is described no further.
        if (kernel->abi_version == ATTN_KERNEL_ABI_VERSION) {
            copy_string(hello.name, sizeof hello.name, kernel->name, &hello.name_null);
            copy_string(hello.version, sizeof hello.version, kernel->version, &hello.version_null);
            copy_string(hello.description, sizeof hello.description, kernel->description, &hello.description_null);
            copy_string(hello.error_model, sizeof hello.error_model, kernel->error_model, &hello.error_model_null);
            hello.forward_null = kernel->forward == nullptr;
            for (void* r : kernel->reserved) hello.reserved_set |= r != nullptr;
            hello.dtypes = kernel->dtypes;
            hello.masks = kernel->masks;
            hello.empty_rows = kernel->empty_rows;
            hello.gqa = kernel->gqa;
            hello.strided = kernel->strided;
            hello.weights = kernel->weights;
            hello.max_dk = kernel->max_dk;
            hello.max_dv = kernel->max_dv;
            hello.key_block = kernel->key_block;
            hello.exp_ulps = kernel->exp_ulps;
        }
    }
    if (!send_all(sock, &hello, sizeof hello)) return 3;
    if (hello.status != HelloStatus::Loaded || hello.abi_version != ATTN_KERNEL_ABI_VERSION || hello.forward_null)
        return 0;

    char* region = nullptr;
    std::uint64_t mapped = 0;
    for (;;) {
        Request request;
        const ssize_t n = recv(sock, &request, sizeof request, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) return 0;  // the host closed its end: done
        if (n != static_cast<ssize_t>(sizeof request) || request.magic != kMagic) return 4;
        if (request.region_bytes != mapped) {
            if (region) munmap(region, mapped);
            void* p = mmap(nullptr, request.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
            if (p == MAP_FAILED) return 5;
            region = static_cast<char*>(p);
            mapped = request.region_bytes;
        }
        const DLDataType dtype{request.code, request.bits, 1};
        const DLDataType mask_dtype{kDLUInt, 8, 1};
        DLTensor q = tensor_at(region, request.q, dtype), k = tensor_at(region, request.k, dtype),
                 v = tensor_at(region, request.v, dtype), out = tensor_at(region, request.out, dtype);
        DLTensor mask{}, weights{};
        if (request.mask.offset >= 0) mask = tensor_at(region, request.mask, mask_dtype);
        if (request.weights.offset >= 0) weights = tensor_at(region, request.weights, dtype);
        attn_kernel_forward_args args{};
        args.q = &q;
        args.k = &k;
        args.v = &v;
        args.allowed_mask = request.mask.offset >= 0 ? &mask : nullptr;
        args.out = &out;
        args.weights = request.weights.offset >= 0 ? &weights : nullptr;
        args.scale = request.scale;
        args.causal = request.causal;
        args.empty_rows = request.empty_rows;
        args.num_threads = request.num_threads;
        Reply reply;
        reply.status = kernel->forward(&args, reply.message, sizeof reply.message);
        reply.message[sizeof reply.message - 1] = '\0';
        if (!send_all(sock, &reply, sizeof reply)) return 3;
    }
}
