// CPU emulation of the CUDA built-ins kilnc's generated kernels use (kernelPrelude(Target::Cuda),
// compiler/kernel_codegen.cpp, compiler/attention_cuda.cpp), so that the generated CUDA C++ can
// be compiled by the host compiler and run on the CPU.
//
// Fibers start with makecontext/setcontext and then switch with _setjmp/_longjmp, which (unlike
// swapcontext) make no system call; build without _FORTIFY_SOURCE (its longjmp check rejects
// jumps between stacks). Under AddressSanitizer every switch is announced to it (the fiber API of
// sanitizer/common_interface_defs.h), so that it knows which stack runs (a report's stack trace
// from inside a kernel, an address on a fiber stack), and jumps with the C library's own _longjmp:
// ASan's interceptor of _longjmp makes a sigaltstack system call and clears the shadow of the
// signal stack and of the stack it jumps from, at every switch (some 1.6 us, 25 times the switch
// itself), work for the stack redzones that kernels built with asan-stack=0 do not have.
//
// Execution model: the blocks of a launch run one after another; the threads of a block run as
// cooperative fibers (ucontext) that switch only at __syncthreads and the warp-wide operations
// (shuffles, mma, ldmatrix; their order: KEMU_SCHEDULE below), so
// every other operation (shared memory, atomics) is free of races. __syncthreads waits for every
// thread of the block that has not returned; a shuffle waits for every live lane of its warp.
// A barrier nobody can pass (a deadlock on the GPU) stops the run; __syncthreads reached from
// different lines in the same round, and a shuffle in a warp some of whose lanes have returned,
// are counted (kemu_stats), and the emulated device fails the launch that did either. Lanes of one
// warp released together from warp-wide operations on different lines (divergent lanes at a
// full-mask shuffle) stop the run, and so does a shuffle whose mask leaves out its own lane or
// the lane it reads. Shared memory is filled with NaN bytes before every block
// (KEMU_SHARED=keep: not; KEMU_SHARED=big: 0x7f bytes, huge finite values), as a GPU leaves it
// undefined: a static would read zeros in the first block and the previous block's values after it.
//
// Used by kernels_tu.cpp, which includes the generated kernels.cu inside a namespace after this
// header; the driver (driver.cpp) reaches launches through kemu_launch (extern "C").
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <setjmp.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define KEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEMU_ASAN 1
#endif
#endif
#ifdef KEMU_ASAN
#include <dlfcn.h>
#include <sanitizer/common_interface_defs.h>
#endif

#undef INFINITY  // kernels.cu defines its own, from __int_as_float

