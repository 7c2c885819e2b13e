// gorun CUDA emulator (CPU): the order in which it runs things.
//
// GORUN_CUDA_EMU_SCHED (read by cuInit; gorunEmuSetSched changes it in a
// test) is a comma-separated list of:
//
//   async       streams run asynchronously: every stream operation is
//               queued on its stream and runs later, when the host
//               synchronises (cuStreamSynchronize, cuEventSynchronize,
//               cuCtxSynchronize, a copy to pageable host memory, ...), in
//               stream order, waits and events as the driver orders them,
//               the streams interleaved in the order below;
//   forward     (the default) blocks in grid order, the threads of a block
//               by index; with async, the stream created first runs first
//               whenever it can (the backend's compute stream before its
//               copy stream: work queued after a copy runs before the copy);
//   reverse     blocks, threads and streams the other way round (with
//               async, a copy runs as soon as its waits allow);
//   random      blocks, threads (at the start and after every barrier and
//               warp collective) and, with async, the next stream to run an
//               operation in a seeded random order;
//   seed=N      the seed of random (default 1): the same seed and the same
//               calls give the same order.
//
// Without the variable: synchronous calls, forward order (what the
// emulator always did).
#ifndef GORUN_EMU_SCHED_H
#define GORUN_EMU_SCHED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace gorun_emu_sched {

enum Order { FORWARD, REVERSE, RANDOM };

struct Config {
  bool async = false;
  Order order = FORWARD;
  unsigned long long seed = 1;
};

// Parses a GORUN_CUDA_EMU_SCHED value into *c; on an unknown word it
// returns false and explains in why.
inline bool parse(const char* s, Config* c, char* why, size_t n) {
  Config r;
  if (!s) s = "";
  const char* p = s;
  while (*p) {
    const char* e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char w[64];
    if (len >= sizeof w) len = sizeof w - 1;
    memcpy(w, p, len);
    w[len] = 0;
    char* a = w;
    while (*a == ' ') a++;
    for (char* z = a + strlen(a); z > a && z[-1] == ' ';) *--z = 0;
    if (!*a) {
    } else if (!strcmp(a, "async")) {
      r.async = true;
    } else if (!strcmp(a, "sync")) {
      r.async = false;
    } else if (!strcmp(a, "forward")) {
      r.order = FORWARD;
    } else if (!strcmp(a, "reverse")) {
      r.order = REVERSE;
    } else if (!strcmp(a, "random")) {
      r.order = RANDOM;
    } else if (!strncmp(a, "seed=", 5) && a[5]) {
      char* end;
      r.seed = strtoull(a + 5, &end, 0);
      if (*end) {
        snprintf(why, n, "GORUN_CUDA_EMU_SCHED=%s: %s is not seed=<number>", s, a);
        return false;
      }
    } else {
      snprintf(why, n,
               "GORUN_CUDA_EMU_SCHED=%s: unknown word %s (want a comma-separated list of async, sync, forward, "
               "reverse, random, seed=N)",
               s, a);
      return false;
    }
    if (!e) break;
    p = e + 1;
  }
  *c = r;
  return true;
}

// The finalizer of splitmix64.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed = 1) : s(seed) {}
  uint64_t next() { return mix(s += 0x9e3779b97f4a7c15ull); }
  // uniform in [0, n), n > 0
  uint64_t below(uint64_t n) {
    uint64_t lim = -n % n;  // 2^64 mod n: values below it are rejected
    for (;;) {
      uint64_t v = next();
      if (v >= lim) return v % n;
    }
  }
};

// A permutation of [0, n): the identity (forward), reversed, or a keyed
// Feistel network on the smallest even power of two >= n, walked until it
// lands inside [0, n) (random: no table, any n).
struct Perm {
  unsigned long long n = 0;
  Order order = FORWARD;
  int half = 0;  // bits per Feistel half
  uint64_t key[4] = {0, 0, 0, 0};

  Perm() {}
  Perm(unsigned long long n_, Order o, uint64_t seed) : n(n_), order(o) {
    if (order != RANDOM) return;
    int bits = 0;
    while (bits < 64 && (1ull << bits) < n) bits++;
    half = (bits + 1) / 2;
    if (half == 0) half = 1;
    for (int i = 0; i < 4; i++) key[i] = mix(seed + 0x632be59bd9b4e019ull * (i + 1));
  }
  unsigned long long feistel(unsigned long long x) const {
    uint64_t mask = half >= 32 ? 0xffffffffull : (1ull << half) - 1;
    uint64_t l = (x >> half) & mask, r = x & mask;
    for (int i = 0; i < 4; i++) {
      uint64_t t = l ^ (mix(r ^ key[i]) & mask);
      l = r;
      r = t;
    }
    return (l << half) | r;
  }
  unsigned long long at(unsigned long long i) const {
    switch (order) {
      case REVERSE: return n - 1 - i;
      case RANDOM: {
        unsigned long long x = feistel(i);
        while (x >= n) x = feistel(x);  // cycle walking: stays a bijection of [0, n)
        return x;
      }
      default: return i;
    }
  }
};

// Fills order[0..n) with 0..n-1 in the configured order.
template <class T>
inline void thread_order(T* order, int n, Order o, Rng* rng) {
  for (int i = 0; i < n; i++) order[i] = (T)(o == REVERSE ? n - 1 - i : i);
  if (o == RANDOM)
    for (int i = n - 1; i > 0; i--) {
      int j = (int)rng->below((uint64_t)i + 1);
      T t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
}

}  // namespace gorun_emu_sched

#endif
