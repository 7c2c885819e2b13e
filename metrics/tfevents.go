// Package metrics writes what a training run measures: metrics.jsonl,
// TensorBoard event files, and PNG plots of the same series.
package metrics

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/gorun/gorun/internal/atomicfile"
	"google.golang.org/protobuf/encoding/protowire"
)

// TensorBoard reads TFRecord files of tensorflow.Event protos. No maintained
// Go library writes them without pulling in TensorFlow's generated protos, so
// the few fields a scalar needs are encoded here with protowire.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// EventWriter appends scalar summaries to a TensorBoard event file.
type EventWriter struct {
	f    *os.File
	w    *bufio.Writer
	path string
}

// NewEventWriter creates dir/events.out.tfevents.<unix>.<host>, or, when a
// file of that name exists (a resumed run started in the same second),
// the same name with the suffix .1, .2, ...: an existing event file is
// never truncated. TensorBoard reads the files of a directory in name
// order.
func NewEventWriter(dir string) (*EventWriter, error) {
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	base := filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%d.%s", time.Now().Unix(), host))
	path := base
	var f *os.File
	for n := 1; ; n++ {
		var err error
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || n > 1000 {
			return nil, err
		}
		path = fmt.Sprintf("%s.%d", base, n)
	}
	ew := &EventWriter{f: f, w: bufio.NewWriter(f), path: path}
	if err := ew.record(fileVersionEvent(wallTime(time.Now()))); err != nil {
		f.Close()
		return nil, err
	}
	return ew, ew.w.Flush()
}

// fileVersionEvent is the first event of every file: the format version.
func fileVersionEvent(wall float64) []byte {
	var ev []byte
	ev = protowire.AppendTag(ev, 1, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wall))
	ev = protowire.AppendTag(ev, 3, protowire.BytesType)
	return protowire.AppendString(ev, "brain.Event:2")
}

// wallTime is an event's wall_time: seconds since the epoch.
func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func (e *EventWriter) record(data []byte) error {
	var hdr [12]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(hdr[8:], maskedCRC(hdr[:8]))
	var foot [4]byte
	binary.LittleEndian.PutUint32(foot[:], maskedCRC(data))
	if _, err := e.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := e.w.Write(data); err != nil {
		return err
	}
	_, err := e.w.Write(foot[:])
	return err
}

// Scalars writes one event holding the given tag → value pairs at step.
func (e *EventWriter) Scalars(step int64, wall time.Time, values map[string]float64) error {
	var summary []byte
	for _, tag := range sortedKeys(values) {
		var v []byte
		v = protowire.AppendTag(v, 1, protowire.BytesType)
		v = protowire.AppendString(v, tag)
		v = protowire.AppendTag(v, 2, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(float32(values[tag])))
		summary = protowire.AppendTag(summary, 1, protowire.BytesType)
		summary = protowire.AppendBytes(summary, v)
	}
	return e.record(summaryEvent(step, wall, summary))
}

// Text writes one event holding the given tag → text pairs at step, as
// the text plugin's summaries (a string tensor; TensorBoard's Text
// dashboard renders it as Markdown).
func (e *EventWriter) Text(step int64, wall time.Time, values map[string]string) error {
	var summary []byte
	for _, tag := range sortedKeys(values) {
		var tensor []byte
		tensor = protowire.AppendTag(tensor, 1, protowire.VarintType) // dtype
		tensor = protowire.AppendVarint(tensor, 7)                    // DT_STRING
		tensor = protowire.AppendTag(tensor, 2, protowire.BytesType)  // tensor_shape: a scalar
		tensor = protowire.AppendBytes(tensor, nil)
		tensor = protowire.AppendTag(tensor, 8, protowire.BytesType) // string_val
		tensor = protowire.AppendString(tensor, values[tag])
		summary = appendPluginValue(summary, tag, "text", nil, tensor)
	}
	return e.record(summaryEvent(step, wall, summary))
}

