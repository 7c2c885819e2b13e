package fusion

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion/fusiontest"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// bkOnRanks runs f on every rank of ts concurrently, each with its own
// Communicator, and returns the errors by rank.
func bkOnRanks(ts []rank.Transport, f func(r int, c *collective.Communicator) error) []error {
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for r, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := collective.New(t, collective.Config{Timeout: 20 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			errs[r] = f(r, c)
		}()
	}
	wg.Wait()
	return errs
}

func bkNoErrs(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// bkExactVal is rank r's gradient element i of parameter p: a multiple of
// 1/16 in [-2, 2], so sums over a few ranks are exact in float32 in any
// order, and a bucketed result must equal a plain one bit for bit.
func bkExactVal(r, p, i int) float32 { return float32((r*37+p*11+i*5)%61-30) / 16 }

// bkOddParams: odd sizes, an empty one, and one (5000 floats = 20000 bytes)
// larger than the 4 KiB cap used below.
func bkOddParams() []ParamInfo {
	lens := []int{1, 7, 300, 1023, 5000, 3, 0, 129, 64, 2}
	ps := make([]ParamInfo, len(lens))
	for i, n := range lens {
		ps[i] = ParamInfo{Name: fmt.Sprintf("layer_%d/w", i), Len: n}
	}
	return ps
}

func bkTotalLen(ps []ParamInfo) int {
	n := 0
	for _, p := range ps {
		n += p.Len
	}
	return n
}

// fill writes rank r's values into flat (parameters laid out in order).
func bkFill(flat []float32, ps []ParamInfo, r int, val func(r, p, i int) float32) {
	o := 0
	for p, pi := range ps {
		for i := 0; i < pi.Len; i++ {
			flat[o+i] = val(r, p, i)
		}
		o += pi.Len
	}
}

func bkViews(flat []float32, ps []ParamInfo) [][]float32 {
	out := make([][]float32, len(ps))
	o := 0
	for p, pi := range ps {
		out[p] = flat[o : o+pi.Len : o+pi.Len]
		o += pi.Len
	}
	return out
}

// gradMode is how a test hands the Bucketer its gradients.
type gradMode int

const (
	modeFlat   gradMode = iota // AttachFlat: the buffer itself
	modeAttach                 // Attach: per-parameter slices, packed
	modeDevice                 // AttachDevice: through a HostStaging test double
)

func (m gradMode) String() string { return [...]string{"flat", "attach", "device"}[m] }

// attachGrads attaches flat (the parameters' gradients in order) in mode
// m. In modeDevice flat is the storage of the double's "device" tensor
// (written by the test on the rank's goroutine, as a device op queued in
// order would); the double is returned for bkDeviceOK.
func attachGrads(b *Bucketer, ps []ParamInfo, flat []float32, m gradMode, seed uint64) (*fusiontest.StagedCPU, error) {
	switch m {
	case modeAttach:
		return nil, b.Attach(bkViews(flat, ps))
	case modeDevice:
		be := fusiontest.NewStagedCPU(cpu.New(), seed, 2*time.Millisecond)
		gs, ok := HostStaged(be, kernels.FromF32(flat, len(flat)))
		if !ok {
			return nil, errors.New("HostStaged refused the test double")
		}
		return be, b.AttachDevice(gs)
	}
	return nil, b.AttachFlat(flat)
}

// bkDeviceOK checks what the double saw after steps communicating steps of
// b: no contract violation, one copy out and one copy in per non-empty
// bucket and step, and the pinned buffer allocated once.
func bkDeviceOK(be *fusiontest.StagedCPU, b *Bucketer, steps int, wire dtype.DType) error {
	if be == nil {
		return nil
	}
	if err := be.Err(); err != nil {
		return fmt.Errorf("HostStaging contract: %w", err)
	}
	nonEmpty, total := 0, 0
	for _, bk := range b.Buckets() {
		if bk.Elems > 0 {
			nonEmpty++
		}
		total += bk.Elems
	}
	outs, ins, pinned := be.Counts()
	if outs != steps*nonEmpty || ins != steps*nonEmpty || pinned != total*wire.Size() {
		return fmt.Errorf("%d copies out, %d in, %d pinned bytes; want %d, %d, %d", outs, ins, pinned, steps*nonEmpty, steps*nonEmpty, total*wire.Size())
	}
	return nil
}

func TestBucketLayout(t *testing.T) {
	ps := bkOddParams()
	b, err := NewBucketer(nil, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	bs := b.Buckets()
	// Buckets cover the parameters once, in readiness (reverse) order.
	next := len(ps) - 1
	off := bkTotalLen(ps)
	for k, bk := range bs {
		if bk.Index != k || bk.Hi != next || bk.Lo > bk.Hi {
			t.Fatalf("bucket %d = %+v, want it to start at parameter %d", k, bk, next)
		}
		bytes := 0
		for i := bk.Lo; i <= bk.Hi; i++ {
			bytes += 4 * ps[i].Len
			if b.BucketOf(i) != k {
				t.Fatalf("BucketOf(%d) = %d, want %d", i, b.BucketOf(i), k)
			}
		}
		if bytes != bk.Bytes() || bk.Offset+bk.Elems != off {
			t.Fatalf("bucket %+v: %d bytes, ends at %d; want %d bytes, end %d", bk, bk.Bytes(), bk.Offset+bk.Elems, bytes, off)
		}
		limit := 4096
		if k == 0 {
			limit = 512
		}
		// Closed when full (DDP's rule): not full before its last parameter,
		// full with it unless the next parameter is the end or one of 4096
		// bytes or more (those are alone).
		if last := 4 * ps[bk.Lo].Len; bytes-last >= limit {
			t.Fatalf("bucket %d (%d bytes) was full (cap %d) before its last parameter %d", k, bytes, limit, bk.Lo)
		}
		if k+1 < len(bs) && bytes < limit && 4*ps[bk.Lo-1].Len < 4096 {
			t.Fatalf("bucket %d (%d bytes) closed under its cap %d before parameter %d", k, bytes, limit, bk.Lo-1)
		}
		for i := bk.Lo; i <= bk.Hi; i++ {
			if 4*ps[i].Len >= 4096 && bk.Lo != bk.Hi {
				t.Fatalf("parameter %d (%d bytes, over the cap) shares bucket %+v", i, 4*ps[i].Len, bk)
			}
		}
		next = bk.Lo - 1
		off = bk.Offset
	}
	if next != -1 || off != 0 {
		t.Fatalf("buckets end at parameter %d, offset %d", next+1, off)
	}
	// The 5000-float parameter is alone in its bucket.
	if bk := bs[b.BucketOf(4)]; bk.Lo != 4 || bk.Hi != 4 {
		t.Fatalf("parameter larger than the cap shares bucket %+v", bk)
	}
	// Pure function of the list.
	b2, _ := NewBucketer(nil, bkOddParams(), BucketConfig{CapBytes: 4096, FirstCapBytes: 512})
	if fmt.Sprint(b2.Buckets()) != fmt.Sprint(bs) {
		t.Fatalf("layout not reproducible: %v vs %v", b2.Buckets(), bs)
	}
	// Defaults: one bucket for a small model, 25 MiB caps.
	b3, _ := NewBucketer(nil, bkOddParams(), BucketConfig{})
	if len(b3.Buckets()) != 1 {
		t.Fatalf("default caps give %d buckets for %d bytes", len(b3.Buckets()), 4*bkTotalLen(ps))
	}
	// Layout, without a communicator, is the Bucketer's layout.
	if got := Layout(bkOddParams(), BucketConfig{CapBytes: 4096, FirstCapBytes: 512}); fmt.Sprint(got) != fmt.Sprint(bs) {
		t.Fatalf("Layout %v, the Bucketer's %v", got, bs)
	}
	if got := Layout(bkOddParams(), BucketConfig{}); fmt.Sprint(got) != fmt.Sprint(b3.Buckets()) {
		t.Fatalf("Layout with the defaults %v, the Bucketer's %v", got, b3.Buckets())
	}
	if _, err := NewBucketer(nil, []ParamInfo{{Name: "x", Len: -1}}, BucketConfig{}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("negative length: %v", err)
	}
}

type bucketReduceCase struct {
	np    int
	comp  dtype.DType
	avg   bool
	scale float32
	mode  gradMode
}

func TestBucketerMatchesPlainAllreduce(t *testing.T) {
	var cases []bucketReduceCase
	for np := 1; np <= 4; np++ {
		cases = append(cases, bucketReduceCase{np: np}, bucketReduceCase{np: np, avg: true}, bucketReduceCase{np: np, comp: dtype.Float16, avg: true})
	}
	cases = append(cases, bucketReduceCase{np: 3, scale: 0.125}, bucketReduceCase{np: 3, mode: modeAttach, avg: true},
		bucketReduceCase{np: 2, comp: dtype.BFloat16}, bucketReduceCase{np: 4, comp: dtype.Float16, scale: 0.5, mode: modeAttach})
	// Device gradients: the same sums through the asynchronous staging.
	for np := 1; np <= 4; np++ {
		cases = append(cases, bucketReduceCase{np: np, mode: modeDevice}, bucketReduceCase{np: np, comp: dtype.Float16, avg: true, mode: modeDevice})
	}
	cases = append(cases, bucketReduceCase{np: 3, scale: 0.125, mode: modeDevice}, bucketReduceCase{np: 2, comp: dtype.BFloat16, mode: modeDevice},
		bucketReduceCase{np: 3, comp: dtype.BFloat16, avg: true, scale: 0.25, mode: modeDevice}, bucketReduceCase{np: 4, comp: dtype.Float16, scale: 0.5, mode: modeDevice})
	for _, tc := range cases {
		name := fmt.Sprintf("np%d/%v/avg=%v/scale=%v/%v", tc.np, tc.comp, tc.avg, tc.scale, tc.mode)
		t.Run(name, func(t *testing.T) { checkBucketReduce(t, tc) })
	}
}

func checkBucketReduce(t *testing.T, tc bucketReduceCase) {
	ps := bkOddParams()
	n := bkTotalLen(ps)
	ts := ranktest.InMemory(tc.np, 2)
	defer ranktest.CloseAll(ts)
	results := make([][]float32, tc.np)
	refs := make([][]float32, tc.np)
	nbs := make([]int, tc.np)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, Wire: tc.comp, Average: tc.avg, Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		defer b.Close()
		nbs[r] = len(b.Buckets())
		flat := make([]float32, n)
		dev, err := attachGrads(b, ps, flat, tc.mode, uint64(r))
		if err != nil {
			return err
		}
		if tc.scale != 0 {
			b.SetScale(tc.scale)
		}
		// Two steps: the second must not see the first's state.
		for step := 0; step < 2; step++ {
			bkFill(flat, ps, r+step, bkExactVal)
			for i := len(ps) - 1; i >= 0; i-- {
				b.MarkReady(i)
			}
			b.BackwardDone()
			st, err := b.Wait()
			if err != nil {
				return err
			}
			if !st.Reduced || len(st.Buckets) != len(b.Buckets()) || st.Overflow {
				return fmt.Errorf("step %d stats %+v", step, st)
			}
		}
		if err := bkDeviceOK(dev, b, 2, orFloat32(tc.comp)); err != nil {
			return err
		}
		results[r] = flat
		// Reference: one plain allreduce per parameter.
		ref := make([]float32, n)
		bkFill(ref, ps, r+1, bkExactVal)
		op := collective.Sum
		if tc.avg {
			op = collective.Average
		}
		for _, v := range bkViews(ref, ps) {
			if err := c.Allreduce(context.Background(), nil, collective.Float32Bytes(v), dtype.Float32, op); err != nil {
				return err
			}
			if tc.scale != 0 {
				for i := range v {
					v[i] *= tc.scale
				}
			}
		}
		refs[r] = ref
		return nil
	})
	bkNoErrs(t, errs)
	if nbs[0] < 4 {
		t.Fatalf("only %d buckets: the test needs several", nbs[0])
	}
	for r := 1; r < tc.np; r++ {
		for i := range results[0] {
			if math.Float32bits(results[r][i]) != math.Float32bits(results[0][i]) {
				t.Fatalf("rank %d element %d = %v, rank 0 has %v (results must be identical on every rank)", r, i, results[r][i], results[0][i])
			}
		}
	}
	got, ref := results[0], refs[0]
	for p, v := range bkViews(got, ps) {
		o := 0
		for q := 0; q < p; q++ {
			o += ps[q].Len
		}
		for i, x := range v {
			want := ref[o+i]
			if tc.comp == 0 || tc.comp == dtype.Float32 {
				if math.Float32bits(x) != math.Float32bits(want) {
					t.Fatalf("parameter %d element %d = %v, plain allreduce gives %v", p, i, x, want)
				}
				continue
			}
			// Rounded to 16 bits once per hop: at most np roundings of partial
			// sums bounded by the sum of magnitudes.
			abs := 0.0
			for r := 0; r < tc.np; r++ {
				abs += math.Abs(float64(bkExactVal(r+1, p, i)))
			}
			f := 1.0
			if tc.avg {
				f /= float64(tc.np)
			}
			if tc.scale != 0 {
				f *= float64(tc.scale)
			}
			eps := math.Ldexp(1, -11)
			if tc.comp == dtype.BFloat16 {
				eps = math.Ldexp(1, -8)
			}
			if d := math.Abs(float64(x) - float64(want)); d > float64(tc.np)*eps*abs*f+1e-7 {
				t.Fatalf("parameter %d element %d = %v, exact %v: error %g above the %v bound", p, i, x, want, d, tc.comp)
			}
		}
	}
}

