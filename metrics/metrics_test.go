package metrics

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/metrics/internal/tfevent"
	"github.com/gorun/gorun/metrics/metricstest"
)

func TestEventsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(1); s <= 5; s++ {
		if err := r.Log("train", s*10, map[string]float64{"loss": 5 / float64(s), "lr": 1e-4 * float64(s)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Log("eval", 50, map[string]float64{"bleu": 31.5}, map[string]string{"sample": "ein Test"}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("want one event file, got %v", files)
	}
	evs, err := metricstest.ReadEvents(files[0])
	if err != nil {
		t.Fatal(err)
	}
	// the file version, 6 scalar events and the eval's text summary
	if len(evs) != 8 || evs[0].FileVersion != "brain.Event:2" || evs[7].Step != 50 || len(evs[7].Scalars) != 0 {
		t.Fatalf("got %d events, first %+v", len(evs), evs[0])
	}
	if evs[3].Step != 30 || evs[3].Scalars["train/loss"] != float32(5.0/3) || evs[6].Scalars["eval/bleu"] != 31.5 {
		t.Errorf("wrong scalars: %+v %+v", evs[3], evs[6])
	}
	if time.Since(time.Unix(int64(evs[1].WallTime), 0)) > time.Minute {
		t.Errorf("wall time %v", evs[1].WallTime)
	}
	recs, err := ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil || len(recs) != 6 || recs[5].Text["sample"] != "ein Test" || recs[2].Values["loss"] != 5.0/3 {
		t.Fatalf("jsonl: %v %+v", err, recs)
	}
	// A flipped byte is caught by the checksum.
	b, _ := os.ReadFile(files[0])
	b[len(b)-6] ^= 0xff
	os.WriteFile(files[0], b, 0o644)
	if _, err := metricstest.ReadEvents(files[0]); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("corruption not caught: %v", err)
	}
}

// The masked CRC32C of TFRecord, checked against a value computed by hand
// from the definition (crc32c("a") = 0xc1d04330).
func TestMaskedCRC(t *testing.T) {
	c := uint32(0xc1d04330)
	want := ((c >> 15) | (c << 17)) + 0xa282ead8
	if got := tfevent.MaskedCRC([]byte("a")); got != want {
		t.Fatalf("got %08x want %08x", got, want)
	}
}
