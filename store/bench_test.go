package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	bolt "go.etcd.io/bbolt"
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
					return putJSON(tx.Bucket(bucketDevices), []byte(dev), Device{LastFence: i})
				})
			})
		})
	}
}

func runWriters(b *testing.B, w int, write func(dev string, i int64) error) {
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
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}