// Ranks mark parameters in different orders, from several goroutines
// (host gradients) or in a random order on the rank's goroutine (device
// gradients: the backend's calls come from one goroutine); the buckets
// still launch in index order and the sums are right.
func TestBucketerMarkOrders(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) { checkMarkOrders(t, mode) })
	}
}

func checkMarkOrders(t *testing.T, mode gradMode) {
	const np = 3
	ps := bkOddParams()
	n := bkTotalLen(ps)
	ts := ranktest.InMemory(np, 2)
	defer ranktest.CloseAll(ts)
	results := make([][]float32, np)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512})
		if err != nil {
			return err
		}
		flat := make([]float32, n)
		dev, err := attachGrads(b, ps, flat, mode, uint64(r))
		if err != nil {
			return err
		}
		bkFill(flat, ps, r, bkExactVal)
		order := rand.New(rand.NewPCG(uint64(r), 7)).Perm(len(ps))
		if r == 0 {
			for i := range order { // forward order: the last bucket is ready first
				order[i] = i
			}
		}
		if mode == modeDevice {
			for _, i := range order {
				time.Sleep(time.Millisecond)
				b.MarkReady(i)
			}
		} else {
			var wg sync.WaitGroup
			for g := 0; g < 3; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := g; j < len(order); j += 3 {
						time.Sleep(time.Millisecond)
						b.MarkReady(order[j])
					}
				}()
			}
			wg.Wait()
		}
		// An optimizer waiting bucket by bucket, in readiness order.
		for i := len(ps) - 1; i >= 0; i-- {
			if err := b.WaitParam(i); err != nil {
				return err
			}
		}
		st, err := b.Wait()
		if err != nil {
			return err
		}
		for k := 1; k < len(st.Buckets); k++ {
			if st.Buckets[k].Launch.Before(st.Buckets[k-1].Launch) || st.Buckets[k].Start.Before(st.Buckets[k-1].Reduced) {
				return fmt.Errorf("bucket %d launched or started before bucket %d: %+v", k, k-1, st.Buckets)
			}
		}
		if err := bkDeviceOK(dev, b, 1, dtype.Float32); err != nil {
			return err
		}
		results[r] = flat
		return nil
	})
	bkNoErrs(t, errs)
	for r := 0; r < np; r++ {
		o := 0
		for p, pi := range ps {
			for i := 0; i < pi.Len; i++ {
				want := bkExactVal(0, p, i) + bkExactVal(1, p, i) + bkExactVal(2, p, i)
				if results[r][o+i] != want {
					t.Fatalf("rank %d parameter %d element %d = %v, want %v", r, p, i, results[r][o+i], want)
				}
			}
			o += pi.Len
		}
	}
}

