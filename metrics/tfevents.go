// Package metrics records what a training run measures: metrics.jsonl,
// TensorBoard event files, run.json and the Chrome-trace Timeline, and
// reads back what it recorded. Package report analyses a run directory.
package metrics

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/gorun/gorun/internal/atomicfile"
	"github.com/gorun/gorun/metrics/internal/tfevent"
	"google.golang.org/protobuf/encoding/protowire"
)

// TensorBoard reads TFRecord files of tensorflow.Event protos. No maintained
// Go library writes them without pulling in TensorFlow's generated protos, so
// the few fields a scalar needs are encoded here with protowire.

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
	binary.LittleEndian.PutUint32(hdr[8:], tfevent.MaskedCRC(hdr[:8]))
	var foot [4]byte
	binary.LittleEndian.PutUint32(foot[:], tfevent.MaskedCRC(data))
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
		if len(rest) < 12 || tfevent.MaskedCRC(rest[:8]) != binary.LittleEndian.Uint32(rest[8:12]) {
			cut = true
			break
		}
		ln := binary.LittleEndian.Uint64(rest[:8])
		if len(rest) < 16 || ln > uint64(len(rest)-16) {
			cut = true
			break
		}
		data := rest[12 : 12+ln]
		if tfevent.MaskedCRC(data) != binary.LittleEndian.Uint32(rest[12+ln:16+ln]) {
			cut = true
			break
		}
		ev, err := tfevent.Parse(data)
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
