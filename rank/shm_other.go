//go:build !linux

package rank

import (
	"context"
	"sync/atomic"
)

// Shared memory is implemented on Linux only; elsewhere every peer uses
// sockets.

// shmPeer is never made here (Mesh.shmPeer returns nil); pid is what the
// liveness check in stall.go reads of one on Linux.
type shmPeer struct{ pid int }

func (m *Mesh) setupShm(ctx context.Context) error { return nil }
func (m *Mesh) closeShm()                          {}

func (sp *shmPeer) alive() bool { return true }

func (sp *shmPeer) send(ctx context.Context, ch int, tag Tag, payload []byte, more bool) error {
	panic("unreachable")
}

func (sp *shmPeer) recv(ctx context.Context, ch int, want Tag, dst []byte) error {
	panic("unreachable")
}

// LocalGroup is the host's group segment (Linux only; see shmgroup.go).
type LocalGroup struct{}

// GroupWords and GroupSlotBytes as on Linux.
const (
	GroupWords     = 15
	GroupSlotBytes = 2 << 20
)

// LocalGroup: never one off Linux.
func (m *Mesh) LocalGroup(ctx context.Context) (*LocalGroup, error) { return nil, nil }
func (m *Mesh) closeGroup()                                         {}

func (g *LocalGroup) Size() int                    { return 0 }
func (g *LocalGroup) Index() int                   { return 0 }
func (g *LocalGroup) Ranks() []int                 { return nil }
func (g *LocalGroup) Word(i, k int) *atomic.Uint64 { panic("unreachable") }
func (g *LocalGroup) Slot(i int) []byte            { panic("unreachable") }
func (g *LocalGroup) Claim() int                   { return 0 }
func (g *LocalGroup) Count(i, sent, recv int)      {}
func (g *LocalGroup) Enter() error                 { return errClosed }
func (g *LocalGroup) Leave()                       {}
func (g *LocalGroup) Wait(ctx context.Context, i int, cond func() bool, check func() error) error {
	return errClosed
}
