package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

const (
	maxKeyLen   = 256
	maxBodySize = 1 << 20
)

// applyRequest is the body of POST /v1/devices/{dev}/apply.
type applyRequest struct {
	OpID   string          `json:"op_id"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params"`
}

// opAnswer is the body of GET /v1/devices/{dev}/ops/{key}.
type opAnswer struct {
	Key     string          `json:"key"`
	OpID    string          `json:"op_id,omitempty"`
	Applied bool            `json:"applied"`
	State   json.RawMessage `json:"state,omitempty"`
}

func (s *Sim) device(w http.ResponseWriter, r *http.Request) *device {
	dev := r.PathValue("dev")
	d := s.devices[dev]
	if d == nil {
		writeError(w, http.StatusNotFound, "unknown device %q", dev)
	}
	return d
}

// handleApply carries out one apply request. The order matters:
//
//  1. hang holds the request before its key is registered, so an ops query
//     meanwhile does not wait for it and may tombstone the key; the held
//     request is then closed unapplied;
//  2. the key is looked up and, if new, registered as pending, under mu:
//     the same lock the ops query tombstones under, so a request either
//     registers first (and the query waits for it) or finds the tombstone
//     (and gets 409);
//  3. latency and error_rate strike while the key is pending, so an ops
//     query arriving during the delay waits and sees the outcome;
//  4. the write is applied and fsynced, or the stored answer is taken;
//  5. drop_response_rate closes the connection instead of answering.
func (s *Sim) handleApply(w http.ResponseWriter, r *http.Request) {
	d := s.device(w, r)
	if d == nil {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	switch {
	case key == "":
		writeError(w, http.StatusBadRequest, "Idempotency-Key: required")
		return
	case len(key) > maxKeyLen:
		writeError(w, http.StatusBadRequest, "Idempotency-Key: longer than %d bytes", maxKeyLen)
		return
	}
	s.mu.Lock()
	d.requests[key]++
	f := s.faults.of(d.id)
	s.mu.Unlock()

	var fence int64
	if h := r.Header.Get("X-Fence-Token"); h != "" {
		var err error
		if fence, err = strconv.ParseInt(h, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, "X-Fence-Token: must be an integer, got %q", h)
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodySize))
	if err != nil {
		writeError(w, http.StatusBadRequest, "body: %v", err)
		return
	}
	var req applyRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "body: not a JSON object with op_id, action and params: %v", err)
		return
	}
	if req.Action == "" {
		writeError(w, http.StatusBadRequest, "action: required")
		return
	}
	params, members, err := decodeParams(req.Params)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}

	if f.Hang {
		s.bump(func(c *FaultCounts) { c.Held++ })
		s.hold(r.Context(), d.id, func(f Faults) bool { return f.Hang })
		dropConnection(w)
		return
	}
	if hit(f.ResetRate) {
		s.bump(func(c *FaultCounts) { c.Resets++ })
		dropConnection(w)
		return
	}

	// mine is the op this request registered and must decide or abandon;
	// known is the key's decided op when another request got there first.
	var mine, known *op
	for mine == nil && known == nil {
		var wait chan struct{}
		s.mu.Lock()
		switch o := d.ops[key]; {
		case o == nil:
			mine = &op{status: opPending, done: make(chan struct{}), opID: req.OpID}
			d.ops[key] = mine
		case o.status == opPending:
			wait = o.done
		default:
			known = o
		}
		s.mu.Unlock()
		if wait != nil {
			select {
			case <-wait: // decided or abandoned: look again
			case <-r.Context().Done():
				return
			case <-s.closing:
				dropConnection(w)
				return
			}
		}
	}

	if f.LatencyMS > 0 {
		s.bump(func(c *FaultCounts) { c.Delayed++ })
		t := time.NewTimer(time.Duration(f.LatencyMS) * time.Millisecond)
		// Deliberately not r.Context(): a write the device has received
		// takes effect even if its sender gives up waiting.
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
			s.abandon(d, key, mine)
			dropConnection(w)
			return
		}
	}
	if hit(f.ErrorRate) {
		s.bump(func(c *FaultCounts) { c.Errors++ })
		s.abandon(d, key, mine)
		writeError(w, http.StatusServiceUnavailable, "injected fault: error_rate %v", f.ErrorRate)
		return
	}

	var code int
	var answer []byte
	switch {
	case mine != nil:
		code, answer = s.apply(d, key, fence, req.OpID, req.Action, params, members, mine)
	case known.status == opTombstoned:
		code, answer = http.StatusConflict, errorAnswer("Idempotency-Key %q was tombstoned by an ops query: it is never applied", key)
		s.log.Info("refused tombstoned key", "device", d.id, "key", key, "op_id", req.OpID)
	default:
		code, answer = known.code, known.answer
		s.log.Debug("repeated key answered from its stored answer", "device", d.id, "key", key, "code", code)
	}

	if f.HangAfterApply {
		s.bump(func(c *FaultCounts) { c.HeldAfterApply++ })
		s.hold(r.Context(), d.id, func(f Faults) bool { return f.HangAfterApply })
		dropConnection(w)
		return
	}
	if hit(f.DropResponseRate) {
		s.bump(func(c *FaultCounts) { c.Dropped++ })
		dropConnection(w)
		return
	}
	writeRaw(w, code, answer)
}

