//go:build !wasip1

package sdk

import "fmt"
import "os"

// hostLog, outside a wasm guest (tests of Decide functions on the host),
// prints to stderr.
func hostLog(level Level, msg string) {
	fmt.Fprintf(os.Stderr, "plugin log %d: %s\n", level, msg)
}
