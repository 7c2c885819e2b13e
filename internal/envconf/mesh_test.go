package envconf

import (
	"reflect"
	"testing"
	"time"

	"github.com/gorun/gorun/rank"
)

// Every mesh variable reaches its rank.Options field; a field the program
// sets wins and its variable is not read (not even checked); a malformed
// one is an error naming it, worded as rank.Connect worded it.
func TestMesh(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		opt  rank.Options
		want rank.Options
		err  string
	}{
		{env: nil},
		{env: map[string]string{rank.EnvTransport: "tcp", rank.EnvIface: "eth*", rank.EnvTCPCipher: "aes-gcm", rank.EnvQUICGRO: "off"},
			want: rank.Options{Transport: "tcp", Iface: "eth*", TCPCipher: "aes-gcm", QUICGRO: "off"}},
		// checked by rank.Connect, which names the variable
		{env: map[string]string{rank.EnvTransport: "udp"}, want: rank.Options{Transport: "udp"}},
		{env: map[string]string{rank.EnvTransport: "tcp"}, opt: rank.Options{Transport: "quic"}, want: rank.Options{Transport: "quic"}},
		{env: map[string]string{rank.EnvPortRange: "29500-29503"}, want: rank.Options{Ports: rank.PortRange{Lo: 29500, Hi: 29503}}},
		{env: map[string]string{rank.EnvPortRange: "29500-29503"}, opt: rank.Options{Ports: rank.PortRange{Lo: 7, Hi: 8}},
			want: rank.Options{Ports: rank.PortRange{Lo: 7, Hi: 8}}},
		{env: map[string]string{rank.EnvPortRange: "29503-29500"}, err: `GORUN_PORT_RANGE="29503-29500": 29503 is above 29500 (want LO-HI with LO <= HI)`},
		{env: map[string]string{rank.EnvConns: "4"}, want: rank.Options{ConnsPerPeer: 4}},
		{env: map[string]string{rank.EnvConns: "65"}, err: `GORUN_CONNS_PER_PEER="65": want an integer from 1 to 64`},
		{env: map[string]string{rank.EnvConns: "x"}, opt: rank.Options{ConnsPerPeer: 1}, want: rank.Options{ConnsPerPeer: 1}},
		{env: map[string]string{rank.EnvTimeout: "90s"}, want: rank.Options{Timeout: 90 * time.Second}},
		{env: map[string]string{rank.EnvTimeout: "-1s"}, err: `GORUN_TIMEOUT="-1s": want a positive Go duration such as 60s`},
		{env: map[string]string{rank.EnvTimeout: "soon"}, opt: rank.Options{Timeout: time.Minute}, want: rank.Options{Timeout: time.Minute}},
		{env: map[string]string{rank.EnvShm: "0"}, want: rank.Options{SharedMemory: "off"}},
		{env: map[string]string{rank.EnvShm: " Off "}, want: rank.Options{SharedMemory: "off"}},
		{env: map[string]string{rank.EnvShm: "1"}},
		{env: map[string]string{rank.EnvShm: "0"}, opt: rank.Options{SharedMemory: "on"}, want: rank.Options{SharedMemory: "on"}},
		{env: map[string]string{rank.EnvShm: "0"}, opt: rank.Options{SharedMemory: "auto"}, want: rank.Options{SharedMemory: "off"}},
		{env: map[string]string{rank.EnvShm: "maybe"}, err: `GORUN_SHM="maybe": want on or off (1 or 0)`},
		{env: map[string]string{rank.EnvShm: "maybe"}, opt: rank.Options{SharedMemory: "off"}, want: rank.Options{SharedMemory: "off"}},
		{env: map[string]string{rank.EnvShmGroup: "0", ShmCMA: "1", ShmDir: "/tmp/shm"}, want: rank.Options{NoGroup: true, SingleCopy: true, ShmDir: "/tmp/shm"}},
		{env: map[string]string{rank.EnvShmGroup: "1", ShmCMA: "0"}},
	} {
		got, err := Mesh(lookup(c.env), c.opt)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%v: error %v, want %q", c.env, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v over %+v: %+v, %v; want %+v", c.env, c.opt, got, err, c.want)
		}
	}
}