// HParams writes the run's settings as a session start of the hparams
// plugin (TensorBoard's HParams dashboard; its metrics are the run's
// scalars). Each value is a string, a float64 or a bool.
func (e *EventWriter) HParams(wall time.Time, values map[string]any) error {
	var start []byte // tensorboard.hparams.SessionStartInfo
	for _, k := range sortedKeys(values) {
		var v []byte // google.protobuf.Value
		switch x := values[k].(type) {
		case float64:
			v = protowire.AppendTag(v, 2, protowire.Fixed64Type)
			v = protowire.AppendFixed64(v, math.Float64bits(x))
		case string:
			v = protowire.AppendTag(v, 3, protowire.BytesType)
			v = protowire.AppendString(v, x)
		case bool:
			v = protowire.AppendTag(v, 4, protowire.VarintType)
			v = protowire.AppendVarint(v, protowire.EncodeBool(x))
		default:
			return fmt.Errorf("hparam %s: a %T is not a string, number or bool", k, x)
		}
		var entry []byte // map<string, Value> entry
		entry = protowire.AppendTag(entry, 1, protowire.BytesType)
		entry = protowire.AppendString(entry, k)
		entry = protowire.AppendTag(entry, 2, protowire.BytesType)
		entry = protowire.AppendBytes(entry, v)
		start = protowire.AppendTag(start, 1, protowire.BytesType) // hparams
		start = protowire.AppendBytes(start, entry)
	}
	start = protowire.AppendTag(start, 5, protowire.Fixed64Type) // start_time_secs
	start = protowire.AppendFixed64(start, math.Float64bits(wallTime(wall)))
	var content []byte // tensorboard.hparams.HParamsPluginData, version 0
	content = protowire.AppendTag(content, 3, protowire.BytesType)
	content = protowire.AppendBytes(content, start)
	var null []byte // the hparams plugin's empty float tensor
	null = protowire.AppendTag(null, 1, protowire.VarintType)
	null = protowire.AppendVarint(null, 1) // DT_FLOAT
	null = protowire.AppendTag(null, 2, protowire.BytesType)
	null = protowire.AppendBytes(null, protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), nil)) // shape [0]
	summary := appendPluginValue(nil, "_hparams_/session_start_info", "hparams", content, null)
	return e.record(summaryEvent(0, wall, summary))
}

// appendPluginValue appends a Summary.Value with a tag, the metadata
// naming the plugin that reads it (and its content), and a tensor.
func appendPluginValue(summary []byte, tag, plugin string, content, tensor []byte) []byte {
	var pd []byte // SummaryMetadata.PluginData
	pd = protowire.AppendTag(pd, 1, protowire.BytesType)
	pd = protowire.AppendString(pd, plugin)
	if len(content) > 0 {
		pd = protowire.AppendTag(pd, 2, protowire.BytesType)
		pd = protowire.AppendBytes(pd, content)
	}
	var md []byte // SummaryMetadata
	md = protowire.AppendTag(md, 1, protowire.BytesType)
	md = protowire.AppendBytes(md, pd)
	var v []byte
	v = protowire.AppendTag(v, 1, protowire.BytesType)
	v = protowire.AppendString(v, tag)
	v = protowire.AppendTag(v, 9, protowire.BytesType) // metadata
	v = protowire.AppendBytes(v, md)
	v = protowire.AppendTag(v, 8, protowire.BytesType) // tensor
	v = protowire.AppendBytes(v, tensor)
	summary = protowire.AppendTag(summary, 1, protowire.BytesType)
	return protowire.AppendBytes(summary, v)
}

// summaryEvent is an Event holding a Summary at step.
func summaryEvent(step int64, wall time.Time, summary []byte) []byte {
	var ev []byte
	ev = protowire.AppendTag(ev, 1, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wallTime(wall)))
	ev = protowire.AppendTag(ev, 2, protowire.VarintType)
	ev = protowire.AppendVarint(ev, uint64(step))
	ev = protowire.AppendTag(ev, 5, protowire.BytesType)
	return protowire.AppendBytes(ev, summary)
}

// Flush writes buffered events to the file.
func (e *EventWriter) Flush() error { return e.w.Flush() }

// Close flushes and closes the file.
func (e *EventWriter) Close() error {
	if err := e.w.Flush(); err != nil {
		e.f.Close()
		return err
	}
	return e.f.Close()
}

// CutEvents removes from the event file path every event of a step after
// step, and a torn or corrupt tail (a writer killed mid-record), by
// writing the events it keeps to a temporary file (no "tfevents" in its
// name, so TensorBoard does not read it) renamed over path. It reports
// whether it changed the file.
func CutEvents(path string, step int64) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var keep []byte
	cut := false
	for rest := b; len(rest) > 0; {
		if len(rest) < 12 || maskedCRC(rest[:8]) != binary.LittleEndian.Uint32(rest[8:12]) {
			cut = true
			break
		}
		ln := binary.LittleEndian.Uint64(rest[:8])
		if len(rest) < 16 || ln > uint64(len(rest)-16) {
			cut = true
			break
		}
		data := rest[12 : 12+ln]
		if maskedCRC(data) != binary.LittleEndian.Uint32(rest[12+ln:16+ln]) {
			cut = true
			break
		}
		ev, err := parseEvent(data)
		if err != nil {
			cut = true
			break
		}
		if ev.Step > step {
			cut = true
		} else {
			keep = append(keep, rest[:16+ln]...)
		}
		rest = rest[16+ln:]
	}
	if !cut {
		return false, nil
	}
	return true, atomicfile.WriteFile(path, ".events.cut.tmp*", keep)
}