// apply decides the pending op mine: the hardware refuses it (422, stored)
// or it takes effect, is journaled and fsynced, and only then leaves
// pending (durable before visible: a repeat or a query waiting on it sees
// it applied only once its line is on disk).
func (s *Sim) apply(d *device, key string, fence int64, opID, action string, params json.RawMessage, members map[string]json.RawMessage, mine *op) (int, []byte) {
	s.mu.Lock()
	if s.closed || s.broken != nil {
		reason := "firmware simulator is closing"
		if s.broken != nil {
			reason = s.broken.Error()
		}
		s.abandonLocked(d, key, mine)
		s.mu.Unlock()
		return http.StatusServiceUnavailable, errorAnswer("not applied: %s", reason)
	}
	next, err := applyWrite(d.typ, d.state, action, members)
	if err != nil {
		mine.status, mine.code, mine.answer = opRefused, http.StatusUnprocessableEntity, errorAnswer("%v", err)
		close(mine.done)
		s.mu.Unlock()
		s.log.Info("refused", "device", d.id, "key", key, "op_id", opID, "action", action, "reason", err)
		return mine.code, mine.answer
	}
	e := Entry{Seq: s.seq + 1, Device: d.id, OpID: opID, Key: key, Fence: fence, Action: action, Params: params, At: time.Now().UTC()}
	jfile, err := s.appendLocked(d, next, e)
	if err != nil {
		s.abandonLocked(d, key, mine)
		s.mu.Unlock()
		s.log.Error("journal append failed: applying nothing more", "err", err)
		return http.StatusInternalServerError, errorAnswer("not applied: journal append failed: %v", err)
	}
	st := next.JSON()
	mine.code, mine.answer, mine.state = http.StatusOK, applyAnswer(st), st
	s.mu.Unlock()

	syncErr := s.syncJournal(jfile)
	s.mu.Lock()
	mine.status = opApplied
	close(mine.done)
	s.mu.Unlock()
	if syncErr != nil {
		return http.StatusInternalServerError, errorAnswer("applied, but the journal fsync failed: %v", syncErr)
	}
	s.log.Info("applied", "device", d.id, "key", key, "op_id", opID, "fence", fence, "action", action, "seq", e.Seq, "state", st)
	return mine.code, mine.answer
}

// appendLocked journals e (d's write taking it to next) and applies it:
// the line is written under mu, so the file is in seq order and each fsync
// also covers every line written before it. A failed write applies
// nothing and leaves the simulator broken. It returns the journal file to
// fsync (nil when there is none), which syncJournal does outside mu.
func (s *Sim) appendLocked(d *device, next state, e Entry) (*os.File, error) {
	if s.jfile != nil {
		if _, err := s.jfile.Write(line(e)); err != nil {
			s.broken = fmt.Errorf("journal append failed: %w", err)
			return nil, err
		}
	}
	s.seq = e.Seq
	d.state = next
	s.journal = append(s.journal, e)
	return s.jfile, nil
}

// syncJournal fsyncs f (nil: nothing to do); a failed fsync leaves the
// simulator broken, applying nothing more.
func (s *Sim) syncJournal(f *os.File) error {
	if f == nil {
		return nil
	}
	err := f.Sync()
	if err != nil {
		s.mu.Lock()
		if s.broken == nil {
			s.broken = fmt.Errorf("journal fsync failed: %w", err)
		}
		s.mu.Unlock()
		s.log.Error("journal fsync failed: applying nothing more", "err", err)
	}
	return err
}

// abandon gives up the pending op mine (nil: nothing to do) unapplied:
// the key is free again, and whoever waits for it looks again.
func (s *Sim) abandon(d *device, key string, mine *op) {
	if mine == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandonLocked(d, key, mine)
}

