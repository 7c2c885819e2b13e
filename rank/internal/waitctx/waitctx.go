// Package waitctx carries one call's wait timeout in its context: what
// rank.WithTimeout sets, and what the transports read (rank's own, and
// rank/ranktest's in-memory one).
package waitctx

import (
	"context"
	"time"
)

type key struct{}

// With returns a context that carries d; d <= 0 leaves ctx unchanged.
func With(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, key{}, d)
}

// From is the wait timeout ctx carries, else def.
func From(ctx context.Context, def time.Duration) time.Duration {
	if d, ok := ctx.Value(key{}).(time.Duration); ok {
		return d
	}
	return def
}