// Event is a decoded scalar event.
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	Scalars     map[string]float32
}

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
		if maskedCRC(hdr[:8]) != binary.LittleEndian.Uint32(hdr[8:]) {
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
		if maskedCRC(data[:ln]) != binary.LittleEndian.Uint32(data[ln:]) {
			return nil, fmt.Errorf("%s: record %d: data checksum mismatch", path, n)
		}
		ev, err := parseEvent(data[:ln])
		if err != nil {
			return nil, fmt.Errorf("%s: record %d: %v", path, n, err)
		}
		out = append(out, ev)
	}
}

func parseEvent(b []byte) (Event, error) {
	ev := Event{Scalars: map[string]float32{}}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ev, errors.New("bad tag")
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return ev, errors.New("bad wall_time")
			}
			ev.WallTime, b = math.Float64frombits(v), b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return ev, errors.New("bad step")
			}
			ev.Step, b = int64(v), b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return ev, errors.New("bad file_version")
			}
			ev.FileVersion, b = v, b[n:]
		case num == 5 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ev, errors.New("bad summary")
			}
			b = b[n:]
			if err := parseSummary(v, ev.Scalars); err != nil {
				return ev, err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return ev, errors.New("bad field")
			}
			b = b[n:]
		}
	}
	return ev, nil
}

func parseSummary(b []byte, into map[string]float32) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errors.New("bad summary tag")
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errors.New("bad summary field")
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errors.New("bad summary value")
		}
		b = b[n:]
		var tag string
		var val float32
		have := false // a float scalar: other summaries (images, text) are skipped
		for len(v) > 0 {
			num, typ, n := protowire.ConsumeTag(v)
			if n < 0 {
				return errors.New("bad value tag")
			}
			v = v[n:]
			switch {
			case num == 1 && typ == protowire.BytesType:
				s, n := protowire.ConsumeString(v)
				if n < 0 {
					return errors.New("bad value tag string")
				}
				tag, v = s, v[n:]
			case num == 2 && typ == protowire.Fixed32Type:
				x, n := protowire.ConsumeFixed32(v)
				if n < 0 {
					return errors.New("bad simple_value")
				}
				val, v, have = math.Float32frombits(x), v[n:], true
			case num == 8 && typ == protowire.BytesType: // tensor: how TF2's tf.summary.scalar writes
				b, n := protowire.ConsumeBytes(v)
				if n < 0 {
					return errors.New("bad tensor")
				}
				val, have = tensorScalar(b)
				v = v[n:]
			default:
				n := protowire.ConsumeFieldValue(num, typ, v)
				if n < 0 {
					return errors.New("bad value field")
				}
				v = v[n:]
			}
		}
		if have {
			into[tag] = val
		}
	}
	return nil
}

// tensorScalar decodes a scalar tensorflow.TensorProto of dtype DT_FLOAT
// (1) or DT_DOUBLE (2), held in tensor_content (field 4) or in
// float_val/double_val (fields 5 and 6, packed or not). It reports false
// for any other tensor.
func tensorScalar(b []byte) (float32, bool) {
	var dtype uint64
	var content []byte
	var val float32
	found := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			dtype, n = protowire.ConsumeVarint(b)
		case num == 4 && typ == protowire.BytesType:
			content, n = protowire.ConsumeBytes(b)
		case num == 5 && typ == protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			val, found = math.Float32frombits(x), true
		case num == 5 && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			if len(p) == 4 {
				val, found = math.Float32frombits(binary.LittleEndian.Uint32(p)), true
			}
		case num == 6 && typ == protowire.Fixed64Type:
			var x uint64
			x, n = protowire.ConsumeFixed64(b)
			val, found = float32(math.Float64frombits(x)), true
		case num == 6 && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			if len(p) == 8 {
				val, found = float32(math.Float64frombits(binary.LittleEndian.Uint64(p))), true
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	switch {
	case found:
		return val, true
	case dtype == 1 && len(content) == 4:
		return math.Float32frombits(binary.LittleEndian.Uint32(content)), true
	case dtype == 2 && len(content) == 8:
		return float32(math.Float64frombits(binary.LittleEndian.Uint64(content))), true
	}
	return 0, false
}