namespace kemu {
struct Dim3 {
  unsigned x, y, z;
};
constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 256 * 1024;
enum State { Run, AtBlock, AtWarp, Done };
struct Fiber {
  ucontext_t ctx;
  jmp_buf jb;
  bool started;
  State st;
  int line;
#ifdef KEMU_ASAN
  void* fake_stack;  // ASan's fake stack of the fiber while it is switched out
#endif
};
inline Dim3 block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
inline int cur = 0;
inline Fiber fibers[kMaxThreads];
inline jmp_buf sched;
inline int block_arrived = 0, live_block = 0;
inline int warp_arrived[kMaxThreads / 32], live_warp[kMaxThreads / 32], lanes_warp[kMaxThreads / 32];
inline unsigned long long slot[kMaxThreads];
inline char* stacks = nullptr;
// Statistics and diagnostics, reported by the driver.
inline long long n_block_syncs = 0, n_warp_syncs = 0, n_launches = 0, n_blocks = 0;
inline long long n_shfl_exited_lanes = 0, n_divergent_syncthreads = 0;
inline const char* launch_name = "";

// A thread's queued cp.async copies (see cp_async16 below).
constexpr int kMaxPending = 64;
struct AsyncCopy {
  void* dst;
  const void* src;
  bool full;
  int group;
};
inline AsyncCopy pending[kMaxThreads][kMaxPending];
inline int n_pending[kMaxThreads], open_group[kMaxThreads];

#ifdef KEMU_ASAN
// The C library's _longjmp, past ASan's interceptor (see the top); the interceptor if the C
// library is not found by that name.
inline void (*const jump)(struct __jmp_buf_tag*, int) = [] {
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  void* f = libc ? dlsym(libc, "_longjmp") : nullptr;
  return f ? reinterpret_cast<void (*)(struct __jmp_buf_tag*, int)>(f) : &_longjmp;
}();
// The scheduler's stack (the launching thread's), as ASan gave it when the first fiber started.
inline const void* sched_bottom = nullptr;
inline size_t sched_size = 0;
inline void* sched_fake_stack = nullptr;
// Leaving fiber cur for the scheduler (fake stack saved in the fiber, or none when it has returned).
inline void to_scheduler(bool returned) {
  __sanitizer_start_switch_fiber(returned ? nullptr : &fibers[cur].fake_stack, sched_bottom, sched_size);
  jump(sched, 1);  // (not known to the compiler not to return: it would call ASan's
}                   // __asan_handle_no_return first, the cost the jump avoids)
#define KEMU_LONGJMP_SCHED() to_scheduler(false)
#define KEMU_RESUMED() __sanitizer_finish_switch_fiber(fibers[cur].fake_stack, nullptr, nullptr)
#else
#define KEMU_LONGJMP_SCHED() _longjmp(sched, 1)
#define KEMU_RESUMED() (void)0
#endif
inline void yield() {
  if (!_setjmp(fibers[cur].jb)) KEMU_LONGJMP_SCHED();
  else KEMU_RESUMED();
}
inline void sync_block(int line) {
  fibers[cur].st = AtBlock;
  fibers[cur].line = line;
  block_arrived++;
  yield();
}
inline void sync_warp(int line) {
  fibers[cur].st = AtWarp;
  fibers[cur].line = line;
  warp_arrived[cur / 32]++;
  yield();
}
// A shuffle's mask must name the calling lane and the lane it reads (undefined on a GPU otherwise).
inline void check_mask(unsigned mask, int lane, int src, int line) {
  if ((mask >> lane & 1u) && (mask >> src & 1u)) return;
  fprintf(stderr, "kemu: %s block %u thread %d (line %d): shuffle mask 0x%08x leaves out lane %d\n", launch_name,
          block_idx.x, cur, line, mask, (mask >> lane & 1u) ? src : lane);
  exit(3);
}
template <class T>
inline T shfl(T v, int src_lane, int width, int line, unsigned mask = 0xffffffffu) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffle of a wide type");
  memcpy(&slot[cur], &v, sizeof v);
  sync_warp(line);
  const int lane = cur % 32, base = cur - lane;
  const int w = (width <= 0 || width > 32) ? 32 : width;
  const int src = (lane / w) * w + (src_lane % w + w) % w;
  check_mask(mask, lane, src, line);
  T r;
  memcpy(&r, &slot[base + src], sizeof r);
  sync_warp(line);
  return r;
}
template <class T>
inline T shfl_xor(T v, int lane_mask, int width, int line, unsigned mask = 0xffffffffu) {
  const int lane = cur % 32;
  const int w = (width <= 0 || width > 32) ? 32 : width;
  return shfl(v, ((lane ^ lane_mask) % w), w, line, mask);
}
}  // namespace kemu

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Block shared memory: function statics in one section, which run_block fills with 0xff (a NaN
// in fp32 and bf16) before every block, as a GPU leaves it undefined (KEMU_SHARED=keep: not).
// A kernel that reads shared memory it has not written then computes NaNs instead of reading the
// zeros of a static's first use or what the previous block left.
#define __shared__ static __attribute__((section("kemu_shared")))
#define __restrict__
#define threadIdx (kemu::Dim3{(unsigned)kemu::cur % kemu::block_dim.x, 0u, 0u})
#define blockIdx (kemu::block_idx)
#define blockDim (kemu::block_dim)
#define gridDim (kemu::grid_dim)
#define warpSize 32
#define __syncthreads() kemu::sync_block(__LINE__)
#define __syncwarp(...) kemu::sync_warp(__LINE__)
#define __shfl_sync(mask, v, src, ...) kemu::shfl((v), (src), (0 __VA_OPT__(+) __VA_ARGS__), __LINE__, (mask))
#define __shfl_xor_sync(mask, v, lm, ...) kemu::shfl_xor((v), (lm), (0 __VA_OPT__(+) __VA_ARGS__), __LINE__, (mask))
#define __align__(n) __attribute__((aligned(n)))
inline void __threadfence() {}
inline void __threadfence_block() {}

inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
template <class T> inline T __ldg(const T* p) { return *p; }

// Atomics: fibers never switch inside one, so plain read-modify-writes are atomic.
inline float atomicAdd(float* p, float v) { const float o = *p; *p = o + v; return o; }
inline double atomicAdd(double* p, double v) { const double o = *p; *p = o + v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned o = *p; *p = o + v; return o; }
inline int atomicAdd(int* p, int v) { const int o = *p; *p = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long o = *p; *p = o + v; return o;
}
inline float atomicMax(float* p, float v) { const float o = *p; *p = o > v ? o : v; return o; }
inline int atomicMax(int* p, int v) { const int o = *p; *p = o > v ? o : v; return o; }
inline unsigned atomicInc(unsigned* p, unsigned lim) { const unsigned o = *p; *p = o >= lim ? 0 : o + 1; return o; }
inline int atomicCAS(int* p, int cmp, int v) { const int o = *p; if (o == cmp) *p = v; return o; }
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) { const unsigned o = *p; if (o == cmp) *p = v; return o; }

