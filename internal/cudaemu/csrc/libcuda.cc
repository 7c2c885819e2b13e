// gorun CUDA emulator (CPU): libcuda.so.1.
//
// NOT a GPU and not NVIDIA's driver: a CPU stand-in for the part of the
// CUDA driver API that gorun's backend (kernels/cuda) calls, so that the Go
// backend and kernels.cu can be tested end to end where no GPU is. See
// kernels/cuda/internal/emu/emu.go for what is and is not emulated.
//
// Device memory is host memory (with guard regions: emu_guard.h); every API call runs its work
// to completion before it returns, under one process-wide lock, so stream
// order, events and synchronisation hold trivially. Kernels are the
// host-compiled kernel files (see emu_registry.h); a launch runs its blocks
// one after another on the calling thread, the threads of a block as fibers.
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu_registry.h"
#include "emu_sched.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
struct ucontext_holder;  // the ucontext fallback's fiber context
typedef unsigned long long CUdeviceptr;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};

namespace {

struct ErrInfo {
  int code;
  const char* name;
  const char* text;
};
const ErrInfo kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrInfo* err_info(int code) {
  for (const ErrInfo& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}

// ---- diagnostics -------------------------------------------------------------
// Every failure is explained on stderr (unless GORUN_CUDA_EMU_QUIET=1) and
// kept for gorunEmuLastError: the Go side sees only the code.
std::mutex g_msg_mu;
char g_msg[2048];
bool g_quiet = getenv("GORUN_CUDA_EMU_QUIET") && strcmp(getenv("GORUN_CUDA_EMU_QUIET"), "0") != 0;

void vreport(const char* lib, const char* code, const char* fmt, va_list ap) {
  std::lock_guard<std::mutex> l(g_msg_mu);
  int n = snprintf(g_msg, sizeof g_msg, "%s: %s: ", lib, code);
  if (n < 0 || n >= (int)sizeof g_msg) n = 0;
  vsnprintf(g_msg + n, sizeof g_msg - n, fmt, ap);
  if (!g_quiet) fprintf(stderr, "gorun CUDA emulator: %s\n", g_msg);
}

__attribute__((format(printf, 2, 3))) CUresult fail(CUresult r, const char* fmt, ...) {
  const ErrInfo* e = err_info(r);
  va_list ap;
  va_start(ap, fmt);
  vreport("libcuda", e ? e->name : "?", fmt, ap);
  va_end(ap);
  return r;
}

// A thread without a current context: recorded but not printed, since
// callers that follow goroutines from thread to thread (gorun's backend)
// make the context current and retry, as CUDA expects.
CUresult no_context(const char* call) {
  std::lock_guard<std::mutex> l(g_msg_mu);
  snprintf(g_msg, sizeof g_msg, "libcuda: CUDA_ERROR_INVALID_CONTEXT: %s: no current context on this OS thread", call);
  return CUDA_ERROR_INVALID_CONTEXT;
}

// ---- global state (all under g_mu) ---------------------------------------
std::mutex g_mu;  // every API call; kernels run holding it
bool g_init;
int g_devices = 1;                      // 0 when CUDA_VISIBLE_DEVICES hides the one device
// The device's properties (every emulated device alike): compute capability
// GORUN_CUDA_EMU_CC ("7.0", or "9.0" for an H100/H200) and
// GORUN_CUDA_EMU_SMS multiprocessors (2; an H100/H200 has 132).
int g_cc_major = 7, g_cc_minor = 0, g_sms = 2;
unsigned long long g_total = 8ull << 30;  // GORUN_CUDA_EMU_MEMORY
unsigned long long g_used;              // device bytes allocated

struct Ctx {
  int refs;
};
// The primary context of each device, active while refs > 0. The devices
// share one memory, but streams and modules belong to the context they were
// made in (g_owner): a launch on another context's stream or of another
// context's function fails, as on a GPU.
Ctx g_ctxs[64];
__thread Ctx* t_cur;       // this thread's current context
std::map<const void*, Ctx*> g_owner;  // stream or module -> its context

int ctx_device(const Ctx* c) { return c ? (int)(c - g_ctxs) : -1; }
bool is_ctx(const void* c) { return c >= (const void*)g_ctxs && c < (const void*)(g_ctxs + 64); }
int total_refs() {
  int n = 0;
  for (const Ctx& c : g_ctxs) n += c.refs;
  return n;
}

struct Alloc {
  size_t size;  // as requested
  bool host;    // cuMemAllocHost (pinned host memory)
};
std::map<uintptr_t, Alloc> g_allocs;

// Streams and events. With GORUN_CUDA_EMU_SCHED=async (emu_sched.h,
// emu_streams.h) a stream holds the operations queued on it that have not
// run yet, and an event the records of it that are queued.
struct Event;
struct QOp {
  enum Kind : unsigned char { FN, RECORD, WAIT } kind;
  unsigned long long seq;  // queued as the seq-th operation
  Event* ev;               // RECORD, WAIT: the event
  unsigned long long gen;  // RECORD: this record's number; WAIT: the record waited for
  std::function<CUresult()> fn;  // FN: the work (it reports its failure itself)
};

struct Stream {
  unsigned flags;
  int index = 0;       // creation order (the NULL stream: -1)
  bool dead = false;   // destroyed while work was queued: freed when it has run
  std::deque<QOp> q;   // queued, not run yet
  unsigned long long done = 0;  // seq of the last operation run
  explicit Stream(unsigned f = 0, int i = 0) : flags(f), index(i) {}
};
std::set<Stream*> g_streams;

struct Event {
  unsigned flags;
  bool recorded;
  double ms;
  unsigned long long gen = 0;      // records made (cuEventRecord calls)
  unsigned long long ms_gen = 0;   // the record whose completion set ms
  std::set<unsigned long long> pending;  // records queued and not run yet
  int refs = 0;        // queued operations that name it
  bool dead = false;   // destroyed while named by queued work: freed when that has run
  Event(unsigned f, bool r, double m) : flags(f), recorded(r), ms(m) {}
};
std::set<Event*> g_events;

struct Function;
struct Module {
  bool has_entries;                                 // the PTX declares .entry functions
  std::map<std::string, std::vector<unsigned>> entries;  // .entry name -> parameter sizes
  std::map<std::string, int> maxntid;               // .entry name -> its .maxntid (threads; 0: none)
  int target;                                       // .target sm_XY as XY (0: none)
  std::map<std::string, Function*> fns;
};
std::set<Module*> g_modules;

struct Function {
  const gorun_emu::KernelDef* def;
  Module* mod;
};
std::set<Function*> g_functions;

std::vector<const gorun_emu::KernelDef*>& registry() {
  static std::vector<const gorun_emu::KernelDef*> r;
  return r;
}

const gorun_emu::KernelDef* find_kernel(const char* name) {
  for (const gorun_emu::KernelDef* d : registry())
    if (strcmp(d->name, name) == 0) return d;
  return nullptr;
}

struct Stats {
  unsigned long long launches, blocks, threads, switches, fibers;
} g_stats;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

unsigned long long parse_bytes(const char* s, unsigned long long def) {
  if (!s || !*s) return def;
  char* end;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    case 't': case 'T': v <<= 40; break;
  }
  return v ? v : def;
}

// The allocation holding [p, p+n) (n may be 0: p may be one past the end),
// or null.
const Alloc* find_alloc(uintptr_t p, size_t n, uintptr_t* base = nullptr) {
  auto it = g_allocs.upper_bound(p);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  uintptr_t b = it->first, e = b + it->second.size;
  if (p > e || n > e - p) return nullptr;
  if (base) *base = b;
  return &it->second;
}

// Whether [p, p+n) touches device memory (a host pointer that is really a
// device pointer: a bug that only a GPU would otherwise catch).
bool touches_device(uintptr_t p, size_t n) {
  if (n == 0) n = 1;
  auto it = g_allocs.upper_bound(p);
  if (it != g_allocs.end() && !it->second.host && it->first < p + n) return true;
  if (it == g_allocs.begin()) return false;
  --it;
  return !it->second.host && p < it->first + it->second.size;
}

bool valid_stream(void* s) {
  uintptr_t v = (uintptr_t)s;
  return v <= 2 || g_streams.count((Stream*)s);  // 0 (NULL), CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
}

#define NEED_INIT                                                               \
  do {                                                                          \
    if (!g_init) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", __func__); \
  } while (0)
#define NEED_CTX                                                                                     \
  do {                                                                                               \
    NEED_INIT;                                                                                       \
    if (!t_cur) return no_context(__func__);                                                         \
    if (t_cur->refs <= 0)                                                                            \
      return fail(CUDA_ERROR_INVALID_CONTEXT, "%s: the current context (primary) has been released", __func__); \
  } while (0)
#define NEED_STREAM(s)                                                                    \
  do {                                                                                    \
    if (!valid_stream(s)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: unknown stream %p", __func__, (void*)(s)); \
  } while (0)
#define LOCK std::lock_guard<std::mutex> lock_(g_mu)

// Device memory with guard regions (and the AddressSanitizer build).
#include "emu_guard.h"

// Frees everything the context owned (the primary context's last release).
void destroy_context_resources() {
  for (auto& a : g_allocs) a.second.host ? free((void*)a.first) : dev_free((void*)a.first);
  g_allocs.clear();
  g_used = 0;
  for (Stream* s : g_streams) delete s;
  g_streams.clear();
  for (Event* e : g_events) delete e;
  g_events.clear();
  for (Function* f : g_functions) delete f;
  g_functions.clear();
  for (Module* m : g_modules) delete m;
  g_modules.clear();
  g_owner.clear();
}

}  // namespace

// ==== thread coordinates (cuda_emu.h) =========================================
__thread uint3 threadIdx GORUN_EMU_TLS;
__thread uint3 blockIdx GORUN_EMU_TLS;
__thread uint3 blockDim GORUN_EMU_TLS;
__thread uint3 gridDim GORUN_EMU_TLS;

extern "C" void __gorun_emu_register(const gorun_emu::KernelDef* defs, int n) {
  for (int i = 0; i < n; i++) {
    const gorun_emu::KernelDef* old = find_kernel(defs[i].name);
    if (old) {
      fprintf(stderr, "gorun CUDA emulator: kernel %s defined in both %s and %s; using the first\n", defs[i].name,
              old->file, defs[i].file);
      continue;
    }
    registry().push_back(&defs[i]);
  }
}

// ==== fibers ===================================================================
//
// The threads of a block run as fibers on the launching thread. A fiber
// takes the next unstarted thread of the block and runs it to completion,
// then the next, and so on: a kernel without barriers runs all its threads
// on one fiber, one after another. A thread that reaches __syncthreads or a
// warp collective parks its fiber; the scheduler then starts the next
// thread on another fiber. The last thread to arrive releases the others.
namespace {

enum FiberState { F_RUNNING, F_IDLE, F_WAIT, F_DEAD };
enum ThreadState : unsigned char { T_NEW, T_RUN, T_BAR, T_WARP, T_EXIT };

struct Fiber {
  void* sp;  // saved stack pointer (x86-64) / context (ucontext)
  char* mem;
  size_t size;
  int tid;
  int state;
  bool busy;
  Fiber* next;
  ucontext_holder* uc;  // the ucontext fallback only
};

struct Warp {
  unsigned arrived, mask;
  int op;
  unsigned long long val[32], res[32];
  int arg[32], width[32], lop[32];
  Fiber* fib[32];
};

struct Block {
  const gorun_emu::KernelDef* def;
  const void* args;
  int n;
  unsigned bx, by;
  bool flat;  // blockDim.y == blockDim.z == 1
  int next, exited, at_bar, bar_acc, bar_count;
  Fiber *runq_h, *runq_t, *bar_h, *bar_t;
  bool failed;
  CUresult code;
  char why[1024];
  unsigned char st[1024];
  Warp warps[32];
  // GORUN_CUDA_EMU_SCHED reverse or random (emu_sched.h): the threads start
  // in order[] and are released from barriers and collectives in that
  // order (rel: the released fibers)
  bool permuted;
  gorun_emu_sched::Order order_kind;
  gorun_emu_sched::Rng rng;
  unsigned short order[1024];
  Fiber* rel[1024];
};

Block g_blk;
Fiber* g_cur;
std::vector<Fiber*> g_all, g_idle;
const size_t kStack = 256 << 10;
size_t g_page;

inline void set_thread(const Block* b, int tid) {
  if (b->flat) {
    threadIdx.x = tid;
    threadIdx.y = 0;
    threadIdx.z = 0;
  } else {
    threadIdx.x = tid % b->bx;
    unsigned r = tid / b->bx;
    threadIdx.y = r % b->by;
    threadIdx.z = r / b->by;
  }
}

}  // namespace

extern "C" __attribute__((used)) void gorun_emu_fiber_main(void);

#if defined(__x86_64__) && !defined(GORUN_EMU_UCONTEXT)
#define GORUN_EMU_ASM_SWITCH 1
// gorun_emu_swap(void **save_sp, void *new_sp): saves the callee-saved
// registers and the SSE/x87 control words on the current stack, stores the
// stack pointer in *save_sp, and resumes the stack new_sp.
asm(R"(
	.text
	.p2align 4
	.hidden gorun_emu_swap
	.globl gorun_emu_swap
	.type gorun_emu_swap, @function
gorun_emu_swap:
	.cfi_startproc
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	subq $8, %rsp
	stmxcsr (%rsp)
	fnstcw 4(%rsp)
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	ldmxcsr (%rsp)
	fldcw 4(%rsp)
	addq $8, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.cfi_endproc
	.size gorun_emu_swap, .-gorun_emu_swap

	.p2align 4
	.hidden gorun_emu_fiber_start
	.globl gorun_emu_fiber_start
	.type gorun_emu_fiber_start, @function
gorun_emu_fiber_start:
	.cfi_startproc
	.cfi_undefined rip
	andq $-16, %rsp
	call gorun_emu_fiber_main
	ud2
	.cfi_endproc
	.size gorun_emu_fiber_start, .-gorun_emu_fiber_start
)");
extern "C" void gorun_emu_swap(void** save_sp, void* new_sp);
extern "C" void gorun_emu_fiber_start(void);

namespace {
void* g_sched_sp;

void fiber_init(Fiber* f) {
  uintptr_t* sp = (uintptr_t*)(f->mem + f->size);
  unsigned mxcsr = 0;
  unsigned short fpucw = 0;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpucw));
  *--sp = 0;                                // alignment
  *--sp = (uintptr_t)gorun_emu_fiber_start;  // return address of the first swap
  for (int i = 0; i < 6; i++) *--sp = 0;    // rbp rbx r12 r13 r14 r15
  *--sp = (uintptr_t)mxcsr | (uintptr_t)fpucw << 32;  // as the current thread has them
  f->sp = sp;
}
inline void switch_to(Fiber* f) { gorun_emu_swap(&g_sched_sp, f->sp); }
inline void switch_back(Fiber* f) { gorun_emu_swap(&f->sp, g_sched_sp); }
}  // namespace

#else
// Portable fallback: ucontext (each switch also saves the signal mask with
// a system call: several times slower than the x86-64 switch).
#include <ucontext.h>
struct ucontext_holder {
  ucontext_t uc;
};
namespace {
ucontext_t g_sched_uc;
void fiber_entry() { gorun_emu_fiber_main(); }
void fiber_init(Fiber* f) {
  if (!f->uc) f->uc = new ucontext_holder;
  getcontext(&f->uc->uc);
  f->uc->uc.uc_stack.ss_sp = f->mem + g_page;
  f->uc->uc.uc_stack.ss_size = f->size - g_page;
  f->uc->uc.uc_link = nullptr;
  makecontext(&f->uc->uc, fiber_entry, 0);
}
inline void switch_to(Fiber* f) { swapcontext(&g_sched_uc, &f->uc->uc); }
inline void switch_back(Fiber* f) { swapcontext(&f->uc->uc, &g_sched_uc); }
}  // namespace
#endif

namespace {

Fiber* get_fiber() {
  Fiber* f;
  if (!g_idle.empty()) {
    f = g_idle.back();
    g_idle.pop_back();
  } else {
    if (!g_page) g_page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = kStack + g_page;
    void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    mprotect(mem, g_page, PROT_NONE);  // guard page: a stack overflow faults
    f = new Fiber();
    f->mem = (char*)mem;
    f->size = size;
    fiber_init(f);
    g_all.push_back(f);
    g_stats.fibers++;
  }
  f->busy = true;
  f->tid = -1;
  return f;
}

void put_idle(Fiber* f) {
  f->busy = false;
  g_idle.push_back(f);
}

inline void push(Fiber** h, Fiber** t, Fiber* f) {
  f->next = nullptr;
  if (*t)
    (*t)->next = f;
  else
    *h = f;
  *t = f;
}

// Parks the running fiber; the scheduler resumes it (or abandons it).
inline void park(Fiber* f, int state) {
  f->state = state;
  g_stats.switches++;
  switch_back(f);
}

// GORUN_CUDA_EMU_SCHED reverse or random: queues the k fibers in b->rel
// that a barrier or warp collective released and self (the last to
// arrive, running) by descending thread index or at random; returns true
// when another goes first and self must park.
bool release_permuted(Block* b, int k, Fiber* self) {
  b->rel[k++] = self;
  if (b->order_kind == gorun_emu_sched::REVERSE)
    std::sort(b->rel, b->rel + k, [](const Fiber* x, const Fiber* y) { return x->tid > y->tid; });
  else
    for (int i = k - 1; i > 0; i--) std::swap(b->rel[i], b->rel[b->rng.below((uint64_t)i + 1)]);
  bool later = b->rel[0] != self;
  for (int i = 0; i < k; i++)
    if (b->rel[i] != self || later) push(&b->runq_h, &b->runq_t, b->rel[i]);
  return later;
}

void coord(const Block* b, int tid, char* buf, size_t n) {
  snprintf(buf, n, "(%u,%u,%u)", tid % b->bx, tid / b->bx % b->by, tid / (b->bx * b->by));
}

// Fails the launch from inside a thread: the block stops, the fiber is
// abandoned (never resumed) and the launch returns code.
__attribute__((noreturn, format(printf, 2, 3))) void fail_thread(CUresult code, const char* fmt, ...) {
  Block* b = &g_blk;
  Fiber* f = g_cur;
  if (!b->failed) {
    b->failed = true;
    b->code = code;
    char who[64];
    coord(b, f->tid, who, sizeof who);
    int n = snprintf(b->why, sizeof b->why, "thread %s of block (%u,%u,%u): ", who, blockIdx.x, blockIdx.y,
                     blockIdx.z);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->why + n, sizeof b->why - n, fmt, ap);
    va_end(ap);
  }
  park(f, F_DEAD);
  abort();  // never resumed
}

}  // namespace

