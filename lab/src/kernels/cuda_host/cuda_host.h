// The CUDA C++ of the lab's kernels, run on a CPU (lab/src/kernels/cuda_host.rs, `lab bench cuda-host`).
//
// Force-included (`-include cuda_host.h`) before one kernel's CUDA C++ exactly as cubecl-cpp
// generated it for NVRTC, this header gives that text a host meaning: one OS thread per CUDA
// thread of a block (harness.cpp runs the blocks one after another), `__syncthreads()` a barrier
// of the block's threads, `extern __shared__` memory one array the epilogue defines, `__half` the
// compiler's `_Float16` (IEEE binary16, conversions round to nearest even as `__float2half_rn`).
//
// `nvcuda::wmma` is modelled from the CUDA C++ Programming Guide's description of the warp matrix
// functions (section "Warp Matrix Functions"), not from any implementation: a fragment holds the
// whole 16 x 16 tile in every lane; `load_matrix_sync` reads element (r, c) of a row-major tile at
// p[r * ldm + c] and of a column-major one at p[c * ldm + r]; `mma_sync` computes D = A B + C with
// f32 accumulation; `store_matrix_sync` writes, in each lane, only the elements e with
// e % 32 == lane (a lane that reads another lane's elements before a barrier reads stale data,
// as on a GPU). Each call checks the guide's preconditions — a 256-bit aligned pointer, `ldm` a
// multiple of 16 bytes — and records (operation, pointer, ldm) for the harness, which requires
// the 32 lanes of each warp to make the same calls in the same order (the functions are
// collective: every lane of the warp must call them with the same arguments).
//
// No header defining `int64_t` may come before the kernel's own typedefs (its `long long int`
// differs from glibc's `long`), and glibc's <math.h> brings them in: only <stddef.h>, and the
// float functions the sources call as the compiler's builtins.
#pragma once
#include <stddef.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct lab_dim3 {
    unsigned x, y, z;
};
extern thread_local lab_dim3 threadIdx;
extern thread_local lab_dim3 blockIdx;
extern lab_dim3 blockDim;
extern lab_dim3 gridDim;

// Implemented by harness.cpp.
void lab_syncthreads();
unsigned lab_lane();
void lab_wmma_call(int op, const void *ptr, unsigned ldm, int layout, unsigned elem_bytes);
inline void __syncthreads() { lab_syncthreads(); }

struct __half {
    _Float16 v;
    __half() = default;
    __half(float f) : v(static_cast<_Float16>(f)) {}
    operator float() const { return static_cast<float>(v); }
};

#define LAB_FLOAT1(name) \
    inline float name(float x) { return __builtin_##name##f(x); }
LAB_FLOAT1(exp)
LAB_FLOAT1(log)
LAB_FLOAT1(cos)
LAB_FLOAT1(sin)
LAB_FLOAT1(tanh)
LAB_FLOAT1(sqrt)
LAB_FLOAT1(fabs)
LAB_FLOAT1(floor)
LAB_FLOAT1(ceil)
#undef LAB_FLOAT1
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float pow(float a, float b) { return __builtin_powf(a, b); }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

enum lab_op { lab_op_fill = 1, lab_op_load = 2, lab_op_store = 3, lab_op_mma = 4 };

template <class Use, int M, int N, int K> struct lab_shape {
    static constexpr int rows = M, cols = N;
};
template <int M, int N, int K> struct lab_shape<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct lab_shape<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <class L> struct lab_layout {
    static constexpr int value = -1;
};
template <> struct lab_layout<row_major> {
    static constexpr int value = mem_row_major;
};
template <> struct lab_layout<col_major> {
    static constexpr int value = mem_col_major;
};

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static constexpr int rows = lab_shape<Use, M, N, K>::rows;
    static constexpr int cols = lab_shape<Use, M, N, K>::cols;
    static constexpr int layout = lab_layout<Layout>::value;
    static constexpr int num_elements = rows * cols;
    T x[rows * cols];  // element (r, c) at x[r * cols + c], in every lane
};

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &value) {
    lab_wmma_call(lab_op_fill, nullptr, 0, 0, sizeof(T));
    for (int e = 0; e < f.num_elements; e++) f.x[e] = T(float(value));
}

template <class F, class T> inline void lab_load(F &f, const T *p, unsigned ldm, int layout) {
    lab_wmma_call(lab_op_load, p, ldm, layout, sizeof(T));
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

// A and B: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm) {
    static_assert(lab_layout<L>::value >= 0, "an A or B fragment names its layout");
    lab_load(f, p, ldm, lab_layout<L>::value);
}

// The accumulator: the layout is the call's.
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm,
                             layout_t layout) {
    lab_load(f, p, ldm, layout);
}

template <int M, int N, int K, class T>
inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm,
                              layout_t layout) {
    lab_wmma_call(lab_op_store, p, ldm, layout, sizeof(T));
    using F = fragment<accumulator, M, N, K, T>;
    unsigned lane = lab_lane();
    for (int e = (int)lane; e < F::num_elements; e += 32) {
        int r = e / F::cols, c = e % F::cols;
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
}

template <int M, int N, int K, class TA, class LA, class LB, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TA, LB> &b,
                     const fragment<accumulator, M, N, K, TC> &c) {
    lab_wmma_call(lab_op_mma, nullptr, 0, 0, sizeof(TA));
    float out[M * N];
    for (int r = 0; r < M; r++)
        for (int col = 0; col < N; col++) {
            float acc = float(c.x[r * N + col]);
            for (int k = 0; k < K; k++) acc += float(a.x[r * K + k]) * float(b.x[k * N + col]);
            out[r * N + col] = acc;
        }
    for (int e = 0; e < M * N; e++) d.x[e] = TC(out[e]);
}
}  // namespace wmma
}  // namespace nvcuda