namespace kemu {
typedef void (*KernelFn)(void* const*, const long long*);
inline KernelFn g_fn;
inline void* const* g_args;
inline const long long* g_range;

inline void trampoline() {
#ifdef KEMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sched_bottom, &sched_size);
#endif
  g_fn(g_args, g_range);
  fibers[cur].st = Done;
  live_block--;
  live_warp[cur / 32]--;
  // Never returns: the fiber's stack is reused by the next block.
#ifdef KEMU_ASAN
  to_scheduler(true);
#else
  _longjmp(sched, 1);
#endif
}
// Runs fiber i until it waits or finishes.
__attribute__((noinline)) inline void resume(int i) {
  cur = i;
  if (!_setjmp(sched)) {
#ifdef KEMU_ASAN
    __sanitizer_start_switch_fiber(&sched_fake_stack, stacks + size_t(i) * kStack, kStack);
#endif
    if (!fibers[i].started) {
      fibers[i].started = true;
      setcontext(&fibers[i].ctx);
    }
#ifdef KEMU_ASAN
    jump(fibers[i].jb, 1);
#else
    _longjmp(fibers[i].jb, 1);
#endif
  }
#ifdef KEMU_ASAN
  __sanitizer_finish_switch_fiber(sched_fake_stack, nullptr, nullptr);
#endif
}

[[noreturn]] inline void deadlock(unsigned n) {
  fprintf(stderr, "kemu: DEADLOCK in %s block %u: no thread can move\n", launch_name, block_idx.x);
  for (unsigned w = 0; w < (n + 31) / 32; w++) {
    fprintf(stderr, "  warp %u:", w);
    for (unsigned i = w * 32; i < n && i < w * 32 + 32; i++) {
      const Fiber& f = fibers[i];
      fprintf(stderr, " %s", f.st == Done ? "done" : f.st == AtBlock ? "B" : f.st == AtWarp ? "W" : "run");
      if (f.st == AtBlock || f.st == AtWarp) fprintf(stderr, "@%d", f.line);
    }
    fprintf(stderr, "\n");
  }
  exit(3);
}

// The order warps run in between block barriers. By default every warp takes one step (up to its
// next shuffle or warp-wide instruction) per round, so warps stay in step; KEMU_SCHEDULE=warps
// runs each warp as far as it can before the next one starts, so that a missing __syncthreads
// between one warp's reads of shared memory and another's writes changes what is read.
inline const bool warp_at_a_time = [] {
  const char* v = getenv("KEMU_SCHEDULE");
  return v && strcmp(v, "warps") == 0;
}();

}  // namespace kemu
extern "C" char __start_kemu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_kemu_shared[] __attribute__((weak, visibility("hidden")));
namespace kemu {
// The byte shared memory is filled with before every block: 0xff (NaN) by default;
// KEMU_SHARED=keep: none; KEMU_SHARED=big: 0x7f, a huge finite value (3.4e38 in fp32 and bf16,
// a large int, true), which a NaN would hide from (max reductions, comparisons, masks).
inline const int shared_fill = [] {
  const char* v = getenv("KEMU_SHARED");
  if (v && strcmp(v, "keep") == 0) return -1;
  if (v && strcmp(v, "big") == 0) return 0x7f;
  return 0xff;
}();
inline const bool poison_shared = shared_fill >= 0;
// Fills [p, end) with that byte. Under AddressSanitizer (the kernels built with
// -fsanitize-sections=kemu_shared, so that each __shared__ array has its own redzones) byte by
// byte without instrumentation: a memset of the whole section would hit the redzones.
#ifdef KEMU_ASAN
__attribute__((no_sanitize_address, noinline)) inline void fill_shared(char* p, char* end) {
  for (volatile char* q = p; q < end; q++) *q = char(shared_fill);
}
#else
inline void fill_shared(char* p, char* end) { memset(p, shared_fill, size_t(end - p)); }
#endif
inline void run_block(unsigned n) {
  if (poison_shared && __start_kemu_shared && __stop_kemu_shared > __start_kemu_shared)
    fill_shared(__start_kemu_shared, __stop_kemu_shared);
  live_block = int(n);
  block_arrived = 0;
  for (unsigned w = 0; w < (n + 31) / 32; w++) {
    warp_arrived[w] = 0;
    lanes_warp[w] = live_warp[w] = int(n - w * 32 < 32 ? n - w * 32 : 32);
  }
  for (unsigned i = 0; i < n; i++) {
    getcontext(&fibers[i].ctx);
    fibers[i].ctx.uc_stack.ss_sp = stacks + size_t(i) * kStack;
    fibers[i].ctx.uc_stack.ss_size = kStack;
    fibers[i].ctx.uc_link = nullptr;
    fibers[i].started = false;
    makecontext(&fibers[i].ctx, trampoline, 0);
    fibers[i].st = Run;
    n_pending[i] = 0;
    open_group[i] = 0;
  }
  while (live_block > 0) {
    bool ran = false, released = false;
    for (unsigned w = 0; w < (n + 31) / 32; w++)
      for (;;) {
        for (unsigned i = w * 32; i < n && i < w * 32 + 32; i++)
          if (fibers[i].st == Run) {
            resume(int(i));
            ran = true;
          }
        if (warp_arrived[w] == 0 || warp_arrived[w] != live_warp[w]) break;
        if (live_warp[w] < lanes_warp[w]) n_shfl_exited_lanes++;
        // The lanes must be at one warp-wide operation: a full-mask shuffle (or mma, ldmatrix)
        // that lanes reach from different lines is undefined on the GPU (divergent lanes wait at
        // different instructions), though here it would exchange values as if it were one.
        int wline = -1;
        for (unsigned i = w * 32; i < n && i < w * 32 + 32; i++)
          if (fibers[i].st == AtWarp) {
            if (wline >= 0 && fibers[i].line != wline) {
              fprintf(stderr, "kemu: %s block %u warp %u: lanes reached warp-wide operations at lines %d and %d "
                      "together (divergent lanes at a full-mask shuffle)\n", launch_name, block_idx.x, w, wline,
                      fibers[i].line);
              exit(3);
            }
            wline = fibers[i].line;
          }
        for (unsigned i = w * 32; i < n && i < w * 32 + 32; i++)
          if (fibers[i].st == AtWarp) fibers[i].st = Run;
        warp_arrived[w] = 0;
        n_warp_syncs++;
        released = true;
        if (!warp_at_a_time) break;
      }
    if (block_arrived > 0 && block_arrived == live_block) {
      int line = -1;
      bool divergent = false;
      for (unsigned i = 0; i < n; i++)
        if (fibers[i].st == AtBlock) {
          if (line >= 0 && fibers[i].line != line) divergent = true;
          line = fibers[i].line;
          fibers[i].st = Run;
        }
      if (divergent) {
        if (n_divergent_syncthreads++ < 5)
          fprintf(stderr, "kemu: %s block %u: __syncthreads reached from different lines in one round\n",
                  launch_name, block_idx.x);
      }
      block_arrived = 0;
      n_block_syncs++;
      released = true;
    }
    if (!ran && !released && live_block > 0) deadlock(n);
  }
}
}  // namespace kemu

