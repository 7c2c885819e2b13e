// Package fusiontest has a test double of a device backend for the tests
// of package fusion and of the trainer, on machines without a GPU.
package fusiontest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
)

// StagedCPU is the CPU backend with the kernels.HostStaging of a device:
// CopyOutAsync only records the request and returns; the request is done
// later on another goroutine, after a random delay, in the order of the
// requests (one copy queue, as a device's copy stream), converting with
// package half; then its Fence opens. The source is read when the copy
// runs, not when it is queued, so a caller that writes gradients it has
// handed to a copy that is still queued races with it (the race detector
// sees that), and so does one that reads the host buffer before waiting on
// the Fence.
//
// It also checks the HostStaging contract and reports what it saw broken
// in Err: the staging calls come from one goroutine (as every call of a
// Backend), the host buffers come from PinnedHost, sizes and types are
// right, and a CopyIn's source is not written before a copy queued after
// it has finished (its Fence, which orders the CopyIn before it) or Sync.
type StagedCPU struct {
	*cpu.Backend

	mu       sync.Mutex
	rng      *rand.Rand
	maxDelay time.Duration
	last     chan struct{} // done channel of the last queued copy
	pinned   [][]byte
	pending  map[uintptr]pend // by the start of a CopyIn's source
	owner    int64
	errs     []error
	outs     int
	ins      int
	bytes    int
	seed     maphash.Seed
}

var _ kernels.HostStaging = (*StagedCPU)(nil)

// NewStagedCPU wraps be. Each copy out waits a random delay in [0,
// maxDelay) drawn from seed.
func NewStagedCPU(be *cpu.Backend, seed uint64, maxDelay time.Duration) *StagedCPU {
	done := make(chan struct{})
	close(done)
	return &StagedCPU{Backend: be, rng: rand.New(rand.NewPCG(seed, 0x5eed)), maxDelay: maxDelay, last: done,
		pending: map[uintptr]pend{}, seed: maphash.MakeSeed()}
}

// Name implements kernels.Backend.
func (s *StagedCPU) Name() string { return "cpu+staging (test double)" }

// goid is the calling goroutine's id (for the one-goroutine check only).
func goid() int64 {
	var b [64]byte
	n := runtime.Stack(b[:], false)
	f := bytes.Fields(b[:n])
	if len(f) < 2 {
		return 0
	}
	id, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return id
}

// enter checks the caller's goroutine; s.mu is held.
func (s *StagedCPU) enter(op string) {
	id := goid()
	if s.owner == 0 {
		s.owner = id
	} else if id != s.owner && len(s.errs) < 20 {
		s.errs = append(s.errs, fmt.Errorf("%s from goroutine %d, the backend's calls came from goroutine %d", op, id, s.owner))
	}
}

func (s *StagedCPU) failf(format string, a ...any) {
	if len(s.errs) < 20 {
		s.errs = append(s.errs, fmt.Errorf(format, a...))
	}
}

func (s *StagedCPU) isPinned(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	for _, r := range s.pinned {
		lo := uintptr(unsafe.Pointer(&r[0]))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(r)) {
			return true
		}
	}
	return false
}

