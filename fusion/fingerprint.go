package fusion

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gorun/gorun/dtype"
)

type description struct {
	Compression string
	Average     bool
	Passes      int
	CapBytes    int
	FirstCap    int
	CycleTime   int64
	Names       []string
	Lens        []int
	// DeviceWire: the buckets are 16-bit data staged from a device, not
	// float32 data sent as 16 bits (different collectives).
	DeviceWire bool `json:",omitempty"`
	// PowerSGD: its settings; Shapes: each parameter's rows and columns.
	PowerSGD string  `json:",omitempty"`
	Shapes   [][]int `json:",omitempty"`
}

// describe sets the fingerprint material from the parameters, the config
// and the attach mode.
func (b *Bucketer) describe() error {
	d := description{Compression: wireName(b.wire), Average: b.cfg.Average, Passes: b.cfg.BackwardPassesPerStep,
		CapBytes: b.cfg.CapBytes, FirstCap: b.cfg.FirstCapBytes, CycleTime: int64(b.cfg.CycleTime),
		DeviceWire: b.dev != nil && b.wire != dtype.Float32}
	for _, p := range b.params {
		d.Names = append(d.Names, p.Name)
		d.Lens = append(d.Lens, p.Len)
	}
	if b.psgd != nil {
		d.PowerSGD = b.psgd.describe()
		for _, p := range b.params {
			d.Shapes = append(d.Shapes, []int{p.Rows, p.Cols})
		}
	}
	js, err := json.Marshal(d)
	if err != nil {
		return err
	}
	b.desc = js
	return nil
}

// verify exchanges a fingerprint of the layout with every rank; on a
// mismatch it exchanges the layouts themselves and names the first
// difference between rank 0 and the first rank that differs from it.
func (b *Bucketer) verify() error {
	n := b.c.Size()
	if n == 1 {
		return nil
	}
	h := sha256.Sum256(b.desc)
	all := make([]byte, n*len(h))
	if err := b.c.Allgather(b.ctx, h[:], all); err != nil {
		return fmt.Errorf("bucketer: exchanging layout fingerprints: %w", err)
	}
	odd := -1
	for r := 1; r < n; r++ {
		if !bytes.Equal(all[r*len(h):(r+1)*len(h)], all[:len(h)]) {
			odd = r
			break
		}
	}
	if odd < 0 {
		return nil
	}
	// Every rank sees the same hashes, so every rank takes this branch.
	var ln [8]byte
	binary.LittleEndian.PutUint64(ln[:], uint64(len(b.desc)))
	lens := make([]byte, 8*n)
	if err := b.c.Allgather(b.ctx, ln[:], lens); err != nil {
		return fmt.Errorf("bucketer: layouts differ between rank 0 and rank %d (exchanging them failed: %w)", odd, err)
	}
	mx := 0
	for r := 0; r < n; r++ {
		mx = max(mx, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	mine := make([]byte, mx)
	copy(mine, b.desc)
	descs := make([]byte, n*mx)
	if err := b.c.Allgather(b.ctx, mine, descs); err != nil {
		return fmt.Errorf("bucketer: layouts differ between rank 0 and rank %d (exchanging them failed: %w)", odd, err)
	}
	get := func(r int) (description, error) {
		var d description
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		err := json.Unmarshal(descs[r*mx:r*mx+l], &d)
		return d, err
	}
	d0, err0 := get(0)
	d1, err1 := get(odd)
	if err0 != nil || err1 != nil {
		return fmt.Errorf("bucketer: layouts differ between rank 0 and rank %d", odd)
	}
	return fmt.Errorf("bucketer: rank %d: gradient layouts differ between ranks: %s", b.c.Rank(), diffDesc(d0, d1, odd))
}

func diffDesc(a, b description, rb int) string {
	pname := func(d description, i int) string {
		if i >= len(d.Names) {
			return "missing"
		}
		return fmt.Sprintf("%q (%d elements)", d.Names[i], d.Lens[i])
	}
	for i := 0; i < max(len(a.Names), len(b.Names)); i++ {
		if i >= len(a.Names) || i >= len(b.Names) || a.Names[i] != b.Names[i] || a.Lens[i] != b.Lens[i] {
			return fmt.Sprintf("parameter %d is %s on rank 0 but %s on rank %d (rank 0 has %d parameters, rank %d has %d)",
				i, pname(a, i), pname(b, i), rb, len(a.Names), rb, len(b.Names))
		}
	}
	field := func(what string, x, y any) string {
		return fmt.Sprintf("%s is %v on rank 0 but %v on rank %d", what, x, y, rb)
	}
	switch {
	case a.DeviceWire != b.DeviceWire:
		where := func(dev bool) string {
			if dev {
				return "16-bit data staged from a device"
			}
			return "float32 data sent as 16 bits"
		}
		return fmt.Sprintf("the buckets are %s on rank 0 but %s on rank %d (every rank must use the same kind of device, or --compression none)",
			where(a.DeviceWire), where(b.DeviceWire), rb)
	case a.Compression != b.Compression:
		return field("compression", a.Compression, b.Compression)
	case a.PowerSGD != b.PowerSGD:
		off := func(s string) string {
			if s == "" {
				return "off"
			}
			return s
		}
		return field("PowerSGD", off(a.PowerSGD), off(b.PowerSGD))
	case fmt.Sprint(a.Shapes) != fmt.Sprint(b.Shapes):
		for i := 0; i < min(len(a.Shapes), len(b.Shapes)); i++ {
			if fmt.Sprint(a.Shapes[i]) != fmt.Sprint(b.Shapes[i]) {
				return fmt.Sprintf("parameter %d %q is a %dx%d matrix on rank 0 but %dx%d on rank %d", i, a.Names[i], a.Shapes[i][0], a.Shapes[i][1], b.Shapes[i][0], b.Shapes[i][1], rb)
			}
		}
		return "the parameters' shapes differ"
	case a.Average != b.Average:
		return field("average", a.Average, b.Average)
	case a.Passes != b.Passes:
		return field("backward passes per step", a.Passes, b.Passes)
	case a.CapBytes != b.CapBytes:
		return field("bucket cap (bytes)", a.CapBytes, b.CapBytes)
	case a.FirstCap != b.FirstCap:
		return field("first bucket cap (bytes)", a.FirstCap, b.FirstCap)
	case a.CycleTime != b.CycleTime:
		return field("cycle time", time.Duration(a.CycleTime), time.Duration(b.CycleTime))
	}
	return "the bucket settings differ"
}
