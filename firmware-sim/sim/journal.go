package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Entry is one applied write, as GET /v1/journal and the journal file
// show it (one JSON line each).
type Entry struct {
	Seq    int64           `json:"seq"`
	Device string          `json:"device"`
	OpID   string          `json:"op_id"`
	Key    string          `json:"key"`
	Fence  int64           `json:"fence"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params"`
	// Modbus is where a write that arrived over Modbus came from (its
	// OpID, Key and Fence are then empty: Modbus carries none).
	Modbus *ModbusWrite `json:"modbus,omitempty"`
	At     time.Time    `json:"at"`
}

// tombstone is one line of the tombstones file: a key that an ops query
// found unapplied, and that is therefore never applied.
type tombstone struct {
	Device string    `json:"device"`
	Key    string    `json:"key"`
	At     time.Time `json:"at"`
}

// tombstonesPath is where the tombstones of the journal at path live.
func tombstonesPath(journal string) string { return journal + ".tombstones" }

// readLines decodes every complete line of path into a T; a missing file
// has none. A last line without its newline is a write cut short by a
// crash, before its fsync and so before any answer: it is not returned, and
// good (the length of the complete lines) tells where to cut it off.
func readLines[T any](path string) (vals []T, good int64, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("sim: read %s: %w", path, err)
	}
	good = int64(bytes.LastIndexByte(data, '\n') + 1)
	for i, line := range bytes.Split(data[:good], []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, 0, fmt.Errorf("%w: %s line %d: %v", ErrCorruptJournal, path, i+1, err)
		}
		vals = append(vals, v)
	}
	return vals, good, nil
}

// openAppend opens path for appending, first cutting it to size (dropping
// a torn last line). A file it creates is made durable by syncing its
// directory, so that fsyncs of the file's lines mean what they say.
func openAppend(path string, size int64) (*os.File, error) {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("sim: open %s: %w", path, err)
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := syncDir(filepath.Dir(path)); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > size {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: cut torn line of %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: sync %s: %w", path, err)
		}
	}
	return f, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sim: open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sim: sync directory %s: %w", dir, err)
	}
	return nil
}

// line is v as one JSON line.
func line(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: Entry and tombstone hold valid JSON only
		panic(fmt.Sprintf("sim: marshal journal line: %v", err))
	}
	return append(b, '\n')
}