func TestBucketerUnmarkedParameterTimesOut(t *testing.T) {
	ps := bkOddParams()
	ts := ranktest.InMemory(2, 1)
	defer ranktest.CloseAll(ts)
	start := time.Now()
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, Timeout: 300 * time.Millisecond})
		if err != nil {
			return err
		}
		if err := b.AttachFlat(make([]float32, bkTotalLen(ps))); err != nil {
			return err
		}
		for i := len(ps) - 1; i >= 0; i-- {
			if r == 1 && i == 3 {
				continue // rank 1 forgets layer_3/w
			}
			b.MarkReady(i)
		}
		_, err = b.Wait()
		if r == 1 {
			ts[1].Close() // what a failing rank's exit does: its peers see it go
		}
		if err == nil {
			return errors.New("Wait succeeded")
		}
		if r == 1 && !strings.Contains(err.Error(), `"layer_3/w"`) {
			return fmt.Errorf("error does not name the parameter: %v", err)
		}
		if _, err2 := b.Wait(); err2 == nil {
			return errors.New("a Wait after a failed step succeeded")
		}
		t.Logf("rank %d: %v", r, err)
		return nil
	})
	bkNoErrs(t, errs)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("failing took %v", d)
	}
}

func TestBucketerFingerprintMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo
		want string
	}{
		{"name", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			if r == 2 {
				ps[1] = ParamInfo{Name: "layer_1/x", Len: 8}
			}
			return ps
		}, `parameter 1 is "layer_1/w" (7 elements) on rank 0 but "layer_1/x" (8 elements) on rank 2`},
		{"missing", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			if r == 1 {
				ps = ps[:len(ps)-1]
			}
			return ps
		}, `parameter 9 is "layer_9/w" (2 elements) on rank 0 but missing on rank 1`},
		{"compression", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			if r == 1 {
				cfg.Wire = dtype.Float16
			}
			return ps
		}, "compression is none on rank 0 but fp16 on rank 1"},
		{"average", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			cfg.Average = r == 1
			return ps
		}, "average is false on rank 0 but true on rank 1"},
		// the parameters agree; the caps cut other buckets
		{"cap", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			if r == 2 {
				cfg.CapBytes = 8192
			}
			return ps
		}, "bucket cap (bytes) is 4096 on rank 0 but 8192 on rank 2"},
		{"first cap", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			if r == 1 {
				cfg.FirstCapBytes = 256
			}
			return ps
		}, "first bucket cap (bytes) is 512 on rank 0 but 256 on rank 1"},
		{"device", func(r int, ps []ParamInfo, cfg *BucketConfig) []ParamInfo {
			cfg.Wire = dtype.Float16
			return ps
		}, "the buckets are float32 data sent as 16 bits on rank 0 but 16-bit data staged from a device on rank 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := ranktest.InMemory(3, 1)
			defer ranktest.CloseAll(ts)
			errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
				cfg := BucketConfig{CapBytes: 4096, FirstCapBytes: 512}
				ps := tc.edit(r, bkOddParams(), &cfg)
				b, err := NewBucketer(c, ps, cfg)
				if err != nil {
					return err
				}
				mode := modeFlat
				if tc.name == "device" && r == 1 {
					mode = modeDevice
				}
				if _, err := attachGrads(b, ps, make([]float32, bkTotalLen(ps)), mode, 1); err != nil {
					return err
				}
				for i := len(ps) - 1; i >= 0; i-- {
					b.MarkReady(i)
				}
				_, err = b.Wait()
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					return fmt.Errorf("got %v, want an error with %q", err, tc.want)
				}
				return nil
			})
			bkNoErrs(t, errs)
		})
	}
}

