// attn/plugin/kernel_process.hpp: an external kernel (attn/kernel_abi.h) loaded in a worker process of its own,
// described and called from attn. Each call's tensors are laid out in memory the two processes share; the worker
// calls the kernel; the host then checks what the kernel did to memory it does not own (guard bytes around the
// output, the inputs compared with what was sent, no output element left unwritten). A crash, a hang past the
// timeout or any of those is a KernelFailure naming the kernel and what happened; the next call starts a fresh
// worker.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn::plugin {

// The kernel's description (attn_kernel), validated against the ABI's rules.
struct KernelInfo {
    std::string path, name, version, description;
    std::uint32_t dtypes = 0, masks = 0, empty_rows = 0;  // ATTN_KERNEL_* flags
    bool gqa = false, strided = false, weights = false;
    std::int64_t max_dk = 0, max_dv = 0;  // 0: no limit
    std::string error_model;               // generic, reference or tiled
    std::int64_t key_block = 0;
    double exp_ulps = 0;                   // 0: the model's default

    // "float32 float64; masks: bool, causal top-left; empty rows: zero nan; gqa; strided; weights; Dk <= 256".
    std::string capabilities() const;
};

// The file cannot be used as a kernel: not a shared library, no attn_kernel_get, another ABI version, or a
// description breaking the ABI's rules. The message names the file and what is wrong.
class LoadError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The kernel did something no correct kernel does: crashed, hung, wrote outside its output or into its inputs, left
// output elements unwritten, or returned ATTN_KERNEL_FAILED.
class KernelFailure : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The kernel returned ATTN_KERNEL_UNSUPPORTED: a case outside what it does. The message is the kernel's own (what
// it does not do, e.g. "Dk = 2 is not a multiple of 8"): reasons are counted, so they name no kernel.
class KernelDeclined : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// One rank-4 input as the kernel will see it: `bytes` bytes of storage copied from `data`, with strides (in
// elements) relative to its start.
struct InputTensor {
    const void* data = nullptr;
    std::size_t bytes = 0;
    std::array<std::int64_t, 4> shape{}, strides{};
};

struct ForwardCall {
    int bits = 32;  // 32 (float32) or 64 (float64)
    InputTensor q, k, v;
    std::optional<InputTensor> mask;  // uint8 0/1
    std::array<std::int64_t, 4> out_shape{};
    bool want_weights = false;  // weights (out_shape[0..2], k.shape[2])
    double scale = 1;
    int causal = 0, empty_rows = 0, num_threads = 0;  // ATTN_KERNEL_* values
};

class KernelProcess {
public:
    // Starts the worker on `path`; LoadError when the kernel cannot be used. `timeout_seconds`: how long one call
    // may take (after a hang, 1 s). `worker`: the attn-kernel-worker program (default_worker_path()).
    explicit KernelProcess(const std::string& path, double timeout_seconds = 10.0, std::string worker = {});
    // A worker that is already running and connected (the Python module serving a Python callable): `socket` is
    // its end of a SOCK_SEQPACKET pair, `memfd` the shared region. Nobody restarts it: after it fails, every call
    // fails. timeout_seconds 0: no limit (a Python kernel may take its time; the user can interrupt it).
    struct Connection {
        int socket = -1, memfd = -1;
    };
    KernelProcess(Connection connection, double timeout_seconds);
    ~KernelProcess();
    KernelProcess(const KernelProcess&) = delete;
    KernelProcess& operator=(const KernelProcess&) = delete;

    const KernelInfo& info() const { return info_; }
    // Runs one forward call; the results land, dense row-major, in out (and weights when asked for). Throws
    // KernelFailure or KernelDeclined.
    void forward(const ForwardCall& call, void* out, void* weights);
    // Workers started after a failure.
    int restarts() const { return restarts_; }
    double timeout_seconds() const { return timeout_; }

private:
    void start();
    void read_hello();
    int wait_ms() const;  // poll's timeout: -1 for none
    void stop();
    std::string died(const std::string& when);  // reaps the worker and says how it ended
    void ensure_region(std::size_t bytes);

    std::string path_, worker_;
    double timeout_;
    KernelInfo info_;
    int pid_ = -1, socket_ = -1, memfd_ = -1;
    char* region_ = nullptr;
    std::size_t region_bytes_ = 0;
    int restarts_ = 0;
    bool started_once_ = false;
    bool connected_ = false;  // a worker this process did not start and cannot restart
};

// ATTN_KERNEL_WORKER when set, else the worker built beside this program.
std::string default_worker_path();

}  // namespace attn::plugin
