package chaos

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// opHist is everything recorded about one operation (one op_id).
type opHist struct {
	id, dev, ctl string
	fence        int64
	action       string
	params       json.RawMessage
	invoked      int64 // first invocation; 0: never invoked by a controller
	published    []int64
	results      []seenResult // observer's, in delivery order
	ctlResults   []seenResult // its controller's
	journal      []sim.Entry
	gaveUp       bool
	lost         bool // invoked before a loss of the store's memory, no recorded final seen before it
}

type seenResult struct {
	t int64
	r wire.Result
}

// Violation is one thing the history shows that must not happen.
type Violation struct {
	Check string // which check
	Dev   string
	Op    string
	T     int64 // when it shows
	Msg   string
	// Window is the minimal history around it, one line per event.
	Window []string
}

// CheckResult is what the checker found.
type CheckResult struct {
	Ops        int
	Barriers   int
	Published  int
	Exempt     int // published but allowed to be lost (embedded broker, see below)
	Lost       int // invoked before the store lost its memory and not final by then (lifecycle.go)
	Results    int
	Outcomes   map[string]int // first final recorded code per op ("open": none)
	Journal    int
	Checks     []CheckLine
	Violations []Violation
	Porcupine  map[string]string // device -> ok / illegal / unknown (timeout)
	CtlOnly    int               // a fleet's: Results a controller got and the observer did not (taken as seen)
}

// CheckLine is one row of the report's checks table.
type CheckLine struct {
	Name       string
	Violations int
	Note       string
}

// checker runs every check on a history.
type checker struct {
	h        *History
	ops      map[string]*opHist
	byDev    map[string][]*opHist
	res      *CheckResult
	dir      string
	porTO    time.Duration
	counts   map[string]int
	lossRecs []loss
	floors   []floorRec
}

// check runs the direct checks and the porcupine model on h, writing
// porcupine visualizations of illegal histories into dir.
func Check(h *History, dir string, porcupineTimeout time.Duration) *CheckResult {
	c := &checker{h: h, ops: map[string]*opHist{}, byDev: map[string][]*opHist{}, dir: dir, porTO: porcupineTimeout,
		res: &CheckResult{Outcomes: map[string]int{}, Porcupine: map[string]string{}}, counts: map[string]int{}}
	c.lifecycle()
	c.build()
	c.markLost()
	c.checkResults()
	c.checkJournal()
	c.checkFinal()
	c.checkFinalMeansFinal()
	c.checkModel()
	c.checkClones()
	sort.SliceStable(c.res.Violations, func(i, j int) bool { return c.res.Violations[i].T < c.res.Violations[j].T })
	return c.res
}

func (c *checker) op(id, dev string) *opHist {
	o := c.ops[id]
	if o == nil {
		o = &opHist{id: id, dev: dev}
		c.ops[id] = o
	}
	return o
}

func (c *checker) build() {
	for _, e := range c.h.Events {
		switch e.Ev {
		case EvInvoked:
			o := c.op(e.Op, e.Dev)
			if o.invoked == 0 {
				o.invoked, o.ctl, o.fence, o.action, o.params = e.T, e.Src, e.Fence, e.Action, e.Params
			}
		case EvPublished:
			o := c.op(e.Op, e.Dev)
			o.published = append(o.published, e.T)
		case EvGaveUp:
			c.op(e.Op, e.Dev).gaveUp = true
		case EvResult:
			if e.Result == nil || e.Op == "" {
				continue
			}
			o := c.op(e.Op, e.Result.Device)
			if e.Src == "observer" {
				o.results = append(o.results, seenResult{e.T, *e.Result})
				c.res.Results++
			} else {
				o.ctlResults = append(o.ctlResults, seenResult{e.T, *e.Result})
			}
		}
	}
	if len(c.h.Meta.Fleet) > 0 {
		c.witnesses()
	}
	for _, j := range c.h.Journal {
		o := c.op(j.OpID, j.Device)
		o.journal = append(o.journal, j)
		c.res.Journal++
	}
	for _, o := range c.ops {
		if o.dev == "" && len(o.results) > 0 {
			o.dev = o.results[0].r.Device
		}
		c.byDev[o.dev] = append(c.byDev[o.dev], o)
		if o.invoked != 0 {
			c.res.Ops++
			if o.action == wire.ActionFence {
				c.res.Barriers++
			}
		}
		if len(o.published) > 0 {
			c.res.Published++
		}
	}
	for _, ops := range c.byDev {
		sort.Slice(ops, func(i, j int) bool { return ops[i].firstT() < ops[j].firstT() })
	}
}

