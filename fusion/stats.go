package fusion

import (
	"fmt"
	"time"
)

// BucketStats is what happened to one bucket in one step.
type BucketStats struct {
	Index, Params, Bytes int
	// Ready: its last gradient was marked. Launch: its turn came (the
	// buckets before it were launched). Start: the allreduce began (the
	// previous one finished). Reduced: the allreduce finished. End: the
	// result was unpacked into the gradients (AttachDevice: checked in host
	// memory, ready for the copy back that Wait or WaitBucket queues).
	Ready, Launch, Start, Reduced, End time.Time
	Overflow                           bool
}

// StepStats summarises one step.
type StepStats struct {
	// Reduced is false for the backward passes of a step that only
	// accumulate (BackwardPassesPerStep > 1): nothing was communicated and
	// the optimizer should not run.
	Reduced bool
	Buckets []BucketStats
	// BytesSent and BytesRecv: the transport's counters (all peers)
	// between the first launch and the last bucket's end.
	BytesSent, BytesRecv uint64
	// CommTime is the time during which at least one bucket was being
	// packed, reduced or unpacked.
	CommTime time.Duration
	// Exposed is the time from BackwardDone to the last bucket's end.
	Exposed time.Duration
	// Hidden is 1 - Exposed/CommTime, clamped to [0, 1]: the part of the
	// communication that overlapped the backward pass.
	Hidden float64
	// BackwardDone is when BackwardDone (or Wait) was called.
	BackwardDone time.Time
	// Overflow: an inf or NaN in the reduced (and scaled) gradients.
	Overflow bool
	// PowerSGD: what the compressor did (BucketConfig.PowerSGD).
	PowerSGD PowerSGDStats
}

// String is a one-line summary for logs.
func (s StepStats) String() string {
	if !s.Reduced {
		return "accumulated (no communication)"
	}
	o := ""
	if s.Overflow {
		o = ", overflow"
	}
	return fmt.Sprintf("%d buckets, sent %.1f MB, recv %.1f MB, comm %v, exposed %v (%.0f%% hidden)%s",
		len(s.Buckets), float64(s.BytesSent)/1e6, float64(s.BytesRecv)/1e6,
		s.CommTime.Round(time.Millisecond), s.Exposed.Round(time.Millisecond), 100*s.Hidden, o)
}

func (b *Bucketer) traffic() (sent, recv uint64) {
	for _, p := range b.c.Transport().Stats() {
		sent += p.BytesSent
		recv += p.BytesRecv
	}
	return
}
