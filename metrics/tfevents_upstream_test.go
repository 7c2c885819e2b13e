package metrics

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/metrics/internal/tfevent"
	"github.com/gorun/gorun/metrics/metricstest"
)

// The files under testdata/upstream are the byte strings that
// TensorBoard's own tests assert, one of them dumped from a real
// TensorFlow 2 event file (test/interop/UPSTREAM.md names each source
// line). They check our event files against TensorBoard's authors rather
// than against our own reader.

func upstream(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "upstream", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMaskedCRCMatchesUpstream: the two checksums TensorBoard's
// masked_crc.rs asserts (RFC 3720's 32 zero bytes, and a file_version
// event).
func TestMaskedCRCMatchesUpstream(t *testing.T) {
	mask := func(c uint32) uint32 { return ((c >> 15) | (c << 17)) + 0xa282ead8 }
	if got, want := tfevent.MaskedCRC(upstream(t, "crc-zeros.bin")), mask(0x8a9136aa); got != want {
		t.Errorf("32 zero bytes: %#08x, want %#08x", got, want)
	}
	if got := tfevent.MaskedCRC(upstream(t, "crc-file-version.bin")); got != 0x5794d08a {
		t.Errorf("file_version event: %#08x, want 0x5794d08a", got)
	}
}

// TestEventWriterMatchesUpstream: the first record of a file TensorFlow
// wrote, rebuilt by our writer from its wall time, byte for byte (length,
// both checksums, the event's field order).
func TestEventWriterMatchesUpstream(t *testing.T) {
	want := upstream(t, "file-version.tfevents")
	// The event is the 24 bytes after the 12-byte header: wall_time is a
	// fixed64 after its one-byte tag.
	wall := math.Float64frombits(binary.LittleEndian.Uint64(want[13:21]))
	var buf bytes.Buffer
	e := &EventWriter{w: bufio.NewWriter(&buf)}
	if err := e.record(fileVersionEvent(wall)); err != nil {
		t.Fatal(err)
	}
	e.w.Flush()
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("our record differs from TensorFlow's:\n got %x\nwant %x", buf.Bytes(), want)
	}
}

// TestReadEventsUpstreamFiles reads TensorFlow 2's scalar (a tensor
// summary, not simple_value) and refuses the two corruptions TensorBoard
// refuses.
func TestReadEventsUpstreamFiles(t *testing.T) {
	path := func(name string) string { return filepath.Join("testdata", "upstream", name) }
	evs, err := metricstest.ReadEvents(path("tf2-scalar.tfevents"))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].FileVersion != "brain.Event:2" {
		t.Fatalf("events %+v, want the file_version event and one scalar", evs)
	}
	if ev := evs[1]; ev.Step != 77 || len(ev.Scalars) != 1 || ev.Scalars["accuracy"] != float32(0.99) {
		t.Errorf("scalar event %+v, want step 77 accuracy 0.99", ev)
	}
	for file, reason := range map[string]string{
		"bad-length-crc.tfevents": "length checksum mismatch",
		"bad-data-crc.tfevents":   "data checksum mismatch",
	} {
		_, err := metricstest.ReadEvents(path(file))
		if err == nil || !strings.Contains(err.Error(), reason) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: err %v, want one naming the file and %q", file, err, reason)
		}
	}
}