func (o *opHist) firstT() int64 {
	if o.invoked != 0 {
		return o.invoked
	}
	if len(o.journal) > 0 {
		return o.journal[0].At.UnixNano()
	}
	if len(o.results) > 0 {
		return o.results[0].t
	}
	return 0
}

func (c *checker) violate(check string, o *opHist, t int64, format string, a ...any) {
	c.counts[check]++
	v := Violation{Check: check, Op: o.id, Dev: o.dev, T: t, Msg: fmt.Sprintf(format, a...)}
	v.Window = c.window(o, t)
	c.res.Violations = append(c.res.Violations, v)
}

// sameResult compares what a Result says about its operation (not
// duplicate and, for a replay, not last_fence, which is the device's now).
func sameResult(a, b wire.Result, withFence bool) bool {
	return a.Status == b.Status && a.Code == b.Code && a.At.Equal(b.At) &&
		canonicalJSON(a.Output) == canonicalJSON(b.Output) && (!withFence || a.LastFence == b.LastFence)
}

// unexpected are codes an honest controller of this campaign never causes.
var unexpected = map[wire.Code]bool{wire.CodeInvalid: true, wire.CodeUnknownDevice: true,
	wire.CodeOpConflict: true, wire.CodeLockMismatch: true, wire.CodeUnauthorized: true, wire.CodePolicyDenied: true}

// witnesses (a fleet, on the NATS cluster): the observer is not the only
// witness of what the agents published. NATS did not deliver every QoS 1
// Result to the observer's wildcard subscriptions that it delivered to
// the controller it was for (docs/testing.md, "Chaos campaign of a
// fleet"), so a Result a
// controller received and the observer did not is taken as the
// observer's too, at the time the controller got it.
func (c *checker) witnesses() {
	for _, o := range c.ops {
		seen := map[string]bool{}
		for _, s := range o.results {
			seen[resultSig(s.r)] = true
		}
		added := false
		for _, s := range o.ctlResults {
			if !seen[resultSig(s.r)] {
				seen[resultSig(s.r)] = true
				o.results = append(o.results, s)
				c.res.CtlOnly++
				added = true
			}
		}
		if added {
			sort.SliceStable(o.results, func(i, j int) bool { return o.results[i].t < o.results[j].t })
		}
	}
}

// recordedFinal is the operation's first recorded final Result
// (duplicate: false), if any.
func (o *opHist) recordedFinal() (seenResult, bool) {
	for _, s := range o.results {
		if s.r.Final() && wire.Recorded(s.r.Code) && !s.r.Duplicate {
			return s, true
		}
	}
	return seenResult{}, false
}

// saidApplied reports whether any Result of the operation, seen by anyone,
// said applied (a replay included).
func (o *opHist) saidApplied() bool {
	for _, list := range [][]seenResult{o.results, o.ctlResults} {
		for _, s := range list {
			if s.r.Status == wire.StatusApplied {
				return true
			}
		}
	}
	return false
}

// finalAt is when anyone first saw a final Result of the operation
// (recorded or not when anyRecorded is false).
func (o *opHist) finalAt(recordedOnly bool) (int64, wire.Result, bool) {
	best, found := never, false
	var r wire.Result
	for _, list := range [][]seenResult{o.results, o.ctlResults} {
		for _, s := range list {
			if s.r.Final() && (!recordedOnly || wire.Recorded(s.r.Code)) && s.t < best {
				best, r, found = s.t, s.r, true
			}
		}
	}
	return best, r, found
}