extern "C" void gorun_emu_fiber_main(void) {
  for (;;) {
    Fiber* f = g_cur;
    Block* b = &g_blk;
    while (b->next < b->n && !b->failed) {
      int tid = b->permuted ? b->order[b->next++] : b->next++;
      f->tid = tid;
      b->st[tid] = T_RUN;
      set_thread(b, tid);
      b->def->invoke(b->def->fn, b->args);
      b->st[tid] = T_EXIT;
      b->exited++;
    }
    f->tid = -1;
    park(f, F_IDLE);
  }
}

extern "C" int __gorun_emu_barrier(int op, int pred) {
  Block* b = &g_blk;
  Fiber* f = g_cur;
  if (!f || !f->busy) {
    fprintf(stderr, "gorun CUDA emulator: __syncthreads called outside a kernel launch\n");
    abort();
  }
  b->bar_acc += pred != 0;
  if (++b->at_bar == b->n) {  // the last one: release the others, go on
    b->bar_count = b->bar_acc;
    b->bar_acc = 0;
    b->at_bar = 0;
    for (Fiber* w = b->bar_h; w; w = w->next) b->st[w->tid] = T_RUN;
    bool later = false;
    if (b->permuted) {  // reverse or random: the released threads, this one too, go on in that order
      int k = 0;
      for (Fiber* w = b->bar_h; w; w = w->next) b->rel[k++] = w;
      later = release_permuted(b, k, f);
    } else if (b->bar_h) {
      if (b->runq_t)
        b->runq_t->next = b->bar_h;
      else
        b->runq_h = b->bar_h;
      b->runq_t = b->bar_t;
    }
    b->bar_h = b->bar_t = nullptr;
    if (later) park(f, F_WAIT);
  } else {
    b->st[f->tid] = T_BAR;
    push(&b->bar_h, &b->bar_t, f);
    park(f, F_WAIT);
  }
  switch (op) {
    case GORUN_EMU_BAR_COUNT: return b->bar_count;
    case GORUN_EMU_BAR_AND: return b->bar_count == b->n;
    case GORUN_EMU_BAR_OR: return b->bar_count > 0;
  }
  return 0;
}

