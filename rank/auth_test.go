package rank

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

func secretBytes(t *testing.T) []byte {
	b, err := hex.DecodeString(NewSecret())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A dialer holding a different secret (or no certificate at all) cannot
// complete a handshake with the rendezvous or with a rank, and the job goes
// on for the legitimate ranks.
func TestStrangerCannotHandshake(t *testing.T) {
	secret := secretBytes(t)
	rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()

	// 1. A stranger with its own job CA tries to register as rank 1.
	other, err := newJobAuth(secretBytes(t), rankLabel(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = register(ctx, rdv.Addr(), other, registration{Rank: 1, Size: 2, Addr: "quic://127.0.0.1:1"}, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("stranger registered or got an unclear error: %v", err)
	}
	// 2. A client with no certificate at all.
	noCert := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPN}}
	if c, err := quic.DialAddr(ctx, rdv.Addr(), noCert, quicConfig(3*time.Second)); err == nil {
		// The server must refuse it: no stream can be used.
		st, err := c.OpenStreamSync(ctx)
		if err == nil {
			st.Write([]byte("{}\n"))
			buf := make([]byte, 10)
			st.SetReadDeadline(time.Now().Add(2 * time.Second))
			if n, err := st.Read(buf); err == nil && n > 0 {
				t.Fatalf("a client without a certificate got an answer: %q", buf[:n])
			}
		}
	}
	// 3. The legitimate ranks still form the job.
	var wg sync.WaitGroup
	meshes := make([]*Mesh, 2)
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			meshes[r], errs[r] = Connect(context.Background(), Identity{Rank: r, Size: 2, Rendezvous: rdv.Addr(), Secret: secret, Launcher: "gorun"}, Options{Timeout: 10 * time.Second})
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer closeAll([]Transport{meshes[0], meshes[1]})
	// 4. The stranger dials rank 1's mesh directly and is refused.
	addr := strings.TrimPrefix(meshes[0].addrs[1], "quic://")
	_, err = quic.DialAddr(ctx, addr, other.clientTLS(), quicConfig(3*time.Second))
	if err == nil {
		t.Fatal("stranger completed a handshake with rank 1")
	}
	// ...and the job still works.
	go meshes[0].Send(context.Background(), 1, 0, Tag{Seq: 1}, []byte("ok"))
	b := make([]byte, 2)
	if err := meshes[1].Recv(context.Background(), 0, 0, Tag{Seq: 1}, b); err != nil || string(b) != "ok" {
		t.Fatalf("job broken after a stranger's attempt: %v", err)
	}
}

func TestRendezvousTimeoutNamesMissingRanks(t *testing.T) {
	secret := secretBytes(t)
	rdv, err := ListenRendezvous("127.0.0.1:0", 3, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	_, err = Connect(context.Background(), Identity{Rank: 1, Size: 3, Rendezvous: rdv.Addr(), Secret: secret, Launcher: "gorun"}, Options{Timeout: 2500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "ranks 0, 2") {
		t.Fatalf("want an error naming ranks 0 and 2, got %v", err)
	}
}

// A rank stopped while it waits at the rendezvous (the launcher stopping
// the job) says so, not that its timeout passed.
func TestRendezvousWaitStopped(t *testing.T) {
	secret := secretBytes(t)
	rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	for _, c := range []struct{ addr, want string }{
		{rdv.Addr(), "stopped while waiting for rank 1 to register"},
		{"127.0.0.1:9", "127.0.0.1:9: stopped while waiting for it to answer"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		_, err = Connect(ctx, Identity{Rank: 0, Size: 2, Rendezvous: c.addr, Secret: secret, Launcher: "gorun"}, Options{Timeout: time.Minute})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "1m0s") {
			t.Errorf("rendezvous %s: want an error with %q, got %v", c.addr, c.want, err)
		}
	}
}

func TestRendezvousThatNeverAnswers(t *testing.T) {
	start := time.Now()
	_, err := Connect(context.Background(), Identity{Rank: 1, Size: 2, Rendezvous: "127.0.0.1:9", Secret: secretBytes(t), Launcher: "gorun"}, Options{Timeout: 1500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:9 did not answer") {
		t.Fatalf("want an error naming the rendezvous, got %v", err)
	}
	if time.Since(start) > 6*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

func TestCACertIsDeterministic(t *testing.T) {
	s := secretBytes(t)
	_, a, err := deriveCA(s)
	if err != nil {
		t.Fatal(err)
	}
	_, b, _ := deriveCA(s)
	_, c, _ := deriveCA(secretBytes(t))
	if string(a.Raw) != string(b.Raw) {
		t.Error("same secret, different CA")
	}
	if string(a.Raw) == string(c.Raw) {
		t.Error("different secrets, same CA")
	}
}
