package fusion

import (
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion/fusiontest"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
)

// HostStaged: the CPU backend is not staged (its gradients are host
// memory); a staging backend's slices go out in the wire format and come
// back converted and scaled.
func TestHostStaged(t *testing.T) {
	g := make([]float32, 10)
	if _, ok := HostStaged(cpu.New(), kernels.FromF32(g, 10)); ok {
		t.Fatal("the CPU backend was staged")
	}
	be := fusiontest.NewStagedCPU(cpu.New(), 1, time.Millisecond)
	gs, ok := HostStaged(be, kernels.FromF32(g, 10))
	if !ok || gs.Len() != 10 {
		t.Fatalf("HostStaged: %v, Len %d", ok, gs.Len())
	}
	for _, tc := range []struct {
		wire dtype.DType
		dec  func([]byte, int) float32
	}{
		{dtype.Float16, func(b []byte, i int) float32 { return half.F16ToF32(collective.Uint16s(b)[i]) }},
		{dtype.BFloat16, func(b []byte, i int) float32 { return half.BF16ToF32(collective.Uint16s(b)[i]) }},
		{dtype.Float32, func(b []byte, i int) float32 { return collective.Float32s(b)[i] }},
	} {
		for i := range g {
			g[i] = 1.0/3 + float32(i)*1000.7
		}
		host := gs.Pinned(6 * tc.wire.Size())
		f := gs.CopyOut(host, 3, 6, tc.wire) // elements 3..8
		if err := f.Wait(); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, 6)
		for i := range want {
			want[i] = g[3+i]
			switch tc.wire {
			case dtype.Float16:
				want[i] = half.F16ToF32(half.F32ToF16(want[i]))
			case dtype.BFloat16:
				want[i] = half.BF16ToF32(half.F32ToBF16(want[i]))
			}
			if got := tc.dec(host, i); got != want[i] {
				t.Fatalf("%v: element %d copied out as %v, want %v", tc.wire, 3+i, got, want[i])
			}
		}
		gs.CopyIn(3, 6, host, tc.wire, 0.5) // back, halved, on the "device"
		for i := range g {
			w := 1.0/3 + float32(i)*1000.7
			if i >= 3 && i < 9 {
				w = want[i-3] * 0.5
			}
			if g[i] != w {
				t.Fatalf("%v: element %d = %v after CopyIn, want %v", tc.wire, i, g[i], w)
			}
		}
	}
	if err := be.Err(); err != nil {
		t.Fatal(err)
	}
}

// The test double sees the HostStaging contract broken.
func TestStagedCPUContract(t *testing.T) {
	g := kernels.FromF32(make([]float32, 8), 8)
	for _, tc := range []struct {
		name string
		do   func(be *fusiontest.StagedCPU)
		want string
	}{
		{"goroutine", func(be *fusiontest.StagedCPU) {
			p := be.PinnedHost(16)
			done := make(chan struct{})
			go func() { be.CopyOutAsync(p, g.Slice(0, 8), dtype.Float16).Wait(); close(done) }()
			<-done
		}, "from goroutine"},
		{"not pinned", func(be *fusiontest.StagedCPU) {
			be.CopyOutAsync(make([]byte, 32), g, dtype.Float32).Wait()
		}, "not PinnedHost"},
		{"short", func(be *fusiontest.StagedCPU) {
			be.CopyOutAsync(be.PinnedHost(8), g, dtype.Float16).Wait()
		}, "host bytes"},
		{"source written", func(be *fusiontest.StagedCPU) {
			p := be.PinnedHost(16)
			be.CopyIn(g, p, dtype.Float16)
			p[3] = 1 // before a later copy finished or Sync
			be.CopyOutAsync(p, g, dtype.Float16).Wait()
		}, "source of a CopyIn"},
	} {
		be := fusiontest.NewStagedCPU(cpu.New(), 1, 0)
		tc.do(be)
		if err := be.Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Err() = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	// Used as documented: no complaint.
	be := fusiontest.NewStagedCPU(cpu.New(), 1, 0)
	p := be.PinnedHost(16)
	be.CopyIn(g, p, dtype.Float16)
	be.CopyOutAsync(p, g, dtype.Float16).Wait()
	p[3] = 1 // after a later copy finished
	be.CopyIn(g, p, dtype.Float16)
	be.Sync()
	p[3] = 2 // after Sync
	if err := be.Err(); err != nil {
		t.Fatal(err)
	}
}
