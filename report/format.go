package report

import (
	"fmt"
	"math"
	"strings"
	"time"
)

func fmtNum(v float64, f string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf(f, v)
}

// fmtDur prints seconds as a duration to the second (to the millisecond
// below 10 s).
func fmtDur(sec float64) string {
	d := time.Duration(sec * 1e9)
	if d < 10*time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// UniqueHosts returns the distinct names of s in first-seen order
// ("localhost" for none).
func UniqueHosts(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return []string{"localhost"}
	}
	return out
}

func orStr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Commas formats n with thousands separators (1,234,567).
func Commas[T int64 | int](n T) string {
	s := fmt.Sprint(int64(n))
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