func TestBucketerBackwardPassesPerStep(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) { checkPassesPerStep(t, mode) })
	}
}

func checkPassesPerStep(t *testing.T, mode gradMode) {
	const np, k = 2, 3
	ps := bkOddParams()
	n := bkTotalLen(ps)
	ts := ranktest.InMemory(np, 1)
	defer ranktest.CloseAll(ts)
	results := make([][]float32, np)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, BackwardPassesPerStep: k})
		if err != nil {
			return err
		}
		flat := make([]float32, n)
		dev, err := attachGrads(b, ps, flat, mode, uint64(r))
		if err != nil {
			return err
		}
		b.SetScale(1.0 / k)
		one := make([]float32, n)
		for pass := 0; pass < k; pass++ {
			if b.Communicating() != (pass == k-1) {
				return fmt.Errorf("pass %d: Communicating() = %v", pass, b.Communicating())
			}
			bkFill(one, ps, r+pass, bkExactVal)
			for i := range flat {
				flat[i] += one[i] // the model accumulates
			}
			sent0 := ts[r].Stats()[1-r].BytesSent
			for i := len(ps) - 1; i >= 0; i-- {
				b.MarkReady(i)
			}
			b.BackwardDone()
			st, err := b.Wait()
			if err != nil {
				return err
			}
			if st.Reduced != (pass == k-1) {
				return fmt.Errorf("pass %d: Reduced = %v", pass, st.Reduced)
			}
			if sent := ts[r].Stats()[1-r].BytesSent - sent0; pass < k-1 && sent != 0 {
				return fmt.Errorf("pass %d (accumulation only) sent %d bytes", pass, sent)
			}
			if pass == k-1 && st.BytesSent == 0 {
				return fmt.Errorf("the communicating pass reports no bytes sent: %+v", st)
			}
		}
		if err := bkDeviceOK(dev, b, 1, dtype.Float32); err != nil {
			return err
		}
		results[r] = flat
		return nil
	})
	bkNoErrs(t, errs)
	o := 0
	for p, pi := range ps {
		for i := 0; i < pi.Len; i++ {
			var want float32
			for r := 0; r < np; r++ {
				for pass := 0; pass < k; pass++ {
					want += bkExactVal(r+pass, p, i)
				}
			}
			want *= 1.0 / k
			if got := results[0][o+i]; math.Abs(float64(got-want)) > 1e-6 {
				t.Fatalf("parameter %d element %d = %v, want %v", p, i, got, want)
			}
		}
		o += pi.Len
	}
}

func TestBucketerOverflow(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) { checkOverflow(t, mode) })
	}
}

