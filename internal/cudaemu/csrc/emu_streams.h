// gorun CUDA emulator (CPU): launches and stream operations in the order
// GORUN_CUDA_EMU_SCHED asks for (emu_sched.h). Included once, by
// libcuda.cc, after the fibers (run_block) and before the driver API.
//
// Synchronous (the default): every operation runs in the call that queues
// it, as the emulator always did; only the order of blocks and threads
// changes with reverse and random.
//
// async: every operation on a stream (a launch, a copy or memset, a GEMM,
// an event record or wait) is queued on the stream and runs later, on the
// thread of a call that has to wait for it:
//
//   cuStreamSynchronize     runs work until the stream's queue is empty;
//   cuEventSynchronize      until the event's latest record has run;
//   cuEventQuery            runs one queued operation (of any stream) and
//                           says CUDA_ERROR_NOT_READY while the latest
//                           record has not run, so polling ends;
//   cuCtxSynchronize, cuMemFree, cuMemFreeHost, the synchronous copies
//   (cuMemcpyHtoD, cuMemcpyDtoH) and the primary context's last release
//                           run everything queued first (the driver
//                           synchronises there too);
//   a copy to pageable host memory (cuMemcpyDtoHAsync to memory that is not
//                           cuMemAllocHost's) returns when the copy has run,
//                           as the driver's; one from pageable memory copies
//                           the source when it is called (the driver stages
//                           it), one from page-locked memory reads it when
//                           it runs.
//
// While running, the next operation comes from a stream whose first queued
// operation can run (a wait is satisfied once the record it names has run)
// in the order of emu_sched.h: forward (the stream created first whenever
// it can: the backend's compute stream runs ahead, its copy stream as late
// as its waits allow), reverse (the last created first: a copy as soon as
// its waits allow) or random. An event waited on (cuStreamWaitEvent) is
// the record made before the wait, as in CUDA; a wait for an event never
// recorded, or whose record has run, waits for nothing. The NULL stream is
// ordered with the blocking streams (created without
// CU_STREAM_NON_BLOCKING) by running the other side's queued work before
// queueing on it (more synchronous than the driver, never less).
//
// A queued operation that fails (a launch that deadlocks, traps or writes
// a guard region) is reported when it runs, and from then on every stream
// call and synchronisation returns its error, as a GPU's context is
// unusable after a fault; the queued work is dropped.
//
// The blocking-sync flag of events (CU_EVENT_BLOCKING_SYNC) changes
// nothing here: the waiting thread runs the work itself.
#ifndef GORUN_EMU_STREAMS_H
#define GORUN_EMU_STREAMS_H

