// Command packaging builds edge-agent's Debian package with nfpm, used as a
// library. It is a module of its own so nfpm and its dependencies stay out
// of the agent's go.mod and binaries; `make deb` runs it:
//
//	go run . --arch amd64 --version 1.2.0 --bin ../dist/deb/amd64/bin --man ../dist/deb/man --plugins ../plugins/build --repo .. --out ../dist
//
// It prints the path of the .deb it wrote. Exit status 2 for a usage
// error, 1 for a failure.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	var o debOptions
	flag.StringVar(&o.Arch, "arch", "amd64", "Debian architecture: amd64, arm64 or armhf")
	flag.StringVar(&o.Version, "version", "", "package version (the Makefile's VERSION), e.g. 1.2.0 or 0.1.0-dev")
	flag.StringVar(&o.BinDir, "bin", "", "directory holding edge-agent, edgectl and firmware-sim built for --arch")
	flag.StringVar(&o.ManDir, "man", "", "directory of the man pages (*.1) `edge-agent man DIR` and `edgectl man DIR` wrote")
	flag.StringVar(&o.PluginsDir, "plugins", "", "directory of the policy plugins (*.wasm) to ship")
	flag.StringVar(&o.RepoDir, "repo", "..", "the repository's root (configs/, README.md, docs/)")
	flag.StringVar(&o.OutDir, "out", ".", "where to write the .deb")
	flag.Parse()
	if flag.NArg() > 0 || o.Version == "" || o.BinDir == "" || o.ManDir == "" || o.PluginsDir == "" {
		fmt.Fprintln(os.Stderr, "packaging: --version, --bin, --man and --plugins are required; no arguments")
		flag.Usage()
		os.Exit(2)
	}
	path, err := buildDeb(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "packaging:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}
