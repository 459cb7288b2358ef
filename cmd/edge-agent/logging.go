package main

import (
	"fmt"
	"log/slog"
	"os"
)

// newLogger returns the process's logger: text (slog's key=value lines) or
// json (one JSON object per line: time, level, msg, then the keys of
// docs/operations.md, Logs), at level, on stderr.
func newLogger(format string, level slog.Level) (*slog.Logger, error) {
	o := &slog.HandlerOptions{Level: level}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
