package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/store"
)

// fenceCmd is `edge-agent fence reset` (docs/protocol.md §4): offline, it
// sets a poisoned last_fence back and records who, why and when in the
// device's history. The safe procedure is in docs/operations.md ("A
// poisoned fence").
func fenceCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "fence",
		Short: "Operator actions on a device's fence (offline)",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	var dataDir, dev, reason string
	var to int64
	reset := &cobra.Command{
		Use:   "reset",
		Short: "Set a poisoned last_fence back to N, recording who, why and when (the agent must be stopped)",
		Long: `Set a device's last_fence back to N and record the act (who, why, when)
as an audit entry in the device's history, which inspect and the history
API show and retention never deletes.

Dangerous by nature: it re-admits every older generation of controllers.
Follow docs/operations.md ("A poisoned fence"): stop the controllers, let
the agent answer what is queued, stop it, reset, start it, take a new lock
generation and send a barrier before anything else.

Offline only: while an agent holds the store this exits 1 within 2 s.
It refuses while the device has commands that are not final.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case dataDir == "":
				return &exitError{2, errors.New("--data-dir is required")}
			case dev == "":
				return &exitError{2, errors.New("--device is required")}
			case !cmd.Flags().Changed("to") || to < 0:
				return &exitError{2, errors.New("--to N (0 or more) is required")}
			case reason == "":
				return &exitError{2, errors.New("--reason is required: say why, for the audit entry")}
			}
			return fenceReset(cmd, filepath.Join(dataDir, "agent.db"), dev, to, reason)
		},
	}
	reset.Flags().StringVar(&dataDir, "data-dir", "", "the agent's data_dir")
	reset.Flags().StringVar(&dev, "device", "", "the device")
	reset.Flags().Int64Var(&to, "to", 0, "the last_fence to set (below the current one)")
	reset.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit entry)")
	c.AddCommand(reset, floorCmd())
	return c
}

func fenceReset(cmd *cobra.Command, path, dev string, to int64, reason string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("fence reset: %w", err)
	}
	st, err := store.Open(path, &store.Options{OpenTimeout: 1500 * time.Millisecond})
	if err != nil {
		return fmt.Errorf("fence reset %s: %w", path, err)
	}
	st.Start()
	defer st.Close()
	var before store.Device
	if err := st.View(func(tx *store.Tx) error {
		before, err = tx.CheckReset(dev, to)
		return err
	}); err != nil {
		return fmt.Errorf("fence reset: %w", err)
	}
	var o store.Op
	if err := st.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		o, err = tx.ResetFence(dev, to, operator(), reason, time.Now())
		return err
	}); err != nil {
		return fmt.Errorf("fence reset: %w", err)
	}
	if err := st.Close(); err != nil {
		return fmt.Errorf("fence reset: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: last_fence %d -> %d; audit entry %s by %s\n", dev, before.LastFence, to, o.OpID, o.Holder)
	fmt.Fprintln(cmd.OutOrStdout(), "Next: start the agent, take a new lock generation and send a barrier before any command (docs/operations.md, \"A poisoned fence\").")
	return nil
}

// operator names who ran the command: the user of the process's real uid
// at this host, which the kernel vouches for, and, when $SUDO_USER is
// set, what it says, recorded as just that: a variable any caller can
// set (`SUDO_USER=alice edge-agent fence reset ...` as root is root).
func operator() string {
	uid := os.Getuid()
	who := fmt.Sprintf("uid %d", uid)
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		who = fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	host, _ := os.Hostname()
	who += "@" + host
	if s := os.Getenv("SUDO_USER"); s != "" {
		who += fmt.Sprintf(", SUDO_USER=%q", s)
	}
	return who
}