namespace {

namespace sched = gorun_emu_sched;

sched::Config g_sched;           // GORUN_CUDA_EMU_SCHED
unsigned long long g_seq;        // operations queued so far
unsigned long long g_launch_no;  // launches so far: the seed of each one's order
sched::Rng g_pick_rng(1);        // random: the next stream to run
CUresult g_sticky;               // async: queued work failed; every later stream call returns it
std::string g_sticky_why;
Stream g_null_stream(0, -1);                  // 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
std::vector<Stream*> g_live{&g_null_stream};  // every stream and its queue, by creation
int g_created;                                // streams created

// Defined with the copies, below in libcuda.cc.
CUresult check_dev(const char* call, const char* what, CUdeviceptr p, size_t n);
CUresult check_host(const char* call, const char* what, const void* p, size_t n);

Stream* stream_of(void* s) { return (uintptr_t)s <= 2 ? &g_null_stream : (Stream*)s; }

bool event_done(const Event* e) { return e->gen == 0 || !e->pending.count(e->gen); }

void event_unref(Event* e) {
  if (--e->refs == 0 && e->dead) delete e;
}

// Forgets a queued operation that will not run.
void drop_op(QOp& o) {
  if (o.kind == QOp::FN) return;
  if (o.kind == QOp::RECORD) o.ev->pending.erase(o.gen);
  event_unref(o.ev);
}

bool runnable(const Stream* s) {
  if (s->q.empty()) return false;
  const QOp& o = s->q.front();
  return o.kind != QOp::WAIT || !o.ev->pending.count(o.gen);
}

// The stream whose first operation runs next, or null when none can.
Stream* pick() {
  Stream* c[64];
  std::vector<Stream*> more;
  int k = 0;
  for (Stream* s : g_live) {
    if (!runnable(s)) continue;
    if (g_sched.order == sched::FORWARD) return s;
    if (k < 64)
      c[k++] = s;
    else
      more.push_back(s);
  }
  if (!more.empty()) {
    more.insert(more.begin(), c, c + k);
    return g_sched.order == sched::REVERSE ? more.back() : more[g_pick_rng.below(more.size())];
  }
  if (k == 0) return nullptr;
  return g_sched.order == sched::REVERSE ? c[k - 1] : c[g_pick_rng.below((uint64_t)k)];
}

// Drops everything queued (queued work failed: the context is lost).
void abandon() {
  for (Stream* s : g_live) {
    for (QOp& o : s->q) drop_op(o);
    s->q.clear();
  }
}

void set_sticky(CUresult r) {
  if (g_sticky) return;
  g_sticky = r;
  {
    std::lock_guard<std::mutex> l(g_msg_mu);
    g_sticky_why = g_msg;
  }
  abandon();
}

// The error of every stream call after queued work failed.
CUresult sticky(const char* call) {
  return fail(g_sticky, "%s: queued work failed before (%s); the context cannot be used any more, as on a GPU", call,
              g_sticky_why.c_str());
}

#define NEED_HEALTHY                         \
  do {                                       \
    if (g_sticky) return sticky(__func__);   \
  } while (0)

// Runs the first queued operation of s.
void run_op(Stream* s) {
  QOp o = std::move(s->q.front());
  s->q.pop_front();
  s->done = o.seq;
  switch (o.kind) {
    case QOp::RECORD: {
      Event* e = o.ev;
      e->pending.erase(o.gen);
      if (o.gen >= e->ms_gen) {
        e->ms = now_ms();
        e->ms_gen = o.gen;
      }
      event_unref(e);
      break;
    }
    case QOp::WAIT: event_unref(o.ev); break;
    case QOp::FN:
      if (CUresult r = o.fn()) set_sticky(r);
      break;
  }
}

// Frees the destroyed streams whose work has run.
void reap() {
  for (size_t i = 0; i < g_live.size();) {
    Stream* s = g_live[i];
    if (s->dead && s->q.empty()) {
      g_live.erase(g_live.begin() + i);
      delete s;
    } else {
      i++;
    }
  }
}

// Runs queued operations until done() holds; returns the sticky error when
// queued work failed.
template <class F>
CUresult run_until(F done) {
  while (!g_sticky && !done()) {
    Stream* s = pick();
    if (!s) {
      reap();
      return fail(CUDA_ERROR_UNKNOWN, "internal: queued work cannot go on (a wait for a record nothing runs)");
    }
    run_op(s);
  }
  reap();
  return g_sticky;
}

bool all_idle() {
  for (Stream* s : g_live)
    if (!s->q.empty()) return false;
  return true;
}

// Runs everything queued (async; nothing is queued otherwise).
CUresult drain() { return g_sched.async ? run_until(all_idle) : CUDA_SUCCESS; }

// Queues o on s, or runs it now when streams are synchronous; *seq is its
// number. Returns what the queueing call returns.
CUresult submit(Stream* s, QOp o, unsigned long long* seq = nullptr) {
  if (g_sticky) {
    drop_op(o);
    return g_sticky;
  }
  o.seq = ++g_seq;
  if (seq) *seq = o.seq;
  if (!g_sched.async) {
    if (o.kind == QOp::FN) return o.fn();
    drop_op(o);
    return CUDA_SUCCESS;
  }
  CUresult r = CUDA_SUCCESS;
  if (s == &g_null_stream)  // the legacy NULL stream: after the blocking streams' work
    r = run_until([] {
      for (Stream* x : g_live)
        if (x != &g_null_stream && !(x->flags & 1) && !x->q.empty()) return false;
      return true;
    });
  else if (!(s->flags & 1))  // a blocking stream: after the NULL stream's work
    r = run_until([] { return g_null_stream.q.empty(); });
  if (r) {
    drop_op(o);
    return r;
  }
  s->q.push_back(std::move(o));
  return CUDA_SUCCESS;
}

CUresult submit_fn(Stream* s, std::function<CUresult()> fn, unsigned long long* seq = nullptr) {
  QOp o{};
  o.kind = QOp::FN;
  o.fn = std::move(fn);
  return submit(s, std::move(o), seq);
}

// Sets the schedule from a GORUN_CUDA_EMU_SCHED value (work queued under
// the old one runs first).
CUresult set_sched(const char* v, const char* call) {
  sched::Config c;
  char why[512];
  if (!sched::parse(v, &c, why, sizeof why)) return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s", call, why);
  if (CUresult r = drain()) return r;
  g_sched = c;
  g_pick_rng = sched::Rng(sched::mix(c.seed ^ 0x5eed5eed5eedull));
  g_launch_no = 0;  // the same schedule again gives the same orders
  return CUDA_SUCCESS;
}

// Forgets the queues and a sticky error (the context's last release, after
// drain).
void reset_streams() {
  abandon();
  for (Stream* s : g_live)
    if (s->dead) delete s;
  g_live.assign(1, &g_null_stream);
  g_sticky = CUDA_SUCCESS;
  g_sticky_why.clear();
}

// ---- launches -------------------------------------------------------------------

// Runs a launch's blocks in the configured order, then checks the guard
// regions of the memory its pointer parameters point into (emu_guard.h).
CUresult run_grid(const gorun_emu::KernelDef* d, const void* args, const std::vector<uintptr_t>& ptrs, unsigned gx,
                  unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, uint64_t seed) {
  int n = (int)(bx * by * bz);
  gridDim = uint3{gx, gy, gz};
  blockDim = uint3{bx, by, bz};
  Block* b = &g_blk;
  b->def = d;
  b->args = args;
  b->n = n;
  b->bx = bx;
  b->by = by;
  b->flat = by == 1 && bz == 1;
  b->failed = false;
  b->order_kind = g_sched.order;
  b->permuted = g_sched.order != sched::FORWARD;
  g_stats.launches++;
  g_stats.threads += (unsigned long long)n * gx * gy * gz;
  unsigned long long total = (unsigned long long)gx * gy * gz;
  sched::Perm perm(total, g_sched.order, seed);
  for (unsigned long long i = 0; i < total && !b->failed; i++) {
    unsigned long long j = perm.at(i);
    blockIdx = uint3{(unsigned)(j % gx), (unsigned)(j / gx % gy), (unsigned)(j / ((unsigned long long)gx * gy))};
    if (b->permuted) b->rng = sched::Rng(sched::mix(seed + 0x9e3779b97f4a7c15ull * (j + 1)));
    run_block(b);
  }
  if (b->failed) return fail(b->code, "cuLaunchKernel %s: %s", d->name, b->why);
  std::vector<void*> pp(d->nparams);
  for (int i = 0; i < d->nparams; i++) pp[i] = (void*)&ptrs[i];
  return check_guards(d, pp.data());
}

// Runs a checked launch now, or queues it (async): the parameters are
// copied now, as the driver does.
CUresult launch_grid(const gorun_emu::KernelDef* d, void** params, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                     unsigned by, unsigned bz, void* s) {
  size_t size = (std::max<size_t>(d->args_size, 1) + 63) & ~(size_t)63;
  std::shared_ptr<unsigned char> args((unsigned char*)aligned_alloc(64, size), free);
  if (!args) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuLaunchKernel %s: %zu bytes for the parameters", d->name, size);
  d->pack(args.get(), params);
  std::vector<uintptr_t> ptrs(d->nparams, 0);
  for (int i = 0; i < d->nparams; i++)
    if (d->params[i].pointer) memcpy(&ptrs[i], params[i], sizeof(uintptr_t));
  uint64_t seed = sched::mix(g_sched.seed ^ sched::mix(++g_launch_no));
  return submit_fn(stream_of(s), [=] { return run_grid(d, args.get(), ptrs, gx, gy, gz, bx, by, bz, seed); });
}

// ---- copies and memsets (async) -------------------------------------------------

bool page_locked(const void* p, size_t n) {
  const Alloc* a = find_alloc((uintptr_t)p, n);
  return a && a->host;
}

CUresult q_htod(const char* call, CUdeviceptr dst, const void* src, size_t n, void* s) {
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_dev(call, "destination", dst, n)) return r;
  if (CUresult r = check_host(call, "source", src, n)) return r;
  void* d = (void*)(uintptr_t)dst;
  if (page_locked(src, n))  // read when the copy runs
    return submit_fn(stream_of(s), [=] {
      memcpy(d, src, n);
      return CUDA_SUCCESS;
    });
  // pageable memory: staged by the call (the caller may reuse it at once)
  auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char*)src, (const unsigned char*)src + n);
  return submit_fn(stream_of(s), [=] {
    memcpy(d, staged->data(), n);
    return CUDA_SUCCESS;
  });
}