// The prelude's warp-wide instructions (kernelPrelude, compiler/kernel_codegen.cpp), replacing its
// inline asm. mma.sync.m16n8k16 (bf16 in, fp32 accumulate) with the fragment layout of the PTX ISA
// (see compiler/attention_cuda_mma.cpp): every lane publishes its A and B registers, then computes
// its own four D elements from the whole warp's. ldmatrix: every lane publishes its row address,
// then gathers its registers. Both check the alignment the hardware requires.
#define KILN_CUDA_EMULATION
namespace kemu {
inline unsigned mma_a[kMaxThreads][4], mma_b[kMaxThreads][2];
inline const unsigned short* ldm_row[kMaxThreads];
[[noreturn]] inline void misaligned(const char* what, const void* p, int bytes = 16) {
  fprintf(stderr, "kemu: %s block %u thread %d: %s address %p is not %d-byte aligned\n", launch_name, block_idx.x,
          cur, what, p, bytes);
  exit(3);
}
// A 32-bit access (two bf16 as one word: ld_pair, st_pair) faults on a GPU unless 4-byte aligned;
// on x86 it would just work.
inline void check_word_aligned(const char* what, const void* p) {
  if ((unsigned long long)p % 4) misaligned(what, p, 4);
}
inline void ldmatrix(unsigned* r, const unsigned short* p, bool trans) {
  if ((unsigned long long)p % 16) misaligned("ldmatrix row", p);
  ldm_row[cur] = p;
  sync_warp(__LINE__);
  const int lane = cur % 32, base = cur - lane, g = lane / 4, t = lane % 4;
  for (int m = 0; m < 4; m++) {
    const unsigned short* const* rows = &ldm_row[base + 8 * m];
    const unsigned lo = trans ? rows[2 * t][g] : rows[g][2 * t], hi = trans ? rows[2 * t + 1][g] : rows[g][2 * t + 1];
    r[m] = lo | hi << 16;
  }
  sync_warp(__LINE__);  // every lane has gathered before any publishes a new address
}
}  // namespace kemu
inline void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b) {
  using namespace kemu;
  memcpy(mma_a[cur], a, sizeof mma_a[0]);
  memcpy(mma_b[cur], b, sizeof mma_b[0]);
  sync_warp(__LINE__);
  const int lane = cur % 32, base = cur - lane, g = lane / 4, t = lane % 4;
  auto half = [](unsigned w, int hi) {
    unsigned u = (hi ? w >> 16 : w & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  };
  // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2.
  auto A = [&](int row, int k) { return half(mma_a[base + (row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k & 1); };
  // B[k][col]: lane col * 4 + (k % 8) / 2, register (k >= 8), half k % 2.
  auto Bm = [&](int k, int col) { return half(mma_b[base + col * 4 + (k % 8) / 2][k >= 8], k & 1); };
  float out[4];
  for (int e = 0; e < 4; e++) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    float acc = 0.0f;
    for (int k = 0; k < 16; k++) acc += A(row, k) * Bm(k, col);
    out[e] = d[e] + acc;
  }
  sync_warp(__LINE__);  // every lane has read the fragments before any publishes new ones
  for (int e = 0; e < 4; e++) d[e] = out[e];
}
inline void ldmatrix_x4(unsigned* r, const unsigned short* p) { kemu::ldmatrix(r, p, false); }
inline void ldmatrix_x4_trans(unsigned* r, const unsigned short* p) { kemu::ldmatrix(r, p, true); }

// cp.async: on the GPU a copy lands at some moment between its issue and the wait that covers it.
// The emulation takes one of the two extremes, so that a race shows as wrong numbers instead of
// passing by luck: by default a thread's copies are queued until a cp_async_wait<N> completes the
// groups older than its N newest commits (a tile read before its wait reads stale bytes);
// with KEMU_CP_ASYNC=eager they land at once (a tile refilled while another warp still reads it
// changes under that warp).
namespace kemu {
inline const bool eager_copies = [] {
  const char* v = getenv("KEMU_CP_ASYNC");
  return v && strcmp(v, "eager") == 0;
}();
}  // namespace kemu
inline void cp_async16(void* smem, const void* gmem, bool full) {
  using namespace kemu;
  if ((unsigned long long)smem % 16) misaligned("cp.async shared", smem);
  if ((unsigned long long)gmem % 16) misaligned("cp.async global", gmem);
  if (n_pending[cur] == kMaxPending) {
    fprintf(stderr, "kemu: %s: more than %d asynchronous copies in flight in one thread\n", launch_name, kMaxPending);
    exit(3);
  }
  if (eager_copies) {
    if (full) memcpy(smem, gmem, 16);
    else memset(smem, 0, 16);
    return;
  }
  pending[cur][n_pending[cur]++] = {smem, gmem, full, open_group[cur]};
}
inline void cp_async_commit() { kemu::open_group[kemu::cur]++; }
template <int N>
inline void cp_async_wait() {
  using namespace kemu;
  int kept = 0;
  for (int i = 0; i < n_pending[cur]; i++) {
    AsyncCopy& c = pending[cur][i];
    if (c.group < open_group[cur] - N) {  // committed, and not among the N newest groups
      if (c.full) memcpy(c.dst, c.src, 16);
      else memset(c.dst, 0, 16);
    } else {
      pending[cur][kept++] = c;
    }
  }
  n_pending[cur] = kept;
}

// One launch of a generated function: grid x block threads (1-D), blocks in order (or reversed).
extern "C" void kemu_launch(kemu::KernelFn fn, const char* name, unsigned grid, unsigned block,
                            void* const* args, const long long* range) {
  using namespace kemu;
  if (block == 0 || block > unsigned(kMaxThreads) || grid == 0) {
    fprintf(stderr, "kemu: %s: bad launch shape grid %u block %u\n", name, grid, block);
    exit(2);
  }
  if (!stacks) {
    stacks = (char*)mmap(nullptr, size_t(kMaxThreads) * kStack, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) { perror("kemu: mmap"); exit(2); }
  }
  launch_name = name;
  g_fn = fn, g_args = args, g_range = range;
  block_dim = {block, 1, 1};
  grid_dim = {grid, 1, 1};
  // KEMU_BLOCKS=reverse runs the blocks last first: a block that reads what a lower block of the
  // same launch writes (a race on a GPU, whose blocks run in any order) then reads it unwritten.
  static const bool reverse = [] {
    const char* v = getenv("KEMU_BLOCKS");
    return v && strcmp(v, "reverse") == 0;
  }();
  for (unsigned b = 0; b < grid; b++) {
    block_idx = {reverse ? grid - 1 - b : b, 0, 0};
    run_block(block);
    n_blocks++;
  }
  n_launches++;
}

extern "C" void kemu_stats(long long* out) {
  using namespace kemu;
  out[0] = n_launches, out[1] = n_blocks, out[2] = n_block_syncs, out[3] = n_warp_syncs;
  out[4] = n_shfl_exited_lanes, out[5] = n_divergent_syncthreads;
}