func checkOverflow(t *testing.T, mode gradMode) {
	ps := bkOddParams()
	ts := ranktest.InMemory(2, 1)
	defer ranktest.CloseAll(ts)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, Wire: dtype.Float16, Average: true})
		if err != nil {
			return err
		}
		flat := make([]float32, bkTotalLen(ps))
		dev, err := attachGrads(b, ps, flat, mode, uint64(r))
		if err != nil {
			return err
		}
		for step, bad := range []float32{float32(math.Inf(1)), float32(math.NaN()), 0, 2e5} {
			bkFill(flat, ps, r, bkExactVal)
			if r == 1 && bad != 0 {
				flat[1234] = bad // 2e5 (average 1e5) is finite in float32, not in float16
			}
			for i := len(ps) - 1; i >= 0; i-- {
				b.MarkReady(i)
			}
			st, err := b.Wait()
			if err != nil {
				return err
			}
			if st.Overflow != (bad != 0) {
				return fmt.Errorf("step %d (bad value %v on rank 1): Overflow = %v", step, bad, st.Overflow)
			}
		}
		return bkDeviceOK(dev, b, 4, dtype.Float16)
	})
	bkNoErrs(t, errs)
}

// The host checks: scaleAndCheck on float32 (host gradients), and
// wireOverflow on wire-format buckets (device gradients) against the
// definition (x converted to float32, times the scale, is Inf or NaN) for
// every 16-bit pattern and some float32 ones.
func TestOverflowChecks(t *testing.T) {
	for _, x := range [][]float32{{1, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {}} {
		if scaleAndCheck(x, 1) {
			t.Fatalf("finite %v reported as overflow", x)
		}
	}
	big := make([]float32, 1001)
	for i := range big {
		big[i] = 3e38
	}
	if scaleAndCheck(append([]float32(nil), big...), 1) || !scaleAndCheck(big, 2) {
		t.Fatal("scaling 3e38 by 2 must overflow, and not scaling it must not")
	}

	scales := []float32{1, 0.5, 1.0 / 3, 0, -1, 2, -3, 1e30, float32(math.Inf(1)), float32(math.NaN())}
	bad := func(x, s float32) bool {
		y := float64(x * s)
		return math.IsInf(y, 0) || math.IsNaN(y)
	}
	for _, wire := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
		dec := half.F16ToF32
		if wire == dtype.BFloat16 {
			dec = half.BF16ToF32
		}
		all := make([]uint16, 1<<16)
		for u := range all {
			all[u] = uint16(u)
		}
		for _, sc := range scales {
			for u := 0; u < 1<<16; u++ {
				// the pattern alone, and among finite neighbours
				buf := []uint16{0x3c00, 0x0001, uint16(u), 0x8000, 0x3000}
				if got, want := wireOverflow(uint16Bytes(buf), wire, sc), bad(dec(uint16(u)), sc); got != want {
					t.Fatalf("%v 0x%04x (%v) scale %v: overflow %v, want %v", wire, u, dec(uint16(u)), sc, got, want)
				}
			}
			anyBad := false
			for u := range all {
				anyBad = anyBad || bad(dec(uint16(u)), sc)
			}
			if got := wireOverflow(uint16Bytes(all), wire, sc); got != anyBad {
				t.Fatalf("%v all patterns, scale %v: %v", wire, sc, got)
			}
		}
	}
	f32s := []float32{0, 1, -2.5, math.MaxFloat32, -math.MaxFloat32, 1e-45, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 3e38, 1.7e38}
	for _, sc := range scales {
		for _, x := range f32s {
			buf := []float32{1, x, -1}
			if got, want := wireOverflow(collective.Float32Bytes(buf), dtype.Float32, sc), bad(x, sc); got != want {
				t.Fatalf("float32 %v scale %v: overflow %v, want %v", x, sc, got, want)
			}
		}
	}
	if wireOverflow(nil, dtype.Float16, 1) || wireOverflow(nil, dtype.Float32, 2) {
		t.Fatal("an empty bucket overflows")
	}
}

func TestLossScaler(t *testing.T) {
	l := NewLossScaler()
	if l.Scale != 16384 {
		t.Fatalf("initial scale %v", l.Scale)
	}
	if !l.Update(true) || l.Scale != 8192 {
		t.Fatalf("after an overflow: scale %v", l.Scale)
	}
	for i := 0; i < 1999; i++ {
		if l.Update(false) {
			t.Fatal("a clean step was skipped")
		}
	}
	if l.Scale != 8192 {
		t.Fatalf("grew before 2000 clean steps: %v", l.Scale)
	}
	l.Update(false)
	if l.Scale != 16384 {
		t.Fatalf("after 2000 clean steps: %v", l.Scale)
	}
	for i := 0; i < 40; i++ {
		l.Update(true)
	}
	if l.Scale != 1 {
		t.Fatalf("scale fell below its minimum: %v", l.Scale)
	}
}

// A synthetic backward pass that takes a known time per layer: the first
// buckets are reduced while later layers still compute.
func TestBucketerOverlap(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) { checkOverlap(t, mode) })
	}
}

func checkOverlap(t *testing.T, mode gradMode) {
	const layers, per = 6, 64 << 10
	var ps []ParamInfo
	for l := 0; l < layers; l++ {
		ps = append(ps, ParamInfo{Name: fmt.Sprintf("layer_%d/w", l), Len: per}, ParamInfo{Name: fmt.Sprintf("layer_%d/b", l), Len: 16})
	}
	ts := ranktest.InMemory(2, 2)
	defer ranktest.CloseAll(ts)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4 * per, FirstCapBytes: 4 * per})
		if err != nil {
			return err
		}
		flat := make([]float32, bkTotalLen(ps))
		dev, err := attachGrads(b, ps, flat, mode, uint64(r))
		if err != nil {
			return err
		}
		for step := 0; step < 2; step++ {
			for l := layers - 1; l >= 0; l-- {
				time.Sleep(15 * time.Millisecond) // this layer's backward
				b.MarkReady(2*l + 1)
				b.MarkReady(2 * l)
			}
			b.BackwardDone()
			st, err := b.Wait()
			if err != nil {
				return err
			}
			t.Logf("rank %d step %d: %v", r, step, st)
			if s := st.String(); !strings.Contains(s, fmt.Sprintf("%d buckets", len(st.Buckets))) || !strings.Contains(s, "% hidden") {
				return fmt.Errorf("StepStats.String() = %q", s)
			}
			if len(st.Buckets) < layers {
				return fmt.Errorf("%d buckets", len(st.Buckets))
			}
			if !st.Buckets[0].Launch.Before(st.BackwardDone) || st.Hidden <= 0 || st.Exposed >= st.CommTime {
				return fmt.Errorf("no overlap: first launch %v after backward done, stats %+v",
					st.Buckets[0].Launch.Sub(st.BackwardDone), st)
			}
		}
		return bkDeviceOK(dev, b, 2, dtype.Float32)
	})
	bkNoErrs(t, errs)
}

