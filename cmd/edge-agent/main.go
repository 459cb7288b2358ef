// Command edge-agent is the fencing gateway: `run`, `inspect`, `policy
// test`, `fence reset`, `version` (docs/protocol.md §4). main is wiring
// only.
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
	// Usage errors (an unknown flag or command, stray arguments) exit 2.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{2, err} })
	root.Args = usageArgs(cobra.NoArgs) // an unknown command
	root.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	root.AddCommand(runCmd(), inspectCmd(), policyCmd(), fenceCmd(), configCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  usageArgs(cobra.NoArgs),
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
	os.Exit(1)
}

// usageArgs makes an argument check's failure a usage error (exit 2).
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			return &exitError{2, err}
		}
		return nil
	}
}
