// Command edge-agent is the fencing gateway: `run`, `backup`, `inspect`,
// `compact`, `policy test`, `fence reset`, `fence floor`, `config check`,
// `version` (docs/protocol.md §4, §7). main is wiring only.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/buildinfo"
	"github.com/edge-agent/edge-agent/internal/manpage"
)

// Version, Commit and Date are set at build time by the Makefile
// (-ldflags "-X main.Version=... -X main.Commit=... -X main.Date=...");
// `edge-agent version` prints them (internal/buildinfo).
var (
	Version = "0.1.0-dev"
	Commit  = ""
	Date    = ""
)

// versionLine is the answer to `version` and `--version`.
func versionLine() string { return buildinfo.Line("edge-agent", Version, Commit, Date) }

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
		Version:       Version,
	}
	root.SetVersionTemplate(versionLine() + "\n")
	// Usage errors (an unknown flag or command, stray arguments) exit 2.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{2, err} })
	root.Args = usageArgs(cobra.NoArgs) // an unknown command
	root.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	root.AddCommand(runCmd(), backupCmd(), inspectCmd(), compactCmd(), policyCmd(), fenceCmd(), configCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, build date, Go version and OS/arch (also --version)",
		Args:  usageArgs(cobra.NoArgs),
		Run:   func(*cobra.Command, []string) { fmt.Println(versionLine()) },
	})
	root.AddCommand(manpage.Command(root, Version))
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
