package collective

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// goid is the running goroutine's number, from its stack trace's header.
func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	return string(bytes.Fields(b)[1])
}

// TestSpawnRunsEachOnceAndReuses: functions spawned at once, more than
// maxIdle, each run exactly once; afterwards at most maxIdle workers
// wait; and a function spawned while a worker waits runs on that
// worker's goroutine (one of 100 tries at least: the worker may not
// have reached its wait when the spawn looks).
func TestSpawnRunsEachOnceAndReuses(t *testing.T) {
	const n = 3 * maxIdle
	var ran [n]atomic.Int32
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := range n {
		wg.Add(1)
		spawn(func() {
			defer wg.Done()
			<-release
			ran[i].Add(1)
			mu.Lock()
			seen[goid()] = true
			mu.Unlock()
		})
	}
	close(release)
	wg.Wait()
	for i := range n {
		if got := ran[i].Load(); got != 1 {
			t.Fatalf("function %d ran %d times", i, got)
		}
	}
	for idle.Load() > maxIdle {
		t.Fatalf("%d workers wait, at most %d may", idle.Load(), maxIdle)
	}

	reused := 0
	for range 100 {
		for idle.Load() == 0 {
			runtime.Gosched()
		}
		runtime.Gosched()
		done := make(chan string)
		spawn(func() { done <- goid() })
		id := <-done
		if seen[id] {
			reused++
		}
		seen[id] = true
	}
	if reused == 0 {
		t.Fatal("no spawned function ran on a waiting worker's goroutine in 100 tries")
	}
}
