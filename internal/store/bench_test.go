package store

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// BenchmarkCommit compares this store's group commit with bbolt's db.Batch
// for W concurrent writers (devices), each commit fsynced. Reported:
// commits/s as seen by the writers (ops/s) and fsyncs per op.
func BenchmarkCommit(b *testing.B) {
	for _, w := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("group/writers=%d", w), func(b *testing.B) {
			s := openTest(b, nil)
			before := s.Commits()
			runWriters(b, w, func(dev string, i int64) error {
				return s.Update(context.Background(), func(tx *Tx) error {
					return tx.PutDevice(dev, Device{LastFence: i})
				})
			})
			b.ReportMetric(float64(s.Commits()-before)/float64(b.N), "fsyncs/op")
		})
		b.Run(fmt.Sprintf("batch/writers=%d", w), func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "batch.db"), 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucketDevices); return err })
			runWriters(b, w, func(dev string, i int64) error {
				return db.Batch(func(tx *bolt.Tx) error {
					return tx.Bucket(bucketDevices).Put([]byte(dev), encodeDevice(&Device{LastFence: i}))
				})
			})
		})
	}
}

func runWriters(b *testing.B, w int, write func(dev string, i int64) error) {
	runWritersAs(b, w, "commits/s", write)
}

// runWritersAs runs w writers until b.N writes and reports writes/s as unit.
func runWritersAs(b *testing.B, w int, unit string, write func(dev string, i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			dev := fmt.Sprintf("dev-%d", g)
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := write(dev, i); err != nil {
					b.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
}

// BenchmarkCommandPath replays the store writes of one command on the
// agent's command path (admission, pending write, outcome with its Result in
// the outbox, the outbox entry's removal once published) for D devices, one
// command in flight each, on a store that already holds history. Reported:
// commands/s and the bbolt pages written per commit, the cost that grows
// with the number of devices.
func BenchmarkCommandPath(b *testing.B) {
	for _, devs := range []int{1, 64} {
		b.Run(fmt.Sprintf("devices=%d", devs), func(b *testing.B) {
			s := openTest(b, nil)
			pad := json.RawMessage(`{"seq":1,"pad":"` + strings.Repeat("x", 120) + `"}`)
			cmd := func(dev string, i int64) error {
				op := fmt.Sprintf("1764489600-%s-%d", dev, i)
				o := Op{Device: dev, OpID: op, Status: OpQueued, Fence: 1, Action: "set", Params: pad,
					ReplyTo: "bench/reply", ContentHash: make([]byte, 32), Worker: dev, ReceivedAt: time.Now()}
				if err := s.Update(context.Background(), func(tx *Tx) error {
					seq, err := tx.InboxAppend(dev, dev, op)
					if err != nil {
						return err
					}
					o.InboxSeq = seq
					return tx.PutOp(o)
				}); err != nil {
					return err
				}
				o.Status, o.ParamsSent, o.Key, o.Keys = OpPending, pad, op+".1.abcd", 1
				if err := s.Update(context.Background(), func(tx *Tx) error {
					d, _, err := tx.Device(dev)
					if err != nil {
						return err
					}
					if d.LastFence < 1 {
						d.LastFence = 1
						if err := tx.PutDevice(dev, d); err != nil {
							return err
						}
					}
					return tx.PutOp(o)
				}); err != nil {
					return err
				}
				var seq uint64
				if err := s.Update(context.Background(), func(tx *Tx) error {
					d, _, err := tx.Device(dev)
					if err != nil {
						return err
					}
					d.State, d.LastOpID, d.UpdatedAt = pad, op, time.Now()
					if err := tx.PutDevice(dev, d); err != nil {
						return err
					}
					o.Status, o.Result, o.Code, o.Reason, o.Output, o.DecidedAt = OpFinal, wire.StatusApplied, wire.CodeOK, dev+" applied set", pad, time.Now()
					if err := tx.PutOp(o); err != nil {
						return err
					}
					e, err := tx.OutboxAppend(Outbox{Topic: "bench/reply", Payload: pad, Device: dev, OpID: op})
					seq = e.Seq
					if err != nil {
						return err
					}
					return tx.InboxDelete(o.Worker, o.InboxSeq)
				}); err != nil {
					return err
				}
				return s.Update(context.Background(), func(tx *Tx) error { return tx.OutboxDelete(seq) })
			}
			// History: 64 devices' worth of earlier commands.
			for i := int64(0); i < 20000; i += 500 {
				if err := s.Update(context.Background(), func(tx *Tx) error {
					for j := i; j < i+500; j++ {
						dev := fmt.Sprintf("dev-%d", j%64)
						o := Op{Device: dev, OpID: fmt.Sprintf("1764400000-%s-%d", dev, j), Status: OpFinal, Fence: 1, Action: "set",
							Params: pad, ParamsSent: pad, Output: pad, ContentHash: make([]byte, 32), Worker: dev,
							Result: wire.StatusApplied, Code: wire.CodeOK, ReceivedAt: time.Now(), DecidedAt: time.Now()}
						if err := tx.PutOp(o); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			st := s.db.Stats()
			commits, writes := s.Commits(), st.TxStats.GetWrite()
			runWritersAs(b, devs, "cmds/s", cmd)
			c := s.Commits() - commits
			st = s.db.Stats()
			b.ReportMetric(float64(st.TxStats.GetWrite()-writes)/float64(c), "pages/commit")
			b.ReportMetric(float64(c)/float64(b.N), "commits/cmd")
		})
	}
}