// checkResults: per op, the Results the broker delivered are unknown (and
// answers that are not recorded) and then recorded finals that are all the
// same: never an unknown after a final, never two different finals, a
// replay equal to the recorded final, no device_unreachable after an
// unknown (invariant 6), no code this campaign's controllers cannot cause.
func (c *checker) checkResults() {
	const name = "results per operation"
	for _, o := range c.ops {
		var final *wire.Result
		var unknown bool
		seen := map[string]bool{}
		ep := 0
		for _, s := range o.results {
			r := s.r
			// The same Result again (the outbox publishes at least once:
			// after a crash, everything not yet confirmed is published
			// again, in order; a restored store's outbox too) says
			// nothing new.
			if seen[resultSig(r)] {
				continue
			}
			seen[resultSig(r)] = true
			if e := c.epoch(o.dev, s.t); e != ep {
				ep, final, unknown = e, nil, false // a store that forgot the op
			}
			if len(c.h.Meta.Fleet) > 0 && r.Code == wire.CodeUnknownDevice {
				// A fleet's gateway the device has left answers what it
				// still had queued of it so: not recorded, it says
				// nothing of the operation, and it comes on that
				// gateway's topics, in no order with the Results of the
				// gateway that fronts the device now.
				continue
			}
			if unexpected[r.Code] {
				c.violate(name, o, s.t, "unexpected code %s (%s)", r.Code, r.Reason)
				continue
			}
			if r.Duplicate {
				if r.Final() && final != nil && !sameResult(r, *final, false) {
					c.violate(name, o, s.t, "a replay says %s/%s at %s, the recorded final said %s/%s at %s", r.Status, r.Code, r.At.Format(time.RFC3339Nano), final.Status, final.Code, final.At.Format(time.RFC3339Nano))
				}
				continue
			}
			switch {
			case !r.Final():
				if final != nil {
					c.violate(name, o, s.t, "an unknown Result after the final %s/%s", final.Status, final.Code)
				}
				unknown = true
			case !wire.Recorded(r.Code):
				if final != nil {
					c.violate(name, o, s.t, "%s after the final %s/%s", r.Code, final.Status, final.Code)
				} else if unknown {
					c.violate(name, o, s.t, "%s after an unknown Result (invariant 6: once unknown, held until final)", r.Code)
				}
			case final == nil:
				rr := r
				final = &rr
			case !sameResult(r, *final, true):
				c.violate(name, o, s.t, "two different finals: %s/%s lf=%d at %s, then %s/%s lf=%d at %s", final.Status, final.Code, final.LastFence,
					final.At.Format(time.RFC3339Nano), r.Status, r.Code, r.LastFence, r.At.Format(time.RFC3339Nano))
			}
		}
		if o.invoked == 0 && len(o.results) > 0 {
			c.violate(name, o, o.results[0].t, "a Result for an op_id no controller invoked")
		}
		if o.invoked != 0 {
			if s, ok := o.recordedFinal(); ok {
				c.res.Outcomes[string(s.r.Code)]++
			} else if _, r, ok := o.finalAt(false); ok {
				c.res.Outcomes[string(r.Code)+" (not recorded)"]++
			} else if len(o.published) > 0 {
				c.res.Outcomes["none"]++
			} else {
				c.res.Outcomes["never published"]++
			}
		}
	}
	c.line(name, "")
}

// resultSig is everything a Result says about its operation.
func resultSig(r wire.Result) string {
	return fmt.Sprintf("%s|%s|%d|%v|%d|%s|%s", r.Status, r.Code, r.At.UnixNano(), r.Duplicate, r.LastFence, canonicalJSON(r.Output), r.Reason)
}

// notFinal are the rejections that say nothing happened: the same op_id
// may be sent again and end otherwise (docs/protocol.md, "What is
// recorded").
var notFinal = map[wire.Code]bool{wire.CodeBusy: true, "fence_unconfirmed": true}

// checkFinalMeansFinal (invariant 8): a final Result (any but unknown,
// busy and fence_unconfirmed) is never followed, for the same op_id, by a
// different one, recorded or not. A replay (duplicate: true) says the same
// outcome with the device's last_fence of now; the outbox's publishing the
// very same Result again after a crash is not a second final either. It
// holds while the record is kept: within one memory epoch.
func (c *checker) checkFinalMeansFinal() {
	const name = "final means final"
	for _, o := range c.ops {
		var first *wire.Result
		seen := map[string]bool{}
		ep := 0
		for _, s := range o.results {
			r := s.r
			if !r.Final() || notFinal[r.Code] || unexpected[r.Code] || seen[resultSig(r)] {
				continue // unexpected codes are reported by "results per operation"
			}
			seen[resultSig(r)] = true
			if e := c.epoch(o.dev, s.t); e != ep {
				ep, first = e, nil
			}
			if first == nil {
				rr := r
				first = &rr
				continue
			}
			if !sameResult(r, *first, !r.Duplicate && !first.Duplicate) {
				c.violate(name, o, s.t, "final %s/%s (duplicate %v, at %s) followed by a different final %s/%s (duplicate %v, at %s)",
					first.Status, first.Code, first.Duplicate, first.At.Format(time.RFC3339Nano), r.Status, r.Code, r.Duplicate, r.At.Format(time.RFC3339Nano))
				break
			}
		}
	}
	c.line(name, "")
}

