// jaxrl CPU kernel: y[m, n] = sum_k x[m, k] * w[n, k], the weights stored in column panels.
//
// An XLA FFI custom call (target "jaxrl_panel_matmul", platform "cpu"); jaxrl/models/cpu_kernel.py
// builds this file with the machine's C++ compiler, registers it and documents the contract.
//
//   x   F32 [M, K]        activations (row-major)
//   w   F32 [P, K, 16]    weights: panel p holds output columns 16p .. 16p + 15, k-major, so a
//                         panel is one contiguous stream of K * 64 bytes
//   y   F32 [M, N]        N <= 16 P (columns past N in the last panel are not written)
//
// Why: a decode step multiplies a few rows (M <= 16) by every weight once, so it is bound by
// reading the weights. Each panel is read once, front to back, for all rows (8 rows at a time:
// 16 accumulators of 8 lanes; AVX2's 16 registers cannot hold them all with the operands, so the
// compiler keeps a few on the stack; measured faster than 4- or 6-row tiles, as the loop waits
// on memory), with a software prefetch a few KiB ahead so that the memory reads overlap the
// FMAs; the panels are split among the threads of XLA's intra-op pool. Accumulation is
// float32, in k order for every output.
//
// Written with GCC/Clang vector extensions (no intrinsics): 8-lane float vectors compile to AVX2
// on x86-64 and to pairs of NEON registers on AArch64.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8 __attribute__((vector_size(32)));
constexpr int64_t kPanel = 16;                 // output columns per panel (2 vectors)
constexpr int64_t kPrefetchFloats = 2048;      // 8 KiB ahead in the panel stream

inline v8 load(const float* p) { v8 v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }

// Rows m0 .. m0 + R - 1 of y for the panel `wp` ([K, 16]) at output column n0; `cols` of the
// panel's 16 columns are stored (16 but for a last, partial panel).
template <int R>
inline void panel_rows(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t m0, int64_t n0,
                       int64_t cols) {
  v8 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = v8{};
  const float* xm = x + m0 * K;
  for (int64_t k = 0; k < K; ++k) {
    __builtin_prefetch(wp + k * kPanel + kPrefetchFloats);
    const v8 w0 = load(wp + k * kPanel), w1 = load(wp + k * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const float s = xm[r * K + k];
      const v8 xs = {s, s, s, s, s, s, s, s};
      lo[r] += w0 * xs;
      hi[r] += w1 * xs;
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = y + (m0 + r) * N + n0;
    if (cols == kPanel) {
      store(out, lo[r]);
      store(out + 8, hi[r]);
    } else {
      float tmp[kPanel];
      store(tmp, lo[r]);
      store(tmp + 8, hi[r]);
      std::memcpy(out, tmp, cols * sizeof(float));
    }
  }
}

void panels(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* wp = w + p * K * kPanel;
    const int64_t n0 = p * kPanel, cols = N - n0 < kPanel ? N - n0 : kPanel;
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) panel_rows<8>(x, wp, y, K, N, m, n0, cols);
    if (M - m >= 4) { panel_rows<4>(x, wp, y, K, N, m, n0, cols); m += 4; }
    if (M - m >= 2) { panel_rows<2>(x, wp, y, K, N, m, n0, cols); m += 2; }
    if (M - m >= 1) panel_rows<1>(x, wp, y, K, N, m, n0, cols);
  }
}

// Panels handed out in chunks; the calling thread works too and then waits only for chunks
// another thread has already claimed (a pool thread that starts late, or not before the call
// ends, takes no chunk; one descheduled in the middle of a chunk is waited for, asleep after a
// short spin, so that its core can be handed to it). Shared ownership: a pool task may start
// after the call returned; it then finds no chunk left.
struct Work {
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N, P, chunk, num_chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable all_done;

  void run() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= num_chunks) return;
      const int64_t p0 = c * chunk, p1 = p0 + chunk < P ? p0 + chunk : P;
      panels(x, w, y, M, K, N, p0, p1);
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == num_chunks) {
        std::lock_guard<std::mutex> lock(mu);
        all_done.notify_all();
      }
    }
  }

  void wait() {
    for (int spins = 0; spins < 2048; ++spins) {
      if (done.load(std::memory_order_acquire) == num_chunks) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
    std::unique_lock<std::mutex> lock(mu);
    all_done.wait(lock, [this] { return done.load(std::memory_order_acquire) == num_chunks; });
  }
};

ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != kPanel || wd[1] != xd[1] ||
      yd[0] != xd[0] || yd[1] > wd[0] * kPanel || yd[1] <= (wd[0] - 1) * kPanel) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxrl_panel_matmul: expected x [M, K], w [P, K, 16], y [M, N] with 16 (P - 1) < N <= 16 P");
  }
  auto work = std::make_shared<Work>();
  work->x = x.typed_data();
  work->w = w.typed_data();
  work->y = y->typed_data();
  work->M = xd[0];
  work->K = xd[1];
  work->N = yd[1];
  work->P = wd[0];
  if (work->M == 0 || work->P == 0) return ffi::Error::Success();
  const int64_t threads = pool.num_threads() > 0 ? pool.num_threads() : 1;
  // About four chunks per thread: contiguous runs of panels (the prefetch stays useful) that
  // still balance a late-starting thread.
  const int64_t target = 4 * threads;
  work->chunk = (work->P + target - 1) / target;
  work->num_chunks = (work->P + work->chunk - 1) / work->chunk;
  const int64_t helpers = threads - 1 < work->num_chunks - 1 ? threads - 1 : work->num_chunks - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work->run(); });
  work->run();
  work->wait();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxrlPanelMatmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
