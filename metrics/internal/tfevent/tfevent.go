// Package tfevent decodes the records of TensorBoard's event files (TFRecord
// files of tensorflow.Event protos) as far as package metrics reads them
// back: the framing's masked CRC32C and the fields of a scalar event,
// decoded with protowire.
package tfevent

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is the masked CRC32C that TFRecord frames a record's length
// and data with.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// Event is a decoded scalar event.
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	Scalars     map[string]float32
}

// Parse decodes the data of one record of an event file: its wall time,
// step, file version and float scalars (simple_value or a scalar
// tensor; other summaries are skipped).
func Parse(b []byte) (Event, error) {
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