// The cycle-time rebuild: after the first step, rank 0's readiness times
// cut the buckets; every rank gets the same layout.
func TestBucketerCycleTimeRebuild(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) { checkCycleTimeRebuild(t, mode) })
	}
}

func checkCycleTimeRebuild(t *testing.T, mode gradMode) {
	const layers = 4
	var ps []ParamInfo
	for l := 0; l < layers; l++ {
		ps = append(ps, ParamInfo{Name: fmt.Sprintf("l%d/w", l), Len: 100}, ParamInfo{Name: fmt.Sprintf("l%d/b", l), Len: 10})
	}
	ts := ranktest.InMemory(2, 1)
	defer ranktest.CloseAll(ts)
	layouts := make([][]Bucket, 2)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		b, err := NewBucketer(c, ps, BucketConfig{CycleTime: 40 * time.Millisecond})
		if err != nil {
			return err
		}
		flat := make([]float32, bkTotalLen(ps))
		dev, err := attachGrads(b, ps, flat, mode, uint64(r))
		if err != nil {
			return err
		}
		if len(b.Buckets()) != 1 {
			return fmt.Errorf("%d buckets before the rebuild", len(b.Buckets()))
		}
		for step := 0; step < 2; step++ {
			bkFill(flat, ps, r, bkExactVal)
			for l := layers - 1; l >= 0; l-- {
				if r == 0 {
					time.Sleep(120 * time.Millisecond) // only rank 0's times count
				}
				b.MarkReady(2*l + 1)
				b.MarkReady(2 * l)
			}
			if _, err := b.Wait(); err != nil {
				return err
			}
			for i := range flat[:100] {
				if want := bkExactVal(0, 0, i) + bkExactVal(1, 0, i); flat[i] != want {
					return fmt.Errorf("step %d: element %d = %v, want %v", step, i, flat[i], want)
				}
			}
		}
		layouts[r] = b.Buckets()
		if dev != nil {
			// One bucket in the first step, one per layer in the second;
			// the rebuild reuses the pinned buffer.
			outs, ins, pinned := dev.Counts()
			if outs != 1+layers || ins != 1+layers || pinned != 4*bkTotalLen(ps) {
				return fmt.Errorf("%d copies out, %d in, %d pinned bytes", outs, ins, pinned)
			}
			return dev.Err()
		}
		return nil
	})
	bkNoErrs(t, errs)
	if len(layouts[0]) != layers || fmt.Sprint(layouts[0]) != fmt.Sprint(layouts[1]) {
		t.Fatalf("rebuilt layouts: rank 0 %v, rank 1 %v; want one bucket per layer on both", layouts[0], layouts[1])
	}
}

// Over real QUIC: fp16 halves the bytes on the wire.
func TestBucketerQUIC(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) { checkQUIC(t, mode) })
	}
}

func checkQUIC(t *testing.T, mode gradMode) {
	const np = 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts, err := ranktest.Loopback(ctx, np, rank.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ranktest.CloseAll(ts)
	var ps []ParamInfo
	for i := 0; i < 12; i++ {
		ps = append(ps, ParamInfo{Name: fmt.Sprintf("p%d", i), Len: 20000 + 7*i})
	}
	sent := make([][2]uint64, np)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		for ci, comp := range []dtype.DType{dtype.Float32, dtype.Float16} {
			b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 200 << 10, FirstCapBytes: 64 << 10, Wire: comp})
			if err != nil {
				return err
			}
			flat := make([]float32, bkTotalLen(ps))
			dev, err := attachGrads(b, ps, flat, mode, uint64(r))
			if err != nil {
				return err
			}
			bkFill(flat, ps, r, bkExactVal)
			for i := len(ps) - 1; i >= 0; i-- {
				b.MarkReady(i)
			}
			st, err := b.Wait()
			if err != nil {
				return err
			}
			if err := bkDeviceOK(dev, b, 1, orFloat32(comp)); err != nil {
				return err
			}
			sent[r][ci] = st.BytesSent
			o := 0
			for p, pi := range ps {
				for i := 0; i < pi.Len; i++ {
					want := bkExactVal(0, p, i) + bkExactVal(1, p, i) + bkExactVal(2, p, i)
					if d := math.Abs(float64(flat[o+i] - want)); d > 3*6*math.Ldexp(1, -11) {
						return fmt.Errorf("%v: parameter %d element %d = %v, want %v", comp, p, i, flat[o+i], want)
					}
				}
				o += pi.Len
			}
		}
		return nil
	})
	bkNoErrs(t, errs)
	for r := range sent {
		ratio := float64(sent[r][1]) / float64(sent[r][0])
		t.Logf("rank %d: %d bytes sent with fp32, %d with fp16 (%.3f)", r, sent[r][0], sent[r][1], ratio)
		if ratio < 0.45 || ratio > 0.55 {
			t.Fatalf("rank %d: fp16 sent %.3f of the fp32 bytes, want about half", r, ratio)
		}
	}
}

// orFloat32 is a case's wire type, Float32 where the case leaves it zero
// (as the Bucketer reads BucketConfig.Wire).
func orFloat32(d dtype.DType) dtype.DType {
	if d == 0 {
		return dtype.Float32
	}
	return d
}