// checkJournal: the firmware's journal is the hardware's truth. Per device
// its fences never go down (invariant 1: two holders' writes never
// interleave, whatever the lock said); no op_id is applied twice
// (invariant 2); every applied Result is in it exactly once; nothing
// answered rejected or failed is in it; nothing in it is unknown to the
// controllers.
func (c *checker) checkJournal() {
	const order, once, applied, refused = "journal fence order", "at most once (journal)", "every applied in the journal once", "nothing rejected/failed applied"
	last := map[string]sim.Entry{}
	for _, j := range c.h.Journal {
		o := c.ops[j.OpID]
		if p, ok := last[j.Device]; ok && j.Fence < p.Fence {
			po := c.ops[p.OpID]
			c.violate(order, o, j.At.UnixNano(), "fence %d (op %s of %s) applied after fence %d (op %s of %s): two holders' writes interleaved",
				j.Fence, j.OpID, o.ctl, p.Fence, p.OpID, po.ctl)
		}
		last[j.Device] = j
		if o.invoked == 0 {
			c.violate(once, o, j.At.UnixNano(), "journal seq %d applied op_id %s, which no controller invoked", j.Seq, j.OpID)
		} else if j.At.UnixNano() < o.invoked {
			c.violate(order, o, j.At.UnixNano(), "applied (journal seq %d) before it was invoked", j.Seq)
		}
	}
	for _, o := range c.ops {
		if len(o.journal) > 1 {
			var seqs []string
			for _, j := range o.journal {
				seqs = append(seqs, fmt.Sprintf("%d (key %s)", j.Seq, j.Key))
			}
			c.violate(once, o, o.journal[1].At.UnixNano(), "applied %d times: journal seq %s", len(o.journal), strings.Join(seqs, ", "))
		}
		s, ok := o.recordedFinal()
		if !ok {
			continue
		}
		switch {
		case o.lost && len(o.journal) > 0:
			// Applied, and its Result may have gone with the store.
		case s.r.Code == wire.CodeOK && o.action != wire.ActionFence && len(o.journal) == 0:
			c.violate(applied, o, s.t, "answered applied/ok but the firmware's journal does not have it")
		case s.r.Status != wire.StatusApplied && len(o.journal) > 0:
			c.violate(refused, o, s.t, "answered %s/%s but the firmware applied it (journal seq %d)", s.r.Status, s.r.Code, o.journal[0].Seq)
		}
	}
	// An op in the journal must end applied: an op whose only finals say
	// it was not (device_unreachable...) while the hardware did it.
	for _, o := range c.ops {
		if len(o.journal) == 0 || o.lost {
			continue
		}
		if _, ok := o.recordedFinal(); ok || o.saidApplied() {
			continue // a replay of the recorded outcome said applied (its original was not seen)
		}
		if t, r, ok := o.finalAt(false); ok {
			c.violate(refused, o, t, "the firmware applied it (journal seq %d) but its only final Result is %s/%s", o.journal[0].Seq, r.Status, r.Code)
		}
	}
	c.line(order, "")
	c.line(once, "")
	c.line(applied, "")
	c.line(refused, "")
}

// checkFinal: every operation a controller published (the broker
// acknowledged it) has a final Result (invariant 4), whether or not its
// controller is still there to resend it. With the embedded broker, a
// command is kept once routed, not from its PUBACK (docs/operations.md):
// one published less than a second before the agent (and so the broker)
// died uncleanly may be lost without a resend, and is exempt.
func (c *checker) checkFinal() {
	const name = "every command final"
	var crashes []int64
	for _, f := range c.h.Faults {
		if f.Kind == "agent_exit" && f.Detail != "exit 0" {
			crashes = append(crashes, f.T)
		}
	}
	for _, o := range c.ops {
		if len(o.published) == 0 {
			continue
		}
		if _, _, ok := o.finalAt(false); ok {
			continue
		}
		if o.lost {
			continue // counted in Lost
		}
		lastPub := o.published[len(o.published)-1]
		if c.h.Meta.Broker == "embedded" {
			exempt := false
			for _, t := range crashes {
				if t >= lastPub && t-lastPub < int64(time.Second) {
					exempt = true
				}
			}
			if exempt {
				c.res.Exempt++
				continue
			}
		}
		msg := "published (the broker acknowledged it) but no final Result by the end"
		if len(o.results) > 0 {
			msg += fmt.Sprintf(" (last seen %s)", o.results[len(o.results)-1].r.Code)
		}
		c.violate(name, o, lastPub, "%s", msg)
	}
	note := fmt.Sprintf("%d published", c.res.Published)
	if c.res.Exempt > 0 {
		note += fmt.Sprintf(", %d exempt (embedded broker crash)", c.res.Exempt)
	}
	if c.res.Lost > 0 {
		note += fmt.Sprintf(", %d invoked before a loss of the store's memory", c.res.Lost)
	}
	c.line(name, note)
}