func (s *Sim) abandonLocked(d *device, key string, mine *op) {
	if d.ops[key] == mine {
		delete(d.ops, key)
	}
	close(mine.done)
}

// hold waits while on(dev's faults) holds (hang, hang_after_apply), until
// the client (ctx; nil: never) or the simulator gives up.
func (s *Sim) hold(ctx context.Context, dev string, on func(Faults) bool) {
	if ctx == nil {
		ctx = context.Background()
	}
	for {
		s.mu.Lock()
		hang, changed := on(s.faults.of(dev)), s.faultsChanged
		s.mu.Unlock()
		if !hang {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
}

func (s *Sim) bump(f func(*FaultCounts)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.counts)
}

// handleOps answers whether the key was applied, waiting for a pending
// write of the key (its latency included). A key not applied is
// tombstoned, durably, before the 404 is sent: the querier acts on the 404
// (it may send the operation again under a new key), so the old key must
// never take effect afterwards, not even after a restart.
func (s *Sim) handleOps(w http.ResponseWriter, r *http.Request) {
	d := s.device(w, r)
	if d == nil {
		return
	}
	key := r.PathValue("key")
	for {
		s.mu.Lock()
		if s.broken != nil {
			err := s.broken
			s.mu.Unlock()
			writeError(w, http.StatusInternalServerError, "%v", err)
			return
		}
		o := d.ops[key]
		if o != nil && o.status == opPending {
			wait := o.done
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-r.Context().Done():
				return
			case <-s.closing:
				dropConnection(w)
				return
			}
		}
		if o != nil && o.status == opApplied {
			ans := opAnswer{Key: key, OpID: o.opID, Applied: true, State: o.state}
			s.mu.Unlock()
			writeRaw(w, http.StatusOK, mustJSON(ans))
			return
		}
		if o == nil || o.status != opTombstoned {
			d.ops[key] = &op{status: opTombstoned}
			if s.tfile != nil {
				if _, err := s.tfile.Write(line(tombstone{Device: d.id, Key: key, At: time.Now().UTC()})); err != nil {
					s.broken = fmt.Errorf("tombstone append failed: %w", err)
					s.mu.Unlock()
					writeError(w, http.StatusInternalServerError, "tombstone append failed: %v", err)
					return
				}
			}
			s.log.Info("tombstoned", "device", d.id, "key", key)
		}
		tfile := s.tfile
		s.mu.Unlock()
		// Every 404 syncs, not only the one that wrote the line: a second
		// query must not answer before the first one's line is durable.
		if tfile != nil {
			if err := tfile.Sync(); err != nil {
				s.mu.Lock()
				if s.broken == nil {
					s.broken = fmt.Errorf("tombstone fsync failed: %w", err)
				}
				s.mu.Unlock()
				writeError(w, http.StatusInternalServerError, "tombstone fsync failed: %v", err)
				return
			}
		}
		writeRaw(w, http.StatusNotFound, mustJSON(opAnswer{Key: key, Applied: false}))
		return
	}
}

func (s *Sim) handleState(w http.ResponseWriter, r *http.Request) {
	d := s.device(w, r)
	if d == nil {
		return
	}
	s.mu.Lock()
	st := d.state.JSON()
	s.mu.Unlock()
	writeRaw(w, http.StatusOK, st)
}

func (s *Sim) handleJournal(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	for _, e := range s.Journal() {
		w.Write(line(e))
	}
}

func (s *Sim) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		writeError(w, http.StatusBadRequest, "body: %v", err)
		return
	}
	var f Faults
	if len(body) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			writeError(w, http.StatusBadRequest, "body: %v", err)
			return
		}
	}
	switch err := s.SetFaults(f); {
	case errors.Is(err, ErrUnknownDevice):
		writeError(w, http.StatusNotFound, "%v", err)
	case errors.Is(err, ErrBadFaults):
		writeError(w, http.StatusBadRequest, "%v", err)
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "%v", err)
	default:
		s.handleGetFaults(w, r)
	}
}

// handleGetFaults shows the faults in force: {"all":{..},"devices":{id:{..}}}.
func (s *Sim) handleGetFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	t := struct {
		All     Faults            `json:"all"`
		Devices map[string]Faults `json:"devices"`
	}{s.faults.all, map[string]Faults{}}
	for id, f := range s.faults.perDevice {
		t.Devices[id] = f
	}
	s.mu.Unlock()
	writeRaw(w, http.StatusOK, mustJSON(t))
}