// TestParseWire: every spelling nmt-train's --compression accepts, its
// wire type and its name; anything else is refused with the choices.
func TestParseWire(t *testing.T) {
	for s, want := range map[string]dtype.DType{"none": dtype.Float32, "fp32": dtype.Float32, "": dtype.Float32,
		"fp16": dtype.Float16, "half": dtype.Float16, "BF16": dtype.BFloat16, "bfloat16": dtype.BFloat16} {
		got, err := ParseWire(s)
		if err != nil || got != want {
			t.Errorf("ParseWire(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, d := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
		if back, err := ParseWire(wireName(d)); err != nil || back != d {
			t.Errorf("%v (%q) does not parse back: %v, %v", d, wireName(d), back, err)
		}
	}
	if _, err := ParseWire("fp8"); err == nil || !strings.Contains(err.Error(), "want none, fp16 or bf16") {
		t.Errorf("fp8: %v", err)
	}
}

// uint16Bytes views float16 or bfloat16 bits as bytes in the machine's
// byte order, as the wire buffers hold them (no copy).
func uint16Bytes(s []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 2*len(s))
}

// TestLossScalerBounds: the scale never grows above Max, however many
// clean windows; an overflow restarts the window of clean steps (the
// growth needs Window clean steps in a row); and a growth restarts it
// too (the next growth needs a whole window again).
func TestLossScalerBounds(t *testing.T) {
	l := NewLossScaler()
	l.Scale = l.Max / 2
	for i := 0; i < 3*l.Window; i++ {
		l.Update(false)
	}
	if l.Scale != 1<<24 {
		t.Fatalf("after three clean windows from 2^23: scale %v, want the maximum 2^24", l.Scale)
	}
	l = &LossScaler{Scale: 64, Min: 1, Max: 1 << 10, Factor: 2, Window: 4}
	steps := []struct {
		overflow bool
		scale    float32
	}{
		{false, 64}, {false, 64}, {false, 64}, // 3 clean of 4
		{true, 32},                            // overflow: halved, the window starts again
		{false, 32}, {false, 32}, {false, 32}, // 3 clean of 4 again
		{false, 64},                           // the 4th in a row: doubled
		{false, 64}, {false, 64}, {false, 64}, // a new window: 3 of 4
		{false, 128},
	}
	for i, s := range steps {
		if skip := l.Update(s.overflow); skip != s.overflow {
			t.Fatalf("step %d (overflow %v): skip = %v", i, s.overflow, skip)
		}
		if l.Scale != s.scale {
			t.Fatalf("step %d (overflow %v): scale %v, want %v (clean steps counted: %d)", i, s.overflow, l.Scale, s.scale, l.Clean)
		}
	}
}

// TestScaleAndCheckEveryPosition: scaleAndCheck finds an Inf or a NaN at
// any position of any length (the vector part of four sums and the
// tail), with and without a scale, and one that only the scale makes;
// it multiplies every element, the tail's too.
func TestScaleAndCheckEveryPosition(t *testing.T) {
	bads := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for n := 1; n <= 13; n++ {
		for _, sc := range []float32{1, 0.5, 3} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i+1) / 8
			}
			if scaleAndCheck(x, sc) {
				t.Fatalf("n=%d scale %v: finite values reported as overflow", n, sc)
			}
			for i, v := range x {
				if want := float32(i+1) / 8 * sc; v != want {
					t.Fatalf("n=%d scale %v: element %d = %v, want %v", n, sc, i, v, want)
				}
			}
			for pos := 0; pos < n; pos++ {
				for _, bad := range append(bads, 2e38) {
					x := make([]float32, n)
					for i := range x {
						x[i] = 1
					}
					x[pos] = bad
					want := bad != 2e38 || sc == 3 // 2e38 overflows only scaled by 3
					if got := scaleAndCheck(x, sc); got != want {
						t.Fatalf("n=%d scale %v: %v at position %d: overflow %v, want %v", n, sc, bad, pos, got, want)
					}
				}
			}
		}
	}
}

// TestLayoutBoundaries: a bucket closes as soon as it holds at least its
// cap (exactly the cap included; the first cap for bucket 0 only), a
// parameter of exactly CapBytes never joins a non-empty bucket and is
// alone even under a larger first cap, and the cycle-time rule closes a
// bucket before a gradient ready more than CycleTime after the bucket's
// first one (not after the previous gradient; exactly CycleTime stays).
func TestLayoutBoundaries(t *testing.T) {
	span := func(bs []Bucket) string {
		s := ""
		for _, b := range bs {
			s += fmt.Sprintf("[%d..%d]", b.Lo, b.Hi)
		}
		return s
	}
	mk := func(bytes ...int) []ParamInfo {
		ps := make([]ParamInfo, len(bytes))
		for i, b := range bytes {
			ps[i] = ParamInfo{Name: fmt.Sprintf("p%d", i), Len: b / 4}
		}
		return ps
	}
	// readiness order: p7 p6 (64 B: the first cap, exactly), p5 p4 p3
	// (128 B: the cap, exactly; 96 B would already fill a first cap), p2
	// (16 B, closed before p1), p1 (128 B, alone), p0
	ps := mk(8, 128, 16, 32, 48, 48, 32, 32)
	bs := Layout(ps, BucketConfig{FirstCapBytes: 64, CapBytes: 128})
	if got, want := span(bs), "[6..7][3..5][2..2][1..1][0..0]"; got != want {
		t.Errorf("caps 64 then 128, parameters of %v bytes: buckets %s, want %s", []int{8, 128, 16, 32, 48, 48, 32, 32}, got, want)
	}
	off := 0
	for k := len(bs) - 1; k >= 0; k-- {
		if bs[k].Offset != off {
			t.Errorf("bucket %d at offset %d, want %d", k, bs[k].Offset, off)
		}
		off += bs[k].Elems
	}
	if off != bkTotalLen(ps) {
		t.Errorf("buckets hold %d elements, the parameters %d", off, bkTotalLen(ps))
	}
	// a first cap above the cap: a parameter of exactly the cap is alone
	if got, want := span(Layout(mk(8, 128), BucketConfig{FirstCapBytes: 256, CapBytes: 128})), "[1..1][0..0]"; got != want {
		t.Errorf("first cap 256, cap 128, parameters of 8 and 128 bytes: buckets %s, want %s", got, want)
	}
	// cycle time 10ms: p3 at 0, p2 at 6, p1 at 12 (12 after p3: a new
	// bucket, though only 6 after p2), p0 at 22 (10 after p1: the same)
	ps = mk(4, 4, 4, 4)
	t0 := time.Unix(1000, 0)
	ready := []time.Time{t0.Add(22 * time.Millisecond), t0.Add(12 * time.Millisecond), t0.Add(6 * time.Millisecond), t0}
	got := span(layout(ps, []int{0, 1, 2, 3}, 1<<20, 1<<20, nil, ready, 10*time.Millisecond))
	if want := "[2..3][0..1]"; got != want {
		t.Errorf("cycle time 10ms, ready at 22, 12, 6, 0 ms: buckets %s, want %s", got, want)
	}
}

