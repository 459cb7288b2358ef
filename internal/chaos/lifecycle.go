package chaos

import (
	"fmt"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The agent's lifecycle in a history (faults.jsonl): the moments its store
// lost what it knew (its data directory wiped, an older backup restored),
// the fence floors it reported, and the clones started beside it.
//
// A loss ends a memory epoch. The Results of one op_id are checked for
// agreement within an epoch ("results per operation", "final means
// final": invariant 8 holds while the record is kept); across epochs a
// store that forgot an op may answer it otherwise (a resend after a wipe
// is stale_fence, the floor's doing), and a Result published again from a
// restored outbox, identical to one seen before, says nothing new. What
// reached the hardware is checked across epochs as ever: the journal's
// fence order, at most once, and the porcupine model, in which each floor
// raises last_fence. An operation invoked before a loss with no recorded
// final seen before it is lost: its Result may have gone with the store,
// so it is open in the model (applied if the journal has it) and exempt
// from "every command final" and from "nothing rejected/failed applied".
// Where the loss's record lists what the store held unanswered (its inbox
// and outbox, read by the campaign from the stopped agent's store), only
// those are lost: a command the broker acknowledged that never reached
// the store is lost by the agent, not by the loss.
const (
	KindMemoryLost = "memory_lost" // target: how (wipe, restore)
	KindFenceFloor = "fence_floor" // phase observed, target the device, detail FloorDetail
	KindClone      = "agent_clone" // its end's detail begins "refused" or "NOT refused"
)

// LostDetail is a memory_lost record's detail: the op_ids the store
// held unanswered (its inbox and outbox) when it was lost.
func LostDetail(ops []string) string { return "unanswered: " + strings.Join(ops, " ") }

// LostDevicesDetail is a memory_lost record's detail in a fleet (one
// gateway's store lost, or a device moved to another gateway): the loss
// is of those devices only; detail is LostDetail's, or "" (any operation
// of theirs not final by then may be lost).
func LostDevicesDetail(devs []string, detail string) string {
	return "devices: " + strings.Join(devs, " ") + "; " + detail
}

// FloorDetail is a fence_floor record's detail: the floor the agent
// reported, and the last time (Unix ns) it reported the value before (0:
// never), so the floor was taken between that time and the record's.
func FloorDetail(floor, since int64) string { return fmt.Sprintf("floor %d since %d", floor, since) }

// loss is one loss of the store's memory: when, and the operations it
// held unanswered (nil: not known, any not final by then), and the
// devices whose memory it was (nil: every device; a fleet's gateway
// forgets its own devices only).
type loss struct {
	t    int64
	ops  map[string]bool
	devs map[string]bool
}

func (l loss) covers(dev string) bool { return l.devs == nil || l.devs[dev] }

type floorRec struct {
	dev         string
	floor       int64
	since, seen int64
}

// lifecycle reads the losses and the floors from the faults.
func (c *checker) lifecycle() {
	for _, f := range c.h.Faults {
		switch f.Kind {
		case KindMemoryLost:
			l := loss{t: f.T}
			detail := f.Detail
			if rest, ok := strings.CutPrefix(detail, "devices:"); ok {
				devs, tail, _ := strings.Cut(rest, ";")
				l.devs = map[string]bool{}
				for _, d := range strings.Fields(devs) {
					l.devs[d] = true
				}
				detail = strings.TrimSpace(tail)
			}
			if rest, ok := strings.CutPrefix(detail, "unanswered:"); ok {
				l.ops = map[string]bool{}
				for _, op := range strings.Fields(rest) {
					l.ops[op] = true
				}
			}
			c.lossRecs = append(c.lossRecs, l)
		case KindFenceFloor:
			var r floorRec
			if _, err := fmt.Sscanf(f.Detail, "floor %d since %d", &r.floor, &r.since); err == nil {
				r.dev, r.seen = f.Target, f.T
				c.floors = append(c.floors, r)
			}
		}
	}
	sort.Slice(c.lossRecs, func(i, j int) bool { return c.lossRecs[i].t < c.lossRecs[j].t })
}

// epoch is the number of dev's losses before t.
func (c *checker) epoch(dev string, t int64) int {
	n := 0
	for _, l := range c.lossRecs {
		if l.t > t {
			break
		}
		if l.covers(dev) {
			n++
		}
	}
	return n
}

// markLost marks the operations whose memory a loss may have taken.
func (c *checker) markLost() {
	for _, o := range c.ops {
		if o.invoked == 0 {
			continue
		}
		for _, l := range c.lossRecs {
			if o.invoked >= l.t || l.ops != nil && !l.ops[o.id] || !l.covers(o.dev) {
				continue
			}
			if t, _, ok := o.finalAt(true); !ok || t >= l.t {
				o.lost = true
				c.res.Lost++
				break
			}
		}
	}
}

// floorOps are dev's floors as porcupine operations: last_fence raised to
// max(last_fence, floor), somewhere between the last report of the value
// before and the report of the floor.
func (c *checker) floorOps(dev string) []porcupine.Operation {
	var out []porcupine.Operation
	for _, r := range c.floors {
		if r.dev != dev {
			continue
		}
		call := r.since
		if call == 0 {
			call = 1 // first report: taken before anything ran, or later
		}
		out = append(out, porcupine.Operation{Input: opIn{id: fmt.Sprintf("fence-floor %d", r.floor), fence: r.floor, floor: true},
			Call: call, Output: opOut{open: true}, Return: r.seen})
	}
	return out
}

// checkClones: every clone started beside the agent was refused (exit 1,
// naming the registration) while the agent kept serving (PROTOCOL §7).
func (c *checker) checkClones() {
	const name = "one agent per gateway (clones)"
	refused, skipped := 0, 0
	for _, f := range c.h.Faults {
		if f.Kind != KindClone || f.Phase != "end" {
			continue
		}
		switch {
		case strings.HasPrefix(f.Detail, "refused"):
			refused++
		case strings.HasPrefix(f.Detail, "NOT refused"):
			c.counts[name]++
			c.res.Violations = append(c.res.Violations, Violation{Check: name, T: f.T, Msg: "a clone of the gateway: " + f.Detail,
				Window: []string{c.h.Meta.Stamp(f.T) + "  " + f.Detail}})
		default:
			skipped++
		}
	}
	c.line(name, fmt.Sprintf("%d refused, %d not started", refused, skipped))
}
