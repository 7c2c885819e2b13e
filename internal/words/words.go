// Package words holds the small pieces of English that messages and
// reports share.
package words

import "strconv"

// Plural writes n things: "1 rank", "2 ranks".
func Plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}
