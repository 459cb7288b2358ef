package mosq

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// Access is what an ACL line grants.
type Access int

// The access kinds of an acl_file line (mosquitto 2.0).
const (
	Read      Access = 1 << iota // receive messages, subscribe
	Write                        // publish
	Deny                         // neither, whatever else grants it
	ReadWrite = Read | Write
)

type rule struct {
	access  Access
	topic   string
	pattern bool // %u and %c are substituted
}

// ACL is a parsed mosquitto acl_file.
type ACL struct {
	anonymous []rule            // topic lines before any user line
	users     map[string][]rule // topic lines after "user NAME"
	patterns  []rule            // pattern lines: every client
}

// ParseACL reads mosquitto's acl_file format:
//
//	# comment
//	topic [read|write|readwrite|deny] TOPIC     (anonymous clients, before any user line)
//	user USERNAME
//	topic [read|write|readwrite|deny] TOPIC     (that user)
//	pattern [read|write|readwrite|deny] TOPIC   (every client; %u is its username, %c its client ID)
//
// The access defaults to readwrite; TOPIC may hold the wildcards + and #
// and runs to the end of the line. Anything else is an error naming the
// line.
func ParseACL(b []byte) (*ACL, error) {
	a := &ACL{users: map[string][]rule{}}
	user, inUser := "", false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kw, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch kw {
		case "user":
			if rest == "" {
				return nil, fmt.Errorf("%w: line %d: user needs a name", ErrFormat, n)
			}
			user, inUser = rest, true
			continue
		case "topic", "pattern":
		default:
			return nil, fmt.Errorf("%w: line %d: %q: want topic, pattern or user", ErrFormat, n, kw)
		}
		r := rule{access: ReadWrite, pattern: kw == "pattern"}
		first, after, _ := strings.Cut(rest, " ")
		switch first {
		case "read":
			r.access, rest = Read, after
		case "write":
			r.access, rest = Write, after
		case "readwrite":
			r.access, rest = ReadWrite, after
		case "deny":
			r.access, rest = Deny, after
		}
		r.topic = strings.TrimSpace(rest)
		if r.topic == "" {
			return nil, fmt.Errorf("%w: line %d: %s needs a topic", ErrFormat, n, kw)
		}
		if !validFilter(r.topic) {
			return nil, fmt.Errorf("%w: line %d: %q is not a valid topic filter", ErrFormat, n, r.topic)
		}
		switch {
		case r.pattern:
			a.patterns = append(a.patterns, r)
		case inUser:
			a.users[user] = append(a.users[user], r)
		default:
			a.anonymous = append(a.anonymous, r)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return a, nil
}

// Allowed reports whether a client (username "" when anonymous) may
// receive from topic (read: a topic, or a subscription filter, which every
// topic it matches must be readable for) or publish to it (write). Deny
// lines win over grants; without a matching grant, access is denied.
func (a *ACL) Allowed(username, clientID, topic string, write bool) bool {
	var rules []rule
	if username == "" {
		rules = a.anonymous
	} else {
		rules = a.users[username]
	}
	want := Read
	if write {
		want = Write
	}
	granted := false
	for _, set := range [][]rule{rules, a.patterns} {
		for _, r := range set {
			t := r.topic
			if r.pattern {
				var ok bool
				if t, ok = substitute(t, username, clientID); !ok {
					continue
				}
			}
			if !covers(t, topic) {
				continue
			}
			if r.access == Deny {
				return false
			}
			granted = granted || r.access&want != 0
		}
	}
	return granted
}

// substitute puts username and client ID in a pattern; false when the
// pattern needs one the client has not, or one that holds a wildcard or
// a '/' (which would widen the pattern).
func substitute(p, username, clientID string) (string, bool) {
	for _, s := range []struct{ token, v string }{{"%u", username}, {"%c", clientID}} {
		if !strings.Contains(p, s.token) {
			continue
		}
		if s.v == "" || strings.ContainsAny(s.v, "+#/") {
			return "", false
		}
		p = strings.ReplaceAll(p, s.token, s.v)
	}
	return p, true
}

// covers reports whether every topic that filter matches is matched by
// pattern (both MQTT topic filters; a topic name is a filter without
// wildcards). Wildcards at the first level do not match topics starting
// with '$' (MQTT 3.1.1 §4.7.2).
func covers(pattern, filter string) bool {
	p, f := strings.Split(pattern, "/"), strings.Split(filter, "/")
	if strings.HasPrefix(f[0], "$") && (p[0] == "+" || p[0] == "#") {
		return false
	}
	for i, pl := range p {
		if pl == "#" {
			return true
		}
		if i >= len(f) {
			return false
		}
		fl := f[i]
		switch {
		case pl == "+":
			if fl == "#" {
				return false
			}
		case fl == "+" || fl == "#" || fl != pl:
			return false
		}
	}
	return len(f) == len(p)
}

// validFilter reports whether s is an MQTT topic filter: '#' only as the
// last level, wildcards only as whole levels.
func validFilter(s string) bool {
	levels := strings.Split(s, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return false
		}
		if strings.Contains(l, "+") && l != "+" {
			return false
		}
	}
	return true
}