// checkModel runs the porcupine model on every device's operations.
func (c *checker) checkModel() {
	const name = "linearizable (porcupine)"
	devs := make([]string, 0, len(c.byDev))
	for d := range c.byDev {
		devs = append(devs, d)
	}
	sort.Strings(devs)
	okN := 0
	for _, dev := range devs {
		spec, known := c.h.Meta.device(dev)
		if !known {
			continue
		}
		var ops []porcupine.Operation
		for _, o := range c.byDev[dev] {
			if o.invoked == 0 {
				continue // reported by the other checks
			}
			ops = append(ops, c.operation(o, spec.Type))
		}
		ops = append(ops, c.floorOps(dev)...)
		viz := filepath.Join(c.dir, "porcupine-"+dev+".html")
		res, window, err := linCheck(spec.Type, ops, c.porTO, viz)
		if res != porcupine.Illegal {
			// A direct check's violation on this device: draw the
			// history up to it too.
			var last int64
			for i := range c.res.Violations {
				if v := &c.res.Violations[i]; v.Dev == dev && v.T > last {
					last = v.T
				}
			}
			if last > 0 && visualizeUntil(spec.Type, ops, last+int64(time.Second), c.porTO, viz) == nil {
				for i := range c.res.Violations {
					if v := &c.res.Violations[i]; v.Dev == dev {
						v.Msg += " (porcupine's drawing of " + dev + "'s history up to it: " + viz + ")"
					}
				}
			}
		}
		switch res {
		case porcupine.Ok:
			okN++
			c.res.Porcupine[dev] = "ok"
		case porcupine.Unknown:
			c.res.Porcupine[dev] = fmt.Sprintf("not decided within %v", c.porTO)
		default:
			c.res.Porcupine[dev] = "illegal, see " + viz
			var lines []string
			model := fenceModel(spec.Type)
			t := int64(0)
			for _, w := range window {
				lines = append(lines, fmt.Sprintf("%s .. %s  %s", c.h.Meta.Stamp(w.Call), c.h.Meta.Stamp(w.Return), model.DescribeOperation(w.Input, w.Output)))
				t = max(t, w.Call)
			}
			if err != nil {
				lines = append(lines, "visualization: "+err.Error())
			}
			c.counts[name]++
			c.res.Violations = append(c.res.Violations, Violation{Check: name, Dev: dev, T: t,
				Msg:    fmt.Sprintf("no linearization of %s's operations as a fenced at-most-once register (porcupine; shortest illegal prefix: %d lines below, HTML: %s)", dev, len(window), viz),
				Window: lines})
		}
	}
	c.line(name, fmt.Sprintf("%d/%d devices", okN, len(c.res.Porcupine)))
}

// operation is o as a porcupine operation.
func (c *checker) operation(o *opHist, typ string) porcupine.Operation {
	in := opIn{id: o.id, fence: o.fence, barrier: o.action == wire.ActionFence, typ: typ, action: o.action, params: o.params, applied: len(o.journal)}
	out := opOut{open: true}
	call, ret := o.invoked, never
	if o.lost {
		// Its Result may have gone with the store: open.
	} else if s, ok := o.recordedFinal(); ok {
		out = opOut{code: s.r.Code, lf: s.r.LastFence, lfKnown: !c.recoveredLater(o, s.r), output: canonicalJSON(s.r.Output)}
		ret, _, _ = o.finalAt(true)
	} else if t, r, ok := o.finalAt(true); ok && wire.Recorded(r.Code) {
		// Only a replay was seen: its last_fence is the device's now.
		out = opOut{code: r.Code, output: canonicalJSON(r.Output)}
		ret = t
	}
	if len(o.journal) > 0 {
		at := o.journal[0].At.UnixNano()
		if at >= call {
			call, ret = at, at
		}
	}
	if ret < call {
		ret = call
	}
	return porcupine.Operation{ClientId: 0, Input: in, Call: call, Output: out, Return: ret}
}

// recoveredLater reports, for a pair (-ha), whether o's final r was
// recorded by a later process than the one that wrote it: applied (the
// journal), the agent killed before it recorded the outcome, and its
// recovery asked the device and recorded it after the takeover floor an
// activation takes, so r's last_fence is the device's then, not at the
// write (which the model otherwise checks).
func (c *checker) recoveredLater(o *opHist, r wire.Result) bool {
	if !c.h.Meta.HA || len(o.journal) == 0 {
		return false
	}
	at := o.journal[0].At.UnixNano()
	for _, f := range c.h.Faults {
		if f.Kind == "agent_start" && f.T > at && f.T < r.At.UnixNano() {
			return true
		}
	}
	return false
}

func (c *checker) line(name, note string) {
	c.res.Checks = append(c.res.Checks, CheckLine{Name: name, Violations: c.counts[name], Note: note})
}
