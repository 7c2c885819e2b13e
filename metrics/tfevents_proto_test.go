package metrics

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"testing"

	"github.com/gorun/gorun/metrics/metricstest"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// tensorboardEvent is tensorboard.Event as TensorBoard's own data server
// knows it: built from the FileDescriptorSet in its repository
// (testdata/upstream/descriptor.bin), not from our field numbers.
func tensorboardEvent(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(upstream(t, "descriptor.bin"), &set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName("tensorboard.Event")
	if err != nil {
		t.Fatal(err)
	}
	return d.(protoreflect.MessageDescriptor)
}

// decodeEvents splits an event file into records (ReadEvents has
// checked the framing) and decodes each with TensorBoard's descriptors,
// returned as protojson's view of it.
func decodeEvents(t *testing.T, path string) []map[string]any {
	t.Helper()
	if _, err := metricstest.ReadEvents(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	md := tensorboardEvent(t)
	var out []map[string]any
	for len(b) > 0 {
		n := binary.LittleEndian.Uint64(b)
		msg := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(b[12:12+n], msg); err != nil {
			t.Fatal(err)
		}
		js, err := protojson.MarshalOptions{Resolver: protoregistry.GlobalTypes}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		b = b[12+n+4:]
	}
	return out
}

// TestEventsDecodeWithTensorBoardProtos: scalars, text summaries and the
// hparams session start, as TensorBoard's protos read them.
func TestEventsDecodeWithTensorBoardProtos(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Log("eval", 250, map[string]float64{"bleu": 86.5}, map[string]string{"sample_0": "ein Haus => a house (ref: a house)"}); err != nil {
		t.Fatal(err)
	}
	ri := RunInfo{Preset: "tiny", WorldSize: 2, Hosts: []string{"a", "b"}, LearningRate: 2, Dataset: Dataset{Name: "wmt16"}}
	if err := r.HParams(ri); err != nil {
		t.Fatal(err)
	}
	events := r.events.path
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	evs := decodeEvents(t, events)
	if len(evs) != 4 {
		t.Fatalf("%d events, want file_version, scalars, text, hparams: %v", len(evs), evs)
	}
	if evs[0]["fileVersion"] != "brain.Event:2" {
		t.Errorf("first event %v", evs[0])
	}
	value := func(ev map[string]any) map[string]any {
		vs, _ := ev["summary"].(map[string]any)["value"].([]any)
		if len(vs) != 1 {
			t.Fatalf("event %v: want one summary value", ev)
		}
		return vs[0].(map[string]any)
	}
	if v := value(evs[1]); v["tag"] != "eval/bleu" || v["simpleValue"] != 86.5 || evs[1]["step"] != "250" {
		t.Errorf("scalar event %v", evs[1])
	}

	text := value(evs[2])
	tensor, _ := text["tensor"].(map[string]any)
	plugin := text["metadata"].(map[string]any)["pluginData"].(map[string]any)["pluginName"]
	if text["tag"] != "eval/sample_0" || plugin != "text" || tensor["dtype"] != "DT_STRING" || evs[2]["step"] != "250" {
		t.Errorf("text event %v", evs[2])
	}
	if sv, _ := tensor["stringVal"].([]any); len(sv) != 1 || sv[0] != "ZWluIEhhdXMgPT4gYSBob3VzZSAocmVmOiBhIGhvdXNlKQ==" { // base64 of the sample
		t.Errorf("text tensor %v", tensor)
	}

	hp := value(evs[3])
	pd := hp["metadata"].(map[string]any)["pluginData"].(map[string]any)
	if hp["tag"] != "_hparams_/session_start_info" || pd["pluginName"] != "hparams" {
		t.Fatalf("hparams event %v", evs[3])
	}
	var content []byte
	if err := json.Unmarshal([]byte(`"`+pd["content"].(string)+`"`), &content); err != nil {
		t.Fatal(err)
	}
	got := sessionStartHParams(t, content)
	for k, want := range map[string]any{"preset": "tiny", "world_size": 2.0, "hosts": "a,b", "learning_rate": 2.0, "dataset.name": "wmt16"} {
		if got[k] != want {
			t.Errorf("hparam %s = %v (%T), want %v", k, got[k], got[k], want)
		}
	}
}

// sessionStartHParams decodes HParamsPluginData{session_start_info (3):
// {hparams (1): map<string, google.protobuf.Value>}} (the plugin's
// plugin_data.proto, not in descriptor.bin); each Value is decoded by
// structpb.
func sessionStartHParams(t *testing.T, content []byte) map[string]any {
	t.Helper()
	field := func(b []byte, want protowire.Number) [][]byte {
		var out [][]byte
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				t.Fatal("bad tag")
			}
			b = b[n:]
			if num == want && typ == protowire.BytesType {
				v, n := protowire.ConsumeBytes(b)
				out = append(out, v)
				b = b[n:]
				continue
			}
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
		}
		return out
	}
	start := field(content, 3)
	if len(start) != 1 {
		t.Fatalf("no session_start_info in %x", content)
	}
	got := map[string]any{}
	for _, entry := range field(start[0], 1) {
		k, v := field(entry, 1), field(entry, 2)
		var val structpb.Value
		if len(k) != 1 || len(v) != 1 || proto.Unmarshal(v[0], &val) != nil {
			t.Fatalf("bad hparams entry %x", entry)
		}
		got[string(k[0])] = val.AsInterface()
	}
	return got
}