namespace {
const char* op_name(int op) {
  static const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                "__ballot_sync", "__any_sync", "__all_sync", "__syncwarp"};
  return op >= 0 && op < 8 ? names[op] : "?";
}
int op_class(int op) { return op <= GORUN_EMU_SHFL_XOR ? 0 : op; }

// Computes every lane's result once all lanes of the collective arrived
// (PTX shfl.sync semantics, width as in CUDA's intrinsics).
void complete(Warp& w, unsigned lanes) {
  unsigned ballot = 0;
  for (int l = 0; l < 32; l++)
    if ((lanes >> l & 1) && w.val[l]) ballot |= 1u << l;
  for (int l = 0; l < 32; l++) {
    if (!(lanes >> l & 1)) continue;
    int op = w.lop[l];
    if (op > GORUN_EMU_SHFL_XOR) {
      w.res[l] = op == GORUN_EMU_BALLOT ? ballot : op == GORUN_EMU_ANY ? ballot != 0 : op == GORUN_EMU_ALL ? ballot == lanes : 0;
      continue;
    }
    unsigned c = (unsigned)(32 - w.width[l]) << 8 | (op == GORUN_EMU_SHFL_UP ? 0 : 31);
    int segmask = (c >> 8) & 31;
    int maxLane = (l & segmask) | (c & 31 & ~segmask);
    int minLane = l & segmask;
    int bv = w.arg[l] & 31;
    int j;
    bool ok;
    switch (op) {
      case GORUN_EMU_SHFL_UP: j = l - bv; ok = j >= maxLane; break;
      case GORUN_EMU_SHFL_DOWN: j = l + bv; ok = j <= maxLane; break;
      case GORUN_EMU_SHFL_XOR: j = l ^ bv; ok = j <= maxLane; break;
      default: j = minLane | (bv & ~segmask); ok = j <= maxLane; break;
    }
    if (!ok || !(lanes >> j & 1)) j = l;  // out of the segment, or an inactive lane: own value
    w.res[l] = w.val[j];
  }
}
}  // namespace

