package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 4, ""},
		{"abcd", 4, "abcd"},
		{"abcde", 4, "abcd..."},
		{"abcdé", 4, "abcd..."}, // é starts at byte 4: cut before it
		{"abcé", 4, "abc..."},   // é is bytes 3-4: never split
		{"ab€x", 4, "ab..."},    // € is bytes 2-4
		{"a😀bc", 3, "a..."},     // a 4-byte rune across the cut
		{"a😀bc", 5, "a😀..."},    // it fits
		{"\x80\x80\x80\x80\x80\x80", 4, "\x80\x80\x80\x80..."}, // invalid UTF-8 is cut where it is
		{"abc", 0, "..."},
		{"😀abc", 2, "..."},
		{"0é00000ö0000€😀", 20, "0é00000ö0000€..."},
	} {
		if got := String(tt.in, tt.n); got != tt.want {
			t.Errorf("String(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
		if got := Bytes([]byte(tt.in), tt.n); got != tt.want {
			t.Errorf("Bytes(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// Whatever the text and the cut, a valid UTF-8 input gives a valid UTF-8
// output of at most n bytes plus "...".
func FuzzString(f *testing.F) {
	f.Add("héllo wörld €😀", 7)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n = n % 200
		if n < 0 {
			n = -n
		}
		got := String(s, n)
		if len(s) <= n {
			if got != s {
				t.Fatalf("String(%q, %d) = %q, want it unchanged", s, n, got)
			}
			return
		}
		head, ok := strings.CutSuffix(got, "...")
		if !ok || len(head) > n || !strings.HasPrefix(s, head) {
			t.Fatalf("String(%q, %d) = %q", s, n, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(head) {
			t.Fatalf("String(%q, %d) = %q splits a rune", s, n, got)
		}
	})
}
