// Package metricstest reads back, for tests, what package metrics
// records and the product never reads: TensorBoard's event files.
package metricstest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/gorun/gorun/metrics/internal/tfevent"
)

// Event is a decoded scalar event.
type Event = tfevent.Event

// ReadEvents reads a TensorBoard event file, checking the TFRecord framing
// and both masked CRC32C checksums of every record.
func ReadEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var out []Event
	for n := 0; ; n++ {
		var hdr [12]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, fmt.Errorf("%s: record %d: truncated header", path, n)
		}
		if tfevent.MaskedCRC(hdr[:8]) != binary.LittleEndian.Uint32(hdr[8:]) {
			return nil, fmt.Errorf("%s: record %d: length checksum mismatch", path, n)
		}
		ln := binary.LittleEndian.Uint64(hdr[:8])
		if ln > 64<<20 {
			return nil, fmt.Errorf("%s: record %d: implausible length %d", path, n, ln)
		}
		data := make([]byte, ln+4)
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, fmt.Errorf("%s: record %d: truncated data", path, n)
		}
		if tfevent.MaskedCRC(data[:ln]) != binary.LittleEndian.Uint32(data[ln:]) {
			return nil, fmt.Errorf("%s: record %d: data checksum mismatch", path, n)
		}
		ev, err := tfevent.Parse(data[:ln])
		if err != nil {
			return nil, fmt.Errorf("%s: record %d: %w", path, n, err)
		}
		out = append(out, ev)
	}
}