extern "C" unsigned long long __gorun_emu_warp(unsigned mask, unsigned long long v, int op, int arg, int width) {
  Block* b = &g_blk;
  Fiber* f = g_cur;
  if (!f || !f->busy) {
    fprintf(stderr, "gorun CUDA emulator: %s called outside a kernel launch\n", op_name(op));
    abort();
  }
  int tid = f->tid, wi = tid >> 5, lane = tid & 31;
  if (op <= GORUN_EMU_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1))))
    fail_thread(CUDA_ERROR_LAUNCH_FAILED, "%s with width %d (must be a power of 2 up to 32)", op_name(op), width);
  if (!(mask >> lane & 1))
    fail_thread(CUDA_ERROR_LAUNCH_FAILED, "%s with mask %#x, which does not name the calling lane %d", op_name(op),
                mask, lane);
  unsigned exist = (tid | 31) < b->n ? 0xffffffffu : (1u << (b->n & 31)) - 1;
  unsigned lanes = mask & exist;
  Warp& w = b->warps[wi];
  if (w.arrived == 0) {
    w.mask = mask;
    w.op = op;
  } else if (w.mask != mask || op_class(w.op) != op_class(op)) {
    fail_thread(CUDA_ERROR_LAUNCH_FAILED,
                "lanes of warp %d are in different warp collectives at once: %s with mask %#x here, %s with mask %#x "
                "in other lanes (divergent collectives are not emulated)",
                wi, op_name(op), mask, op_name(w.op), w.mask);
  }
  w.val[lane] = v;
  w.arg[lane] = arg;
  w.width[lane] = width;
  w.lop[lane] = op;
  w.arrived |= 1u << lane;
  if (w.arrived == lanes) {
    complete(w, lanes);
    w.arrived = 0;
    int k = 0;
    for (int l = 0; l < 32; l++) {
      if (l == lane || !(lanes >> l & 1)) continue;
      Fiber* o = w.fib[l];
      b->st[o->tid] = T_RUN;
      if (b->permuted)
        b->rel[k++] = o;
      else
        push(&b->runq_h, &b->runq_t, o);
    }
    if (b->permuted && release_permuted(b, k, f)) park(f, F_WAIT);
  } else {
    w.fib[lane] = f;
    b->st[tid] = T_WARP;
    park(f, F_WAIT);
  }
  return w.res[lane];
}

extern "C" void __gorun_emu_trap(void) {
  if (!g_cur || !g_cur->busy) abort();
  fail_thread(CUDA_ERROR_LAUNCH_FAILED, "__trap()");
}

// A kernel's access of n bytes at p, which is not n-byte aligned: a GPU
// faults on it (x86 would not), GR_CHECK_ALIGNED in cuda_emu.h.
extern "C" void __gorun_emu_misaligned(const void* p, int n) {
  if (!g_cur || !g_cur->busy) abort();
  fail_thread(CUDA_ERROR_MISALIGNED_ADDRESS, "a %d-byte access at %p, which is not %d-byte aligned", n, p, n);
}

namespace {

// Describes the threads that can never go on (the block deadlocked).
void deadlock(Block* b) {
  int counts[5] = {0};
  int first[5] = {-1, -1, -1, -1, -1};
  for (int t = 0; t < b->n; t++) {
    counts[b->st[t]]++;
    if (first[b->st[t]] < 0) first[b->st[t]] = t;
  }
  char bar[64] = "", warp[64] = "", ex[64] = "";
  if (first[T_BAR] >= 0) coord(b, first[T_BAR], bar, sizeof bar);
  if (first[T_WARP] >= 0) coord(b, first[T_WARP], warp, sizeof warp);
  if (first[T_EXIT] >= 0) coord(b, first[T_EXIT], ex, sizeof ex);
  b->failed = true;
  b->code = CUDA_ERROR_LAUNCH_FAILED;
  snprintf(b->why, sizeof b->why,
           "block (%u,%u,%u) deadlocked: %d of its %d threads wait at __syncthreads (first %s), %d in a warp "
           "collective (first %s), %d have exited (first %s); every thread of a block must reach every "
           "__syncthreads, and every lane named in a warp collective's mask must reach it",
           blockIdx.x, blockIdx.y, blockIdx.z, counts[T_BAR], b->n, bar, counts[T_WARP], warp, counts[T_EXIT], ex);
}

void run_block(Block* b) {
  b->next = b->exited = b->at_bar = b->bar_acc = 0;
  b->runq_h = b->runq_t = b->bar_h = b->bar_t = nullptr;
  memset(b->st, T_NEW, b->n);
  if (b->permuted) gorun_emu_sched::thread_order(b->order, b->n, b->order_kind, &b->rng);
  g_stats.blocks++;
  for (;;) {
    Fiber* f = b->runq_h;
    if (f) {
      b->runq_h = f->next;
      if (!b->runq_h) b->runq_t = nullptr;
      set_thread(b, f->tid);
    } else if (b->next < b->n) {
      f = get_fiber();
      if (!f) {
        b->failed = true;
        b->code = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
        snprintf(b->why, sizeof b->why, "cannot map a fiber stack for thread %d", b->next);
        break;
      }
    } else {
      break;
    }
    g_cur = f;
    f->state = F_RUNNING;
    g_stats.switches++;
    switch_to(f);
    if (f->state == F_IDLE) put_idle(f);
    if (b->failed) break;
  }
  g_cur = nullptr;
  if (!b->failed && b->exited != b->n) deadlock(b);
  if (b->failed) {  // abandon the parked fibers: fresh stacks next time
    for (Fiber* f : g_all) {
      if (f->busy) {
        fiber_init(f);
        put_idle(f);
      }
    }
    for (Warp& w : b->warps) w.arrived = 0;
  }
}

// Parses the .entry functions of a PTX module and their parameter sizes.
void parse_ptx(const char* s, Module* m) {
  const char* p = s;
  while ((p = strstr(p, ".entry")) != nullptr) {
    p += 6;
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') continue;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    const char* n0 = p;
    while (*p == '_' || *p == '$' || (*p >= '0' && *p <= '9') || ((*p | 32) >= 'a' && (*p | 32) <= 'z')) p++;
    std::string name(n0, p - n0);
    while (*p && *p != '(' && *p != '{') p++;
    std::vector<unsigned> sizes;
    if (*p == '(') {
      const char* e = strchr(p, ')');
      if (!e) break;
      std::string params(p + 1, e - p - 1);
      size_t pos = 0;
      while ((pos = params.find(".param", pos)) != std::string::npos) {
        size_t end = params.find(',', pos);
        if (end == std::string::npos) end = params.size();
        std::string decl = params.substr(pos, end - pos);
        pos = end;
        unsigned size = 0, count = 1;
        for (const char* t : {".u8", ".s8", ".b8", ".u16", ".s16", ".b16", ".f16", ".u32", ".s32", ".b32", ".f32",
                              ".u64", ".s64", ".b64", ".f64"}) {
          size_t q = decl.find(t);
          size_t tl = strlen(t);
          if (q != std::string::npos && (q + tl == decl.size() || decl[q + tl] == ' ' || decl[q + tl] == '\t' ||
                                         decl[q + tl] == '\n')) {
            size = atoi(t + 2) / 8;
            break;
          }
        }
        size_t br = decl.find('[');
        if (br != std::string::npos) count = (unsigned)atoi(decl.c_str() + br + 1);
        sizes.push_back(size * count);
      }
      p = e;
    }
    // performance directives between the parameters and the body:
    // .maxntid x, y, z (__launch_bounds__)
    int maxntid = 0;
    if (const char* body = strchr(p, '{')) {
      std::string dirs(p, body - p);
      size_t q = dirs.find(".maxntid");
      if (q != std::string::npos) {
        unsigned x = 1, y = 1, z = 1;
        int got = sscanf(dirs.c_str() + q + 8, " %u , %u , %u", &x, &y, &z);
        if (got >= 1) maxntid = (int)(x * (got >= 2 ? y : 1) * (got >= 3 ? z : 1));
      }
    }
    m->entries[name] = sizes;
    m->maxntid[name] = maxntid;
    m->has_entries = true;
  }
}

// The XY of a PTX module's ".target sm_XY" (0 when it has none).
int ptx_target(const char* s) {
  const char* p = strstr(s, ".target");
  if (!p) return 0;
  p += 7;
  while (*p == ' ' || *p == '\t') p++;
  int v = 0;
  return sscanf(p, "sm_%d", &v) == 1 ? v : 0;
}

}  // namespace

