// Command edge-agent is the fencing gateway: `run`, `inspect`, `policy
// test`, `version` (PROTOCOL.md §4). main is wiring only.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "0.1.0-dev"

// exitError carries an exit status: 2 for configuration errors, 1 otherwise.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func configErr(err error) error { return &exitError{2, err} }

func main() {
	root := &cobra.Command{
		Use:           "edge-agent",
		Short:         "Fencing gateway between upstream controllers and device firmware",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(runCmd(), inspectCmd(), policyCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(*cobra.Command, []string) { fmt.Println("edge-agent", Version) },
	})
	err := root.Execute()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "edge-agent:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	// cobra's own usage errors (unknown flag, missing argument) are usage errors: 2.
	if isUsage(err) {
		os.Exit(2)
	}
	os.Exit(1)
}