// TestBucketerMisuse: a parameter marked twice in a step, or one that
// does not exist, fails the step with an error that says so (the step
// would otherwise launch a bucket before its gradients are all ready, or
// drop the mark); a bucket or parameter out of range is an error from
// WaitBucket and WaitParam, not a crash.
func TestBucketerMisuse(t *testing.T) {
	ps := bkOddParams()
	run := func(t *testing.T, marks []int, want string) {
		ts := ranktest.InMemory(1, 1)
		defer ranktest.CloseAll(ts)
		bkNoErrs(t, bkOnRanks(ts, func(r int, c *collective.Communicator) error {
			b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, Timeout: 2 * time.Second})
			if err != nil {
				return err
			}
			if err := b.AttachFlat(make([]float32, bkTotalLen(ps))); err != nil {
				return err
			}
			for _, i := range marks {
				b.MarkReady(i)
			}
			_, err = b.Wait()
			if err == nil || !strings.Contains(err.Error(), want) {
				return fmt.Errorf("marks %v: Wait returned %v, want an error saying %q", marks, err, want)
			}
			if _, err2 := b.Wait(); err2 == nil {
				return errors.New("the step after a failed one succeeded")
			}
			return nil
		}))
	}
	all := func(extra ...int) []int {
		var m []int
		for i := len(ps) - 1; i >= 0; i-- {
			m = append(m, i)
			if i == 5 {
				m = append(m, extra...)
			}
		}
		return m
	}
	t.Run("twice", func(t *testing.T) { run(t, all(5), `parameter 5 "layer_5/w" marked ready twice`) })
	t.Run("no such parameter", func(t *testing.T) { run(t, all(len(ps)), fmt.Sprintf("MarkReady(%d): no such parameter", len(ps))) })
	t.Run("negative", func(t *testing.T) { run(t, all(-1), "MarkReady(-1): no such parameter") })
	b, err := NewBucketer(nil, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	nb := len(b.Buckets())
	for _, k := range []int{nb, -1} {
		if err := b.WaitBucket(k); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("no bucket %d", k)) {
			t.Errorf("WaitBucket(%d) of %d buckets: %v", k, nb, err)
		}
	}
	for _, i := range []int{len(ps), -1} {
		if err := b.WaitParam(i); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("no parameter %d", i)) {
			t.Errorf("WaitParam(%d) of %d parameters: %v", i, len(ps), err)
		}
	}
}

// TestBucketerOverflowFromScale: finite reduced gradients that SetScale's
// factor takes past float32's range are an overflow, with host gradients
// (scaled in the check's pass) and with device ones (the scale is applied
// on the device after the copy back, so the host check must apply it
// first); the same factor on smaller gradients is not.
func TestBucketerOverflowFromScale(t *testing.T) {
	for _, k := range []struct {
		mode gradMode
		comp dtype.DType
	}{{modeFlat, dtype.Float32}, {modeDevice, dtype.Float32}, {modeDevice, dtype.Float16}} {
		t.Run(fmt.Sprintf("%v/%v", k.mode, k.comp), func(t *testing.T) {
			ps := bkOddParams()
			ts := ranktest.InMemory(2, 1)
			defer ranktest.CloseAll(ts)
			bkNoErrs(t, bkOnRanks(ts, func(r int, c *collective.Communicator) error {
				b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, Wire: k.comp})
				if err != nil {
					return err
				}
				flat := make([]float32, bkTotalLen(ps))
				dev, err := attachGrads(b, ps, flat, k.mode, uint64(r))
				if err != nil {
					return err
				}
				b.SetScale(3e38) // |sum| >= 1/16 except zeros: 2e37 and more; sums above 1.2 overflow
				for step, small := range []bool{false, true} {
					bkFill(flat, ps, r, bkExactVal)
					if small {
						for i := range flat {
							flat[i] /= 1 << 10 // |sum| <= 3.75/1024: at most 1.1e36 scaled
						}
					}
					for i := len(ps) - 1; i >= 0; i-- {
						b.MarkReady(i)
					}
					st, err := b.Wait()
					if err != nil {
						return err
					}
					if st.Overflow == small {
						return fmt.Errorf("step %d (gradients %s, scale 3e38): Overflow = %v", step, map[bool]string{false: "up to 3.75", true: "up to 3.75/1024"}[small], st.Overflow)
					}
				}
				return bkDeviceOK(dev, b, 2, orFloat32(k.comp))
			}))
		})
	}
}
