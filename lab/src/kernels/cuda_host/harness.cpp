// Runs one kernel's CUDA C++ on the CPU (see cuda_host.h; lab/src/kernels/cuda_host.rs).
//
// Usage: harness LAUNCH OUT
//   LAUNCH: u32 magic 0x4842414c ("LABH"), u32 version 1, u32 grid[3], u32 block[3],
//           u32 n_buffers, then per buffer u64 bytes + bytes, then u32 bytes + the info struct.
//   OUT:    u32 n_buffers, then per buffer u64 bytes + bytes (every buffer after the launch).
// The kernel's translation unit (the source, then the epilogue cuda_host.rs writes) defines
// lab_entry (the kernel called with the buffers and the info struct), lab_info_size,
// lab_shared and lab_shared_size (its dynamic shared memory; null and 0 without any).
//
// Blocks run one after another; a block's threads run as OS threads, `__syncthreads()` a
// std::barrier of them. Shared memory is filled with 0xff bytes (NaN as f32 and f16) before each
// block, so a read of shared memory no thread wrote shows in the outputs. Exit status 0 on
// success; 3 with one line on stderr when a check fails (a wmma precondition, lanes of a warp
// making different wmma calls, threads of a block reaching different numbers of barriers); 2 on
// a malformed file.
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

struct lab_dim3 {
    unsigned x, y, z;
};
thread_local lab_dim3 threadIdx;
thread_local lab_dim3 blockIdx;
lab_dim3 blockDim;
lab_dim3 gridDim;

extern "C" void lab_entry(void **buffers, const void *info);
extern "C" unsigned lab_info_size();
extern "C" char *lab_shared();
extern "C" unsigned lab_shared_size();

namespace {

struct Call {
    int op;
    uintptr_t ptr;
    unsigned ldm;
    int layout;
    bool operator==(const Call &o) const {
        return op == o.op && ptr == o.ptr && ldm == o.ldm && layout == o.layout;
    }
};

struct ThreadLog {
    std::vector<Call> calls;
    unsigned syncs = 0;
};

std::barrier<> *block_barrier = nullptr;
thread_local ThreadLog *log_of_thread = nullptr;
thread_local unsigned linear_id = 0;

[[noreturn]] void fail(const std::string &what) {
    std::fprintf(stderr, "cuda-host: %s\n", what.c_str());
    std::fflush(stderr);
    std::_Exit(3);
}

const char *op_name(int op) {
    switch (op) {
        case 1: return "fill_fragment";
        case 2: return "load_matrix_sync";
        case 3: return "store_matrix_sync";
        case 4: return "mma_sync";
        default: return "?";
    }
}

std::string where(uintptr_t p) {
    char buf[96];
    uintptr_t s = reinterpret_cast<uintptr_t>(lab_shared());
    if (s != 0 && p >= s && p < s + lab_shared_size())
        std::snprintf(buf, sizeof buf, "shared memory + %zu bytes", static_cast<size_t>(p - s));
    else
        std::snprintf(buf, sizeof buf, "address %#zx", static_cast<size_t>(p));
    return buf;
}

std::vector<uint8_t> read_file(const char *path) {
    FILE *f = std::fopen(path, "rb");
    if (!f) {
        std::fprintf(stderr, "cuda-host: cannot open %s\n", path);
        std::exit(2);
    }
    std::vector<uint8_t> data;
    uint8_t chunk[1 << 16];
    size_t n;
    while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) data.insert(data.end(), chunk, chunk + n);
    std::fclose(f);
    return data;
}

struct Reader {
    const std::vector<uint8_t> &d;
    size_t at = 0;
    template <class T> T get() {
        if (at + sizeof(T) > d.size()) {
            std::fprintf(stderr, "cuda-host: launch file truncated at byte %zu\n", at);
            std::exit(2);
        }
        T v;
        std::memcpy(&v, d.data() + at, sizeof(T));
        at += sizeof(T);
        return v;
    }
    const uint8_t *bytes(size_t n) {
        if (at + n > d.size()) {
            std::fprintf(stderr, "cuda-host: launch file truncated at byte %zu\n", at);
            std::exit(2);
        }
        const uint8_t *p = d.data() + at;
        at += n;
        return p;
    }
};

}  // namespace

void lab_syncthreads() {
    log_of_thread->syncs++;
    block_barrier->arrive_and_wait();
}

unsigned lab_lane() { return linear_id % 32; }

