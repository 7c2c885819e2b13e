package train

import (
	"strings"
	"testing"
)

func TestSettingsDiffer(t *testing.T) {
	ss := []setting{{"--preset", "tiny"}, {"--learning-rate", "2"}, {"--seed", "1"}}
	per := []map[string]string{
		{"--preset": "tiny", "--learning-rate": "2", "--seed": "1"},
		{"--preset": "tiny", "--learning-rate": "1", "--seed": "2"},
		{"--preset": "tiny", "--learning-rate": "2", "--seed": "1"},
		{"--preset": "tiny", "--learning-rate": "3", "--seed": "1"},
	}
	err := settingsDiffer(ss, per)
	want := "settings differ between ranks: --learning-rate is 2 on ranks 0, 2, 1 on rank 1 and 3 on rank 3"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
	// encode/decode round trip
	m := decodeSettings(encodeSettings(ss))
	for _, s := range ss {
		if m[s.name] != s.value {
			t.Fatalf("%s: %q, want %q", s.name, m[s.name], s.value)
		}
	}
}
