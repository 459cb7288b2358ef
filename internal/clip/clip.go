// Package clip shortens untrusted text (a topic, a device name, a JSON
// value) for a log line or an error reason.
//
// The controller's packages (wire, wire/jws) and firmware-sim import
// nothing of the agent's and keep their own copy.
package clip

import "unicode/utf8"

// String returns s if it is at most n bytes long, or else its first n
// bytes, shortened further so as never to split a UTF-8 rune, followed by
// "...".
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n, 0)
	// Back up to the start of the rune that crosses the cut (at most
	// utf8.UTFMax-1 bytes: invalid UTF-8 is cut where it is).
	for i := cut; i >= 0 && i >= cut-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(s[i]) {
			cut = i
			break
		}
	}
	return s[:cut] + "..."
}

// Bytes is String for a byte slice (a raw JSON value).
func Bytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return String(string(b[:min(len(b), n+utf8.UTFMax)]), n)
}