// PinnedHost implements kernels.HostStaging (8-byte aligned Go memory).
func (s *StagedCPU) PinnedHost(n int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.enter("PinnedHost")
	if n <= 0 {
		return nil
	}
	w := make([]uint64, (n+7)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
	s.pinned = append(s.pinned, b)
	s.bytes += n
	return b
}

// pend is the source of a CopyIn and the hash of its bytes then.
type pend struct {
	src  []byte
	hash uint64
}

type fence struct {
	done chan struct{}
	err  *error
}

func (f fence) Wait() error {
	<-f.done
	return *f.err
}

func start(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

func (s *StagedCPU) check(op string, t kernels.Tensor, host []byte, wire dtype.DType) bool {
	switch {
	case t.DType != dtype.Float32 || (t.F32 == nil && t.Len() > 0):
		s.failf("%s of %v: want an F32 tensor", op, t)
	case wire != dtype.Float32 && wire != dtype.Float16 && wire != dtype.BFloat16:
		s.failf("%s as %v", op, wire)
	case len(host) < t.Len()*wire.Size():
		s.failf("%s: %d host bytes for %v as %v", op, len(host), t, wire)
	case !s.isPinned(host):
		s.failf("%s: the host buffer is not PinnedHost memory", op)
	default:
		return true
	}
	return false
}

// CopyOutAsync implements kernels.HostStaging.
func (s *StagedCPU) CopyOutAsync(dst []byte, src kernels.Tensor, wire dtype.DType) kernels.Fence {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.enter("CopyOutAsync")
	s.outs++
	var err error
	f := fence{done: make(chan struct{}), err: &err}
	ok := s.check("CopyOutAsync", src, dst, wire)
	delay := time.Duration(0)
	if s.maxDelay > 0 {
		delay = time.Duration(s.rng.Int64N(int64(s.maxDelay)))
	}
	prev := s.last
	s.last = f.done
	data := src.F32
	go func() {
		<-prev
		time.Sleep(delay)
		if !ok {
			err = errors.New("fusiontest: bad CopyOutAsync (see Err)")
			close(f.done)
			return
		}
		s.released()
		put(dst, data, wire)
		close(f.done)
	}()
	return f
}

// released runs when a copy queued after them is done: the CopyIns queued
// before it are over (stream order), so their sources may be written again
// from now on. It checks that nobody wrote them before.
func (s *StagedCPU) released() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, p := range s.pending {
		s.verify(p)
		delete(s.pending, k)
	}
}

// verify reports a CopyIn source that changed; s.mu is held.
func (s *StagedCPU) verify(p pend) {
	if maphash.Bytes(s.seed, p.src) != p.hash {
		s.failf("the source of a CopyIn (%d bytes) was written before a later copy into it or Sync", len(p.src))
	}
}

// CopyIn implements kernels.HostStaging: it waits for the copies queued
// before it (stream order) and converts at once.
func (s *StagedCPU) CopyIn(dst kernels.Tensor, src []byte, wire dtype.DType) {
	s.mu.Lock()
	s.enter("CopyIn")
	s.ins++
	ok := s.check("CopyIn", dst, src, wire)
	prev := s.last
	s.mu.Unlock()
	<-prev
	if !ok || dst.Len() == 0 {
		return
	}
	src = src[:dst.Len()*wire.Size()]
	get(dst.F32, src, wire)
	s.mu.Lock()
	s.pending[start(src)] = pend{src, maphash.Bytes(s.seed, src)}
	s.mu.Unlock()
}

// Sync implements kernels.Backend: it waits for the queued copies and ends
// the CopyIn sources' protection (after checking them).
func (s *StagedCPU) Sync() {
	s.mu.Lock()
	s.enter("Sync")
	prev := s.last
	s.mu.Unlock()
	<-prev
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, p := range s.pending {
		s.verify(p)
		delete(s.pending, k)
	}
	s.Backend.Sync()
}

// Err reports the contract violations seen so far.
func (s *StagedCPU) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// Counts returns the number of CopyOutAsync and CopyIn calls and the bytes
// of PinnedHost memory handed out.
func (s *StagedCPU) Counts() (copiesOut, copiesIn, pinnedBytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outs, s.ins, s.bytes
}

func put(dst []byte, src []float32, wire dtype.DType) {
	switch wire {
	case dtype.Float16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToF16(v))
		}
	case dtype.BFloat16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToBF16(v))
		}
	default:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	}
}

func get(dst []float32, src []byte, wire dtype.DType) {
	switch wire {
	case dtype.Float16:
		for i := range dst {
			dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case dtype.BFloat16:
		for i := range dst {
			dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
}