void lab_wmma_call(int op, const void *ptr, unsigned ldm, int layout, unsigned elem_bytes) {
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    if (op == 2 || op == 3) {
        if (p % 32 != 0)
            fail(std::string(op_name(op)) + ": pointer at " + where(p) +
                 " is not 256-bit aligned (CUDA C++ Programming Guide, warp matrix functions)");
        if ((ldm * elem_bytes) % 16 != 0)
            fail(std::string(op_name(op)) + ": ldm " + std::to_string(ldm) +
                 " is not a multiple of 16 bytes (" + std::to_string(elem_bytes) + "-byte elements)");
    }
    log_of_thread->calls.push_back(Call{op, p, ldm, layout});
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s LAUNCH OUT\n", argv[0]);
        return 2;
    }
    std::vector<uint8_t> file = read_file(argv[1]);
    Reader r{file};
    if (r.get<uint32_t>() != 0x4842414c || r.get<uint32_t>() != 1) {
        std::fprintf(stderr, "cuda-host: %s is not a version-1 launch file\n", argv[1]);
        return 2;
    }
    gridDim = {r.get<uint32_t>(), r.get<uint32_t>(), r.get<uint32_t>()};
    blockDim = {r.get<uint32_t>(), r.get<uint32_t>(), r.get<uint32_t>()};
    uint32_t n_buffers = r.get<uint32_t>();
    std::vector<std::vector<uint8_t>> storage(n_buffers);
    std::vector<uint8_t *> aligned(n_buffers);
    std::vector<size_t> sizes(n_buffers);
    for (uint32_t b = 0; b < n_buffers; b++) {
        size_t n = r.get<uint64_t>();
        sizes[b] = n;
        storage[b].resize(n + 256);
        uintptr_t base = reinterpret_cast<uintptr_t>(storage[b].data());
        aligned[b] = storage[b].data() + ((256 - base % 256) % 256);
        std::memcpy(aligned[b], r.bytes(n), n);
    }
    uint32_t info_bytes = r.get<uint32_t>();
    if (info_bytes != lab_info_size()) {
        std::fprintf(stderr, "cuda-host: info struct of %u bytes, the kernel's has %u\n", info_bytes,
                     lab_info_size());
        return 2;
    }
    alignas(16) uint8_t info[4096];
    if (info_bytes > sizeof info) {
        std::fprintf(stderr, "cuda-host: info struct of %u bytes is too large\n", info_bytes);
        return 2;
    }
    std::memcpy(info, r.bytes(info_bytes), info_bytes);
    std::vector<void *> args(aligned.begin(), aligned.end());

    unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    if (threads == 0 || threads > 1024) {
        std::fprintf(stderr, "cuda-host: %u threads per block (1 to 1024)\n", threads);
        return 2;
    }
    for (unsigned bz = 0; bz < gridDim.z; bz++)
        for (unsigned by = 0; by < gridDim.y; by++)
            for (unsigned bx = 0; bx < gridDim.x; bx++) {
                if (lab_shared_size() > 0) std::memset(lab_shared(), 0xff, lab_shared_size());
                std::barrier<> barrier(threads);
                block_barrier = &barrier;
                std::vector<ThreadLog> logs(threads);
                std::vector<std::thread> pool;
                pool.reserve(threads);
                for (unsigned t = 0; t < threads; t++) {
                    pool.emplace_back([&, t] {
                        threadIdx = {t % blockDim.x, (t / blockDim.x) % blockDim.y,
                                     t / (blockDim.x * blockDim.y)};
                        blockIdx = {bx, by, bz};
                        linear_id = t;
                        log_of_thread = &logs[t];
                        lab_entry(args.data(), info);
                        barrier.arrive_and_drop();
                    });
                }
                for (auto &th : pool) th.join();
                char block[64];
                std::snprintf(block, sizeof block, "block (%u, %u, %u)", bx, by, bz);
                for (unsigned t = 1; t < threads; t++)
                    if (logs[t].syncs != logs[0].syncs)
                        fail(std::string(block) + ": thread " + std::to_string(t) + " reached " +
                             std::to_string(logs[t].syncs) + " barriers, thread 0 " +
                             std::to_string(logs[0].syncs));
                for (unsigned t = 0; t < threads; t++) {
                    const ThreadLog &lead = logs[t - t % 32];
                    const ThreadLog &me = logs[t];
                    if (me.calls.size() != lead.calls.size())
                        fail(std::string(block) + ": lane " + std::to_string(t % 32) + " of warp " +
                             std::to_string(t / 32) + " made " + std::to_string(me.calls.size()) +
                             " wmma calls, lane 0 " + std::to_string(lead.calls.size()));
                    for (size_t c = 0; c < me.calls.size(); c++)
                        if (!(me.calls[c] == lead.calls[c]))
                            fail(std::string(block) + ": lane " + std::to_string(t % 32) + " of warp " +
                                 std::to_string(t / 32) + ": wmma call " + std::to_string(c) + " (" +
                                 op_name(me.calls[c].op) + ") differs from lane 0's (" +
                                 op_name(lead.calls[c].op) + ")");
                }
            }

    FILE *out = std::fopen(argv[2], "wb");
    if (!out) {
        std::fprintf(stderr, "cuda-host: cannot write %s\n", argv[2]);
        return 2;
    }
    std::fwrite(&n_buffers, 4, 1, out);
    for (uint32_t b = 0; b < n_buffers; b++) {
        uint64_t n = sizes[b];
        std::fwrite(&n, 8, 1, out);
        std::fwrite(aligned[b], 1, n, out);
    }
    std::fclose(out);
    return 0;
}