CUresult q_dtoh(const char* call, void* dst, CUdeviceptr src, size_t n, void* s) {
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_dev(call, "source", src, n)) return r;
  if (CUresult r = check_host(call, "destination", dst, n)) return r;
  const void* from = (const void*)(uintptr_t)src;
  bool locked = page_locked(dst, n);
  unsigned long long seq = 0;
  Stream* st = stream_of(s);
  CUresult r = submit_fn(
      st,
      [=] {
        memcpy(dst, from, n);
        return CUDA_SUCCESS;
      },
      &seq);
  if (r || locked) return r;
  // pageable memory: the call returns when the copy has run
  return run_until([st, seq] { return st->done >= seq; });
}

CUresult q_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
  void *d = (void*)(uintptr_t)dst, *from = (void*)(uintptr_t)src;
  return submit_fn(stream_of(s), [=] {
    memmove(d, from, n);
    return CUDA_SUCCESS;
  });
}

CUresult q_memset8(CUdeviceptr dst, unsigned char v, size_t n, void* s) {
  void* d = (void*)(uintptr_t)dst;
  return submit_fn(stream_of(s), [=] {
    memset(d, v, n);
    return CUDA_SUCCESS;
  });
}

CUresult q_memset32(CUdeviceptr dst, unsigned v, size_t n, void* s) {
  unsigned* d = (unsigned*)(uintptr_t)dst;
  return submit_fn(stream_of(s), [=] {
    for (size_t i = 0; i < n; i++) d[i] = v;
    return CUDA_SUCCESS;
  });
}

}  // namespace

#endif
