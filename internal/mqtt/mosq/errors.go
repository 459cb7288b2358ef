package mosq

import "errors"

// Parsing (ParsePasswords, ParseACL).
var (
	// ErrFormat is wrapped by every error of ParsePasswords and ParseACL;
	// the message names the line.
	ErrFormat = errors.New("mosq: malformed file")
)