// Launches and stream operations run now or queued (GORUN_CUDA_EMU_SCHED).
#include "emu_streams.h"

// ==== the driver API ===========================================================

API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  const ErrInfo* e = err_info(error);
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  const ErrInfo* e = err_info(error);
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuInit(unsigned int flags) {
  LOCK;
  if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit: flags %#x (must be 0)", flags);
  if (g_init) return CUDA_SUCCESS;
  // The machine has GORUN_CUDA_EMU_DEVICES emulated devices (default 1);
  // CUDA_VISIBLE_DEVICES picks among them as the driver reads it: the list
  // ends at the first entry that names no device (or one named before).
  // All visible devices share the one emulated context and memory.
  int physical = 1;
  if (const char* v = getenv("GORUN_CUDA_EMU_DEVICES")) physical = std::max(1, std::min(64, atoi(v)));
  g_devices = physical;
  if (const char* v = getenv("CUDA_VISIBLE_DEVICES")) {
    g_devices = 0;
    bool seen[64] = {false};
    for (const char* p = v;;) {
      while (*p == ' ') p++;
      char* end;
      long i = strtol(p, &end, 10);
      while (*end == ' ') end++;
      if (end == p || (*end != ',' && *end != 0) || i < 0 || i >= physical || seen[i]) break;
      seen[i] = true;
      g_devices++;
      if (*end == 0) break;
      p = end + 1;
    }
  }
  if (!g_devices)
    return fail(CUDA_ERROR_NO_DEVICE, "cuInit: CUDA_VISIBLE_DEVICES=%s leaves none of the %d emulated device(s) "
                "(GORUN_CUDA_EMU_DEVICES sets how many there are)",
                getenv("CUDA_VISIBLE_DEVICES"), physical);
  g_total = parse_bytes(getenv("GORUN_CUDA_EMU_MEMORY"), 8ull << 30);
  if (const char* v = getenv("GORUN_CUDA_EMU_CC"); v && *v) {
    int ma = 0, mi = 0;
    char extra = 0;
    if (sscanf(v, "%d.%d%c", &ma, &mi, &extra) != 2 || ma < 5 || ma > 12 || mi < 0 || mi > 9)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuInit: GORUN_CUDA_EMU_CC=%s: want a compute capability such as 7.0 or 9.0", v);
    g_cc_major = ma;
    g_cc_minor = mi;
  }
  if (const char* v = getenv("GORUN_CUDA_EMU_SMS"); v && *v) {
    char* end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 1024)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuInit: GORUN_CUDA_EMU_SMS=%s: want a number of multiprocessors, 1 to 1024", v);
    g_sms = (int)n;
  }
  if (CUresult r = set_sched(getenv("GORUN_CUDA_EMU_SCHED"), "cuInit")) return r;  // emu_sched.h
  g_init = true;
  return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int* v) {
  if (!v) return fail(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion: null pointer");
  *v = 12020;
  return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int* n) {
  LOCK;
  NEED_INIT;
  if (!n) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount: null pointer");
  *n = g_devices;
  return CUDA_SUCCESS;
}

#define NEED_DEV(d)                                                                                   \
  do {                                                                                                \
    if ((d) < 0 || (d) >= g_devices) return fail(CUDA_ERROR_INVALID_DEVICE, "%s: device %d", __func__, (int)(d)); \
  } while (0)

API CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  LOCK;
  NEED_INIT;
  if (!dev) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet: null pointer");
  NEED_DEV(ordinal);
  *dev = ordinal;
  return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  LOCK;
  NEED_INIT;
  if (!name || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName: null buffer or length %d", len);
  NEED_DEV(dev);
  snprintf(name, (size_t)len, "%s", "gorun CUDA emulator (CPU)");
  return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int* pi, int attrib, CUdevice dev) {
  LOCK;
  NEED_INIT;
  if (!pi) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: null pointer");
  NEED_DEV(dev);
  if (attrib <= 0 || attrib > 200) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: attribute %d", attrib);
  int v = 0;
  switch (attrib) {
    case 1: v = 1024; break;        // MAX_THREADS_PER_BLOCK
    case 2: v = 1024; break;        // MAX_BLOCK_DIM_X
    case 3: v = 1024; break;        // MAX_BLOCK_DIM_Y
    case 4: v = 64; break;          // MAX_BLOCK_DIM_Z
    case 5: v = 2147483647; break;  // MAX_GRID_DIM_X
    case 6: v = 65535; break;       // MAX_GRID_DIM_Y
    case 7: v = 65535; break;       // MAX_GRID_DIM_Z
    case 8: v = 49152; break;       // MAX_SHARED_MEMORY_PER_BLOCK
    case 9: v = 65536; break;       // TOTAL_CONSTANT_MEMORY
    case 10: v = 32; break;         // WARP_SIZE
    case 11: v = 2147483647; break; // MAX_PITCH
    case 12: v = 65536; break;      // MAX_REGISTERS_PER_BLOCK
    case 13: v = 1000000; break;    // CLOCK_RATE (kHz)
    case 14: v = 512; break;        // TEXTURE_ALIGNMENT
    case 16: v = g_sms; break;      // MULTIPROCESSOR_COUNT (GORUN_CUDA_EMU_SMS)
    case 19: v = 1; break;          // CAN_MAP_HOST_MEMORY
    case 30: v = 512; break;        // SURFACE_ALIGNMENT
    case 39: v = 2048; break;       // MAX_THREADS_PER_MULTIPROCESSOR
    case 41: v = 1; break;          // UNIFIED_ADDRESSING
    case 75: v = g_cc_major; break; // COMPUTE_CAPABILITY_MAJOR (GORUN_CUDA_EMU_CC)
    case 76: v = g_cc_minor; break; // COMPUTE_CAPABILITY_MINOR
    case 81: v = 98304; break;      // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82: v = 65536; break;      // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 97: v = 49152; break;      // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    default: v = 0;                 // everything else (overlap, concurrency, ECC, ...): not emulated
  }
  *pi = v;
  return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  LOCK;
  NEED_INIT;
  if (!bytes) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem: null pointer");
  NEED_DEV(dev);
  *bytes = g_total;
  return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(void** pctx, CUdevice dev) {
  LOCK;
  NEED_INIT;
  if (!pctx) return fail(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain: null pointer");
  NEED_DEV(dev);
  g_ctxs[dev].refs++;
  *pctx = &g_ctxs[dev];
  return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  LOCK;
  NEED_INIT;
  NEED_DEV(dev);
  Ctx& c = g_ctxs[dev];
  if (c.refs <= 0) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease: not retained");
  if (total_refs() == 1) {  // the last release: queued work runs first, as the driver's
    drain();
    reset_streams();
  }
  // as the driver: the context's memory goes with it (here: with the last
  // context of all devices, which share one memory)
  if (--c.refs == 0 && total_refs() == 0) destroy_context_resources();
  return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(void* ctx) {
  LOCK;
  NEED_INIT;
  if (ctx && !is_ctx(ctx)) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent: unknown context %p", ctx);
  t_cur = (Ctx*)ctx;
  return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(void** pctx) {
  LOCK;
  NEED_INIT;
  if (!pctx) return fail(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent: null pointer");
  *pctx = t_cur;
  return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void) {
  LOCK;
  NEED_CTX;
  NEED_HEALTHY;
  return drain();  // synchronous streams: all work is done when its call returns
}

// ---- streams and events --------------------------------------------------------

API CUresult cuStreamCreate(void** ps, unsigned int flags) {
  LOCK;
  NEED_CTX;
  if (!ps) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: null pointer");
  if (flags & ~1u) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: flags %#x", flags);
  Stream* s = new Stream(flags, ++g_created);
  g_streams.insert(s);
  g_owner[s] = t_cur;
  g_live.push_back(s);
  *ps = s;
  return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(void* s) {
  LOCK;
  NEED_INIT;
  if (!g_streams.erase((Stream*)s)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy: unknown stream %p", s);
  g_owner.erase(s);
  ((Stream*)s)->dead = true;  // as the driver: its queued work still runs
  reap();
  return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(void* s) {
  LOCK;
  NEED_INIT;
  NEED_STREAM(s);
  NEED_HEALTHY;
  if (!g_sched.async) return CUDA_SUCCESS;
  Stream* st = stream_of(s);
  return run_until([st] { return st->q.empty(); });
}

#define NEED_EVENT(e)                                                                  \
  do {                                                                                 \
    if (!g_events.count((Event*)(e))) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: unknown event %p", __func__, (void*)(e)); \
  } while (0)

API CUresult cuStreamWaitEvent(void* s, void* ev, unsigned int flags) {
  LOCK;
  NEED_INIT;
  NEED_STREAM(s);
  NEED_EVENT(ev);
  if (flags & ~1u) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent: flags %#x", flags);
  NEED_HEALTHY;
  Event* e = (Event*)ev;
  if (!g_sched.async || event_done(e)) return CUDA_SUCCESS;  // never recorded, or its record has run
  QOp o{};
  o.kind = QOp::WAIT;
  o.ev = e;
  o.gen = e->gen;  // the record made before this call, as in CUDA
  e->refs++;
  return submit(stream_of(s), std::move(o));
}

API CUresult cuEventCreate(void** pe, unsigned int flags) {
  LOCK;
  NEED_CTX;
  if (!pe) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: null pointer");
  if ((flags & ~7u) || ((flags & 4) && !(flags & 2)))
    return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: flags %#x", flags);
  // GORUN_CUDA_EMU_NO_BLOCKING_SYNC=1: blocking-sync events refused, as some
  // sandboxes' drivers do
  static const bool no_blocking = getenv("GORUN_CUDA_EMU_NO_BLOCKING_SYNC") &&
                                  strcmp(getenv("GORUN_CUDA_EMU_NO_BLOCKING_SYNC"), "0") != 0;
  if (no_blocking && (flags & 1))
    return fail(CUDA_ERROR_NOT_SUPPORTED, "cuEventCreate: blocking-sync events are refused here "
                "(GORUN_CUDA_EMU_NO_BLOCKING_SYNC)");
  Event* e = new Event(flags, false, 0);
  g_events.insert(e);
  *pe = e;
  return CUDA_SUCCESS;
}

API CUresult cuEventRecord(void* ev, void* s) {
  LOCK;
  NEED_INIT;
  NEED_EVENT(ev);
  NEED_STREAM(s);
  NEED_HEALTHY;
  Event* e = (Event*)ev;
  e->recorded = true;
  if (!g_sched.async) {
    e->ms = now_ms();
    return CUDA_SUCCESS;
  }
  QOp o{};  // async: the event completes when the work queued on s before it has run
  o.kind = QOp::RECORD;
  o.ev = e;
  o.gen = ++e->gen;
  e->pending.insert(o.gen);
  e->refs++;
  return submit(stream_of(s), std::move(o));
}

API CUresult cuEventSynchronize(void* ev) {
  LOCK;
  NEED_INIT;
  NEED_EVENT(ev);
  NEED_HEALTHY;
  Event* e = (Event*)ev;
  return run_until([e] { return event_done(e); });
}

API CUresult cuEventQuery(void* ev) {
  LOCK;
  NEED_INIT;
  NEED_EVENT(ev);
  NEED_HEALTHY;
  Event* e = (Event*)ev;
  if (event_done(e)) return CUDA_SUCCESS;  // synchronous streams: always
  // async: not yet. A GPU goes on by itself: one queued operation runs
  // here, so that a caller polling the event sees it complete in the end.
  if (Stream* s = pick()) run_op(s);
  reap();
  if (g_sticky) return g_sticky;
  return CUDA_ERROR_NOT_READY;
}

API CUresult cuEventDestroy_v2(void* ev) {
  LOCK;
  NEED_INIT;
  NEED_EVENT(ev);
  g_events.erase((Event*)ev);
  if (((Event*)ev)->refs > 0)
    ((Event*)ev)->dead = true;  // named by queued work: freed when that has run, as by the driver
  else
    delete (Event*)ev;
  return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
  LOCK;
  NEED_INIT;
  if (!ms) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventElapsedTime: null pointer");
  NEED_EVENT(start);
  NEED_EVENT(end);
  Event *a = (Event*)start, *b = (Event*)end;
  if ((a->flags | b->flags) & 2)
    return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime: an event was created with CU_EVENT_DISABLE_TIMING");
  if (!a->recorded || !b->recorded)
    return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime: an event has not been recorded");
  if (!event_done(a) || !event_done(b))
    return fail(CUDA_ERROR_NOT_READY, "cuEventElapsedTime: an event's latest record has not run yet");
  *ms = (float)(b->ms - a->ms);
  return CUDA_SUCCESS;
}

// ---- memory ---------------------------------------------------------------------

API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  LOCK;
  NEED_CTX;
  if (!dptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: null pointer");
  if (bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: 0 bytes");
  size_t rounded = (bytes + 255) & ~(size_t)255;
  if (rounded < bytes || rounded > g_total - g_used)
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc: %zu bytes requested, %llu of %llu in use", bytes, g_used,
                g_total);
  // Fresh device memory is not zero: all ones (a NaN as float, -1 as int)
  // makes a read of memory nobody wrote show. Guard regions around it
  // (emu_guard.h).
  void* p = dev_alloc(bytes);
  if (!p) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc: host allocation of %zu bytes failed", rounded);
  g_allocs[(uintptr_t)p] = Alloc{bytes, false};
  g_used += rounded;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  LOCK;
  NEED_CTX;
  if (CUresult r = drain()) return r;  // async: queued work first (the driver synchronises here)
  if (dptr == 0) return CUDA_SUCCESS;
  auto it = g_allocs.find((uintptr_t)dptr);
  if (it == g_allocs.end() || it->second.host) {
    uintptr_t base;
    const Alloc* a = find_alloc((uintptr_t)dptr, 0, &base);
    if (a && !a->host)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree(%#llx): inside the allocation at %#llx, not its start", dptr,
                  (unsigned long long)base);
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree(%#llx): not a live device allocation (freed twice? never allocated?)",
                dptr);
  }
  g_used -= (it->second.size + 255) & ~(size_t)255;
  g_allocs.erase(it);
  dev_free((void*)(uintptr_t)dptr);
  return CUDA_SUCCESS;
}

API CUresult cuMemAllocHost_v2(void** pp, size_t bytes) {
  LOCK;
  NEED_CTX;
  if (!pp) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAllocHost: null pointer");
  if (bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAllocHost: 0 bytes");
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  void* p = aligned_alloc(4096, rounded);
  if (!p) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocHost: %zu bytes", bytes);
  memset(p, 0xff, rounded);
  g_allocs[(uintptr_t)p] = Alloc{bytes, true};
  *pp = p;
  return CUDA_SUCCESS;
}

API CUresult cuMemFreeHost(void* p) {
  LOCK;
  NEED_CTX;
  if (CUresult r = drain()) return r;  // async: queued work first
  auto it = g_allocs.find((uintptr_t)p);
  if (!p || it == g_allocs.end() || !it->second.host)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost(%p): not a live cuMemAllocHost allocation", p);
  g_allocs.erase(it);
  free(p);
  return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo_v2(size_t* freeb, size_t* total) {
  LOCK;
  NEED_CTX;
  if (!freeb || !total) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo: null pointer");
  *total = g_total;
  *freeb = g_total - g_used;
  return CUDA_SUCCESS;
}

namespace {
CUresult check_dev(const char* call, const char* what, CUdeviceptr p, size_t n) {
  const Alloc* a = find_alloc((uintptr_t)p, n);
  if (!a || a->host)
    return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s [%#llx, +%zu) is not inside a live device allocation", call, what, p,
                n);
  return CUDA_SUCCESS;
}
CUresult check_host(const char* call, const char* what, const void* p, size_t n) {
  if (!p) return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s is null", call, what);
  if (touches_device((uintptr_t)p, n))
    return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s [%p, +%zu) is device memory, not host memory", call, what, p, n);
  return CUDA_SUCCESS;
}

CUresult htod(const char* call, CUdeviceptr dst, const void* src, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_dev(call, "destination", dst, n)) return r;
  if (CUresult r = check_host(call, "source", src, n)) return r;
  memcpy((void*)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
CUresult dtoh(const char* call, void* dst, CUdeviceptr src, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_dev(call, "source", src, n)) return r;
  if (CUresult r = check_host(call, "destination", dst, n)) return r;
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
}  // namespace

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
  LOCK;
  NEED_CTX;
  NEED_STREAM(s);
  NEED_HEALTHY;
  if (g_sched.async) return q_htod("cuMemcpyHtoDAsync", dst, src, n, s);  // emu_streams.h
  return htod("cuMemcpyHtoDAsync", dst, src, n);
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
  LOCK;
  NEED_CTX;
  NEED_STREAM(s);
  NEED_HEALTHY;
  if (g_sched.async) return q_dtoh("cuMemcpyDtoHAsync", dst, src, n, s);
  return dtoh("cuMemcpyDtoHAsync", dst, src, n);
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  LOCK;
  NEED_CTX;
  if (CUresult r = drain()) return r;  // async: synchronous copies come after the queued work
  return htod("cuMemcpyHtoD", dst, src, n);
}

API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  LOCK;
  NEED_CTX;
  if (CUresult r = drain()) return r;
  return dtoh("cuMemcpyDtoH", dst, src, n);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
  LOCK;
  NEED_CTX;
  NEED_STREAM(s);
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_dev("cuMemcpyDtoDAsync", "destination", dst, n)) return r;
  if (CUresult r = check_dev("cuMemcpyDtoDAsync", "source", src, n)) return r;
  NEED_HEALTHY;
  if (g_sched.async) return q_dtod(dst, src, n, s);
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, void* s) {
  LOCK;
  NEED_CTX;
  NEED_STREAM(s);
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_dev("cuMemsetD8Async", "destination", dst, n)) return r;
  NEED_HEALTHY;
  if (g_sched.async) return q_memset8(dst, uc, n, s);
  memset((void*)(uintptr_t)dst, uc, n);
  return CUDA_SUCCESS;
}

API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, void* s) {
  LOCK;
  NEED_CTX;
  NEED_STREAM(s);
  if (dst & 3) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async: destination %#llx not 4-byte aligned", dst);
  if (n == 0) return CUDA_SUCCESS;
  if (n > ((size_t)-1) / 4) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async: %zu elements", n);
  if (CUresult r = check_dev("cuMemsetD32Async", "destination", dst, 4 * n)) return r;
  NEED_HEALTHY;
  if (g_sched.async) return q_memset32(dst, ui, n, s);
  unsigned* p = (unsigned*)(uintptr_t)dst;
  for (size_t i = 0; i < n; i++) p[i] = ui;
  return CUDA_SUCCESS;
}

// ---- modules and kernels ----------------------------------------------------------

API CUresult cuModuleLoadData(void** pmod, const void* image) {
  LOCK;
  NEED_CTX;
  if (!pmod || !image) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: null pointer");
  const char* s = (const char*)image;
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
  if (!(s[0] == '/' && s[1] == '/') && strncmp(s, ".version", 8) != 0 && strncmp(s, ".target", 7) != 0)
    return fail(CUDA_ERROR_INVALID_IMAGE,
                "cuModuleLoadData: the image is not PTX text (it must start with a // comment or .version); the "
                "emulator loads PTX only");
  // As the driver: PTX for a newer architecture than the device's does not
  // load (the backend must pick the PTX its device can run).
  int target = ptx_target(s);
  if (target > g_cc_major * 10 + g_cc_minor)
    return fail(CUDA_ERROR_NO_BINARY_FOR_GPU,
                "cuModuleLoadData: the PTX targets sm_%d; the device has compute capability %d.%d "
                "(GORUN_CUDA_EMU_CC)",
                target, g_cc_major, g_cc_minor);
  Module* m = new Module();
  g_owner[m] = t_cur;
  m->target = target;
  parse_ptx(s, m);
  g_modules.insert(m);
  *pmod = m;
  return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(void* mod) {
  LOCK;
  NEED_CTX;
  Module* m = (Module*)mod;
  if (!g_modules.erase(m)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload: unknown module %p", mod);
  g_owner.erase(m);
  for (auto& f : m->fns) {
    g_functions.erase(f.second);
    delete f.second;
  }
  delete m;
  return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(void** pfn, void* mod, const char* name) {
  LOCK;
  NEED_INIT;
  if (!pfn || !name) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: null pointer");
  Module* m = (Module*)mod;
  if (!g_modules.count(m)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction: unknown module %p", mod);
  auto have = m->fns.find(name);
  if (have != m->fns.end()) {
    *pfn = have->second;
    return CUDA_SUCCESS;
  }
  const gorun_emu::KernelDef* d = find_kernel(name);
  auto entry = m->entries.find(name);
  if (m->has_entries && entry == m->entries.end())
    return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction: the PTX has no .entry %s", name);
  if (!d)
    return fail(CUDA_ERROR_NOT_FOUND,
                "cuModuleGetFunction: %s is not among the %zu host-compiled kernels (not extern \"C\" __global__ in "
                "a file given to emu.Build?)",
                name, registry().size());
  if (m->has_entries) {  // the PTX and the host-compiled kernel must agree
    const std::vector<unsigned>& ps = entry->second;
    bool same = (int)ps.size() == d->nparams;
    for (int i = 0; same && i < d->nparams; i++) same = ps[i] == d->params[i].size;
    if (!same) {
      std::string a, b;
      for (unsigned v : ps) a += (a.empty() ? "" : ",") + std::to_string(v);
      for (int i = 0; i < d->nparams; i++) b += (i ? "," : "") + std::to_string(d->params[i].size);
      return fail(CUDA_ERROR_INVALID_IMAGE,
                  "cuModuleGetFunction: %s takes parameters of %s bytes in the PTX but %s bytes in %s: the PTX is "
                  "stale (regenerate it)",
                  name, a.c_str(), b.c_str(), d->file);
    }
    // and the same __launch_bounds__ (the PTX's .maxntid), which the driver
    // enforces at each launch as the emulator does with the host kernel's
    int ptxmax = m->maxntid[name];
    if (ptxmax != d->max_threads)
      return fail(CUDA_ERROR_INVALID_IMAGE,
                  "cuModuleGetFunction: %s has .maxntid %d in the PTX but __launch_bounds__(%d) in %s (0: none): "
                  "the PTX is stale (regenerate it)",
                  name, ptxmax, d->max_threads, d->file);
  }
  Function* f = new Function{d, m};
  m->fns[name] = f;
  g_functions.insert(f);
  *pfn = f;
  return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, void* s, void** params, void** extra) {
  LOCK;
  NEED_CTX;
  Function* f = (Function*)fn;
  if (!f || !g_functions.count(f)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: unknown function %p", fn);
  const gorun_emu::KernelDef* d = f->def;
  NEED_STREAM(s);
  // the function and the stream must be of the current context (a thread
  // that another context was made current on, e.g. device 0's by the CUDA
  // runtime inside cuBLAS, would launch elsewhere on a GPU)
  if (g_owner.count(f->mod) && g_owner[f->mod] != t_cur)
    return fail(CUDA_ERROR_INVALID_HANDLE,
                "cuLaunchKernel %s: its module was loaded in device %d's context, but device %d's is current on this "
                "thread",
                d->name, ctx_device(g_owner[f->mod]), ctx_device(t_cur));
  if (g_owner.count(s) && g_owner[s] != t_cur)
    return fail(CUDA_ERROR_INVALID_HANDLE,
                "cuLaunchKernel %s: stream %p belongs to device %d's context, but device %d's is current on this thread",
                d->name, s, ctx_device(g_owner[s]), ctx_device(t_cur));
  if (gx < 1 || gy < 1 || gz < 1 || gx > 2147483647u || gy > 65535 || gz > 65535)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel %s: grid (%u,%u,%u)", d->name, gx, gy, gz);
  if (bx < 1 || by < 1 || bz < 1 || bx > 1024 || by > 1024 || bz > 64 || (unsigned long long)bx * by * bz > 1024)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel %s: block (%u,%u,%u)", d->name, bx, by, bz);
  int n = (int)(bx * by * bz);
  if (d->max_threads > 0 && n > d->max_threads)
    return fail(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "cuLaunchKernel %s: %d threads per block, __launch_bounds__(%d)",
                d->name, n, d->max_threads);
  if (shmem > 49152)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel %s: %u bytes of dynamic shared memory", d->name, shmem);
  if (extra && extra[0] != nullptr)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel %s: parameters through extra are not emulated", d->name);
  if (d->nparams > 0 && !params) return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel %s: no kernelParams", d->name);
  for (int i = 0; i < d->nparams; i++)
    if (!params[i]) return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel %s: kernelParams[%d] is null", d->name, i);
  // A pointer parameter must be null or point into live device (or pinned
  // host) memory: a GPU would fault on a freed or host pointer.
  for (int i = 0; i < d->nparams; i++) {
    if (!d->params[i].pointer) continue;
    uintptr_t p;
    memcpy(&p, params[i], sizeof p);
    if (p && !find_alloc(p, 0))
      return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                  "cuLaunchKernel %s: pointer parameter %d (%#lx) is not in live device memory (freed? a host "
                  "pointer?)",
                  d->name, i, (unsigned long)p);
  }
  NEED_HEALTHY;
  // The blocks in GORUN_CUDA_EMU_SCHED's order, now or queued, then the
  // guard regions checked (emu_guard.h): emu_streams.h.
  return launch_grid(d, params, gx, gy, gz, bx, by, bz, s);
}

// ==== emulator-only entry points (tests, and the emulated cuBLAS and NVML) ====

// The last failure explained, in buf; returns its length.
API int gorunEmuLastError(char* buf, int len) {
  std::lock_guard<std::mutex> l(g_msg_mu);
  int n = (int)strlen(g_msg);
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s", g_msg);
  return n;
}

// Reports a failure of another emulated library (cuBLAS, NVML) the same way.
API void gorunEmuReport(const char* lib, const char* code, const char* msg) {
  std::lock_guard<std::mutex> l(g_msg_mu);
  snprintf(g_msg, sizeof g_msg, "%s: %s: %s", lib, code, msg);
  if (!g_quiet) fprintf(stderr, "gorun CUDA emulator: %s\n", g_msg);
}

API void gorunEmuSetQuiet(int q) { g_quiet = q != 0; }

// Sets GORUN_CUDA_EMU_SCHED's schedule (emu_sched.h) for the calls from now
// on, after running what is queued; 0, or CUDA_ERROR_INVALID_VALUE for a
// value it does not take.
API int gorunEmuSetSched(const char* v) {
  LOCK;
  return set_sched(v, "gorunEmuSetSched");
}

// The stream operations queued and not run yet (async).
API unsigned long long gorunEmuQueued(void) {
  LOCK;
  unsigned long long n = 0;
  for (Stream* s : g_live) n += s->q.size();
  return n;
}

// With the lock held (the emulated cuBLAS): runs fn(arg) now, or queues it
// on stream s (async); drop(arg) when it has run or will not. 0, or the
// CUresult of an unknown stream or of queued work that failed before.
API int gorunEmuSubmit(void* s, void (*fn)(void*), void* arg, void (*drop)(void*)) {
  std::shared_ptr<void> keep(arg, drop);
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (g_sticky) return g_sticky;
  return submit_fn(stream_of(s), [keep, fn] {
    fn(keep.get());
    return CUDA_SUCCESS;
  });
}

// The process-wide lock every emulated call holds (cuBLAS takes it too).
API void gorunEmuLock(void) { g_mu.lock(); }
API void gorunEmuUnlock(void) { g_mu.unlock(); }

// With the lock held: 1 when [p, p+n) is inside one live device allocation.
API int gorunEmuDeviceRange(unsigned long long p, unsigned long long n) {
  const Alloc* a = find_alloc((uintptr_t)p, (size_t)n);
  return a && !a->host;
}

// With the lock held: 1 for a stream handle cuStreamCreate returned (or 0, 1, 2).
API int gorunEmuStreamValid(void* s) { return valid_stream(s); }

API void gorunEmuMemInfo(unsigned long long* total, unsigned long long* used) {
  LOCK;
  if (total) *total = g_init ? g_total : parse_bytes(getenv("GORUN_CUDA_EMU_MEMORY"), 8ull << 30);
  if (used) *used = g_used;
}

// launches, blocks, threads, fiber switches, fibers (stacks) created.
API void gorunEmuStats(unsigned long long out[5]) {
  LOCK;
  out[0] = g_stats.launches;
  out[1] = g_stats.blocks;
  out[2] = g_stats.threads;
  out[3] = g_stats.switches;
  out[4] = g_stats.fibers;
}

API int gorunEmuKernelCount(void) { return (int)registry().size(); }

// The calling thread's current context as the CUDA runtime (and so cuBLAS)
// sees it: a thread without one gets device 0's primary context made
// current (retained if it was not), as cudart does for its default device.
API void* gorunEmuRuntimeContext(void) {
  LOCK;
  if (!g_init || g_devices < 1) return nullptr;
  if (!t_cur) {
    if (g_ctxs[0].refs == 0) g_ctxs[0].refs++;
    t_cur = &g_ctxs[0];
  }
  return t_cur;
}

// The device of a context (-1: none).
API int gorunEmuContextDevice(void* ctx) { return is_ctx(ctx) ? ctx_device((Ctx*)ctx) : -1; }

// The XY of the .target sm_XY of a loaded module's PTX (0: none; -1: not a
// module): which PTX the backend chose for the device.
API int gorunEmuModuleTarget(void* mod) {
  LOCK;
  return g_modules.count((Module*)mod) ? ((Module*)mod)->target : -1;
}
API const char* gorunEmuKernelName(int i) {
  return i >= 0 && i < (int)registry().size() ? registry()[i]->name : nullptr;
}
