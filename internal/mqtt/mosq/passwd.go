// Package mosq reads mosquitto's password file (mosquitto_passwd) and ACL
// file (acl_file) formats, so that one pair of files serves both the
// embedded broker and a mosquitto (docs/config.md, "The embedded
// broker"). It is pure: no broker, no I/O beyond the bytes given.
package mosq

import (
	"bufio"
	"bytes"
	"crypto/pbkdf2"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// maxIterations bounds a $7$ hash's PBKDF2 iterations (mosquitto_passwd
// writes 101): a file cannot make each CONNECT cost seconds.
const maxIterations = 1 << 20

// Passwords is a parsed mosquitto password file.
type Passwords struct {
	users map[string]hash
}

type hash struct {
	kind       byte // '6' or '7'
	iterations int
	salt, sum  []byte
}

// ParsePasswords reads a password file as mosquitto_passwd writes it: one
// "username:hash" per line, hash "$7$ITERATIONS$SALT$HASH" (PBKDF2 with
// SHA-512, what mosquitto 2.0 writes) or "$6$SALT$HASH" (salted SHA-512, of
// mosquitto 1.x), SALT and HASH in base64. Empty lines and lines starting
// with '#' are skipped. A plain-text password or another hash (argon2id
// of mosquitto 2.1) is an error naming the line.
func ParsePasswords(b []byte) (*Passwords, error) {
	p := &Passwords{users: map[string]hash{}}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, h, ok := strings.Cut(line, ":")
		if !ok || user == "" {
			return nil, fmt.Errorf("%w: line %d: want username:hash", ErrFormat, n)
		}
		if _, dup := p.users[user]; dup {
			return nil, fmt.Errorf("%w: line %d: user %q appears twice", ErrFormat, n, user)
		}
		parsed, err := parseHash(h)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d (user %q): %v", ErrFormat, n, user, err)
		}
		p.users[user] = parsed
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return p, nil
}

func parseHash(s string) (hash, error) {
	f := strings.Split(s, "$")
	// "$7$101$salt$hash" splits into "", "7", "101", "salt", "hash".
	if len(f) < 4 || f[0] != "" {
		return hash{}, errors.New("not a mosquitto_passwd hash ($7$... or $6$...); run mosquitto_passwd -U on a plain-text file")
	}
	h := hash{}
	var salt, sum string
	switch {
	case f[1] == "7" && len(f) == 5:
		it, err := strconv.Atoi(f[2])
		if err != nil || it < 1 || it > maxIterations {
			return hash{}, fmt.Errorf("iterations %q: want 1 to %d", f[2], maxIterations)
		}
		h.kind, h.iterations, salt, sum = '7', it, f[3], f[4]
	case f[1] == "6" && len(f) == 4:
		h.kind, salt, sum = '6', f[2], f[3]
	default:
		return hash{}, fmt.Errorf("hash type $%s$ is not supported (only $7$ and $6$)", f[1])
	}
	var err error
	if h.salt, err = base64.StdEncoding.DecodeString(salt); err != nil || len(h.salt) == 0 {
		return hash{}, errors.New("salt is not base64")
	}
	if h.sum, err = base64.StdEncoding.DecodeString(sum); err != nil || len(h.sum) != sha512.Size {
		return hash{}, errors.New("hash is not 64 bytes of base64")
	}
	return h, nil
}

// Users is how many users the file holds.
func (p *Passwords) Users() int { return len(p.users) }

// Check reports whether password is user's.
func (p *Passwords) Check(user string, password []byte) bool {
	h, ok := p.users[user]
	if !ok {
		return false
	}
	var sum []byte
	switch h.kind {
	case '7':
		var err error
		if sum, err = pbkdf2.Key(sha512.New, string(password), h.salt, h.iterations, sha512.Size); err != nil {
			return false
		}
	case '6':
		s := sha512.New()
		s.Write(password)
		s.Write(h.salt)
		sum = s.Sum(nil)
	}
	return subtle.ConstantTimeCompare(sum, h.sum) == 1
}
