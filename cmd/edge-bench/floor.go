package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/store"
)

// floor is the least latency one command can have at one device on this
// machine, measured in the same run as the targets: the agent's command
// path needs two group commits in sequence (the admission that makes the
// write pending, then the outcome) and one device write between them, and
// nothing else it does is required to be sequential.
type floor struct {
	commit, write time.Duration // p50 of one fsynced commit, of one device write
}

func (f floor) total() time.Duration { return 2*f.commit + f.write }

func (f floor) String() string {
	return fmt.Sprintf("floor %s = 2 x commit %s + device write %s",
		f.total().Round(time.Microsecond), f.commit.Round(time.Microsecond), f.write.Round(time.Microsecond))
}

// measureFloor takes n fsynced commits of one small update each on a store
// in dir (bbolt, as the agent's) and n writes through the agent's HTTP
// driver to a firmware simulator in this process, one at a time, and
// returns their medians.
func measureFloor(dir string, n int) (floor, error) {
	var f floor
	st, err := store.Open(filepath.Join(dir, "floor.db"), nil)
	if err != nil {
		return f, err
	}
	st.Start()
	var commits []time.Duration
	for i := range n {
		start := time.Now()
		err := st.Update(context.Background(), func(tx *store.Tx) error {
			return tx.PutDevice("floor", store.Device{LastFence: int64(i + 1), UpdatedAt: start})
		})
		if err != nil {
			st.Close()
			return f, err
		}
		commits = append(commits, time.Since(start))
	}
	if err := st.Close(); err != nil {
		return f, err
	}
	os.Remove(filepath.Join(dir, "floor.db"))

	fw, err := startSimInProcess(1)
	if err != nil {
		return f, err
	}
	defer fw.Close()
	h, err := device.NewHTTP(device.HTTPOptions{Devices: map[string]device.HTTPDevice{
		"d0": {URL: fw.URL(), Idempotent: true, Queryable: true}}})
	if err != nil {
		return f, err
	}
	defer h.Close()
	var writes []time.Duration
	for i := range n {
		start := time.Now()
		res := h.Apply(context.Background(), device.Write{Device: "d0", OpID: "floor-" + strconv.Itoa(i),
			Key: "floor-" + strconv.Itoa(i), Fence: 1, Action: "set", Params: []byte(`{"rpm":100}`)})
		if res.Outcome != device.Applied {
			return f, fmt.Errorf("floor: device write %d: %s", i, res.Reason)
		}
		writes = append(writes, time.Since(start))
	}
	return floor{commit: medianDuration(commits), write: medianDuration(writes)}, nil
}

func medianDuration(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}
