package fusion

import (
	"fmt"
	"strings"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/metrics"
)

// ParseWire reads the gradients' type on the wire as nmt-train's
// --compression names it: none (float32, as they are; also "", fp32,
// float32), fp16 (float16, half) or bf16 (bfloat16), the last two rounded on
// the wire to half the bytes.
func ParseWire(s string) (dtype.DType, error) {
	switch strings.ToLower(s) {
	case "none", "", "fp32", "float32":
		return dtype.Float32, nil
	case "fp16", "float16", "half":
		return dtype.Float16, nil
	case "bf16", "bfloat16":
		return dtype.BFloat16, nil
	}
	return 0, fmt.Errorf("unknown compression %q (want none, fp16 or bf16)", s)
}

// wireName is the --compression name of wire type d, as ParseWire reads it.
func wireName(d dtype.DType) string {
	switch d {
	case dtype.Float16:
		return "fp16"
	case dtype.BFloat16:
		return "bf16"
	}
	return "none"
}

// ParamInfo describes one parameter's gradient: a name for messages and
// its length in float32 elements.
type ParamInfo struct {
	Name string
	Len  int
	// Rows and Cols give the gradient as a Rows x Cols row-major matrix
	// (Rows*Cols = Len), which BucketConfig.PowerSGD may compress; 0 for a
	// vector, or for a matrix that must travel uncompressed.
	Rows, Cols int
}

// Defaults of BucketConfig.
const (
	DefaultBucketCap      = 25 << 20 // bytes of float32 gradients (PyTorch DDP's bucket_cap_mb)
	DefaultFirstBucketCap = 1 << 20  // a small first bucket starts communication early
	DefaultReadyTimeout   = 5 * time.Minute
)

// BucketConfig tunes a Bucketer. The zero value means the defaults: 25 MiB
// buckets after a 1 MiB first one, float32 on the wire, sum (no average),
// one backward pass per step.
type BucketConfig struct {
	// CapBytes: a bucket is closed as soon as it holds this many bytes of
	// float32 gradients (default 25 MiB), so it overshoots by less than its
	// last parameter. A parameter of CapBytes or more gets a bucket of its
	// own.
	CapBytes int
	// FirstCapBytes is the first bucket's cap (default 1 MiB).
	FirstCapBytes int
	// Wire is the gradients' type on the wire: collective.Float16 or
	// BFloat16 round them to half the bytes; Float32 (or zero) sends them
	// as they are.
	Wire dtype.DType
	// CycleTime, if positive, rebuilds the buckets once, after the first
	// step, from rank 0's measured readiness times: a bucket is also closed
	// when the next gradient became ready more than CycleTime after the
	// bucket's first one (Horovod's HOROVOD_CYCLE_TIME, made deterministic:
	// rank 0 broadcasts the new layout, so every rank switches to the same
	// buckets at the same step).
	CycleTime time.Duration
	// BackwardPassesPerStep k: gradients are accumulated by the caller over
	// k backward passes and only the k-th communicates (default 1).
	BackwardPassesPerStep int
	// Average divides the sums by the world size (the Average reduction);
	// the scale set by SetScale applies on top.
	Average bool
	// Timeout bounds how long Wait and WaitBucket wait for gradients that
	// were never marked ready (default 5 minutes); the error names them.
	// Peers that stop answering are the communicator's business (its
	// Timeout and the transport's).
	Timeout time.Duration
	// Timeline, if not nil, records each bucket's pack, allreduce and
	// unpack (on a device: copy out, allreduce, check, copy in).
	Timeline *metrics.Timeline
	// PowerSGD, if not nil, compresses the weight matrices (ParamInfo.Rows
	// and Cols) from its StartStep on; the other gradients keep
	// Wire. Host gradients need AttachFlat (not Attach).
	PowerSGD *PowerSGD
}

// withDefaults fills in the zero fields of cfg.
func (cfg BucketConfig) withDefaults() BucketConfig {
	if cfg.CapBytes == 0 {
		cfg.CapBytes = DefaultBucketCap
	}
	if cfg.FirstCapBytes == 0 {
		cfg.FirstCapBytes = DefaultFirstBucketCap
	}
	if cfg.BackwardPassesPerStep == 0 {
		cfg.BackwardPassesPerStep = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultReadyTimeout
	}
	return cfg
}
