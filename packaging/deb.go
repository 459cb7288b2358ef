package main

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// The maintainer scripts (POSIX sh; bash -n and dash -n clean).
var (
	//go:embed debian/postinst
	postinst string
	//go:embed debian/prerm
	prerm string
	//go:embed debian/postrm
	postrm string
)

// debOptions say what goes into one package.
type debOptions struct {
	Arch       string // Debian architecture: amd64, arm64, armhf
	Version    string // upstream version; a semver pre-release becomes ~pre
	BinDir     string // edge-agent, edgectl, firmware-sim for Arch
	PluginsDir string // *.wasm
	RepoDir    string // configs/, README.md, docs/
	OutDir     string
}

// debArches are the architectures make deb builds, with their GOARCH
// (and GOARM) in the Makefile.
var debArches = map[string]bool{"amd64": true, "arm64": true, "armhf": true}

// Where the package puts things (docs/operations.md, "Installing").
const (
	binDir     = "/usr/bin"
	confFile   = "/etc/edge-agent/agent.yaml"
	unitFile   = "/usr/lib/systemd/system/edge-agent.service"
	pluginsDir = "/usr/lib/edge-agent/plugins"
	docDir     = "/usr/share/doc/edge-agent"
)

var programs = []string{"edge-agent", "edgectl", "firmware-sim"}

// buildDeb writes OutDir/edge-agent_VERSION_ARCH.deb and returns its path.
// Its timestamps are SOURCE_DATE_EPOCH's when set (the Makefile sets
// HEAD's commit time), so a commit packages to the same bytes.
func buildDeb(o debOptions) (string, error) {
	if !debArches[o.Arch] {
		return "", fmt.Errorf("--arch %q: want amd64, arm64 or armhf", o.Arch)
	}
	file := func(src, dst string, mode os.FileMode) *files.Content {
		return &files.Content{Source: src, Destination: dst,
			FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode}}
	}
	var contents files.Contents
	for _, p := range programs {
		src := filepath.Join(o.BinDir, p)
		if _, err := os.Stat(src); err != nil {
			return "", fmt.Errorf("--bin: %w", err)
		}
		contents = append(contents, file(src, binDir+"/"+p, 0o755))
	}
	plugins, err := filepath.Glob(filepath.Join(o.PluginsDir, "*.wasm"))
	if err != nil {
		return "", err
	}
	if len(plugins) == 0 {
		return "", fmt.Errorf("--plugins %s: no .wasm files (make plugins)", o.PluginsDir)
	}
	sort.Strings(plugins)
	for _, p := range plugins {
		contents = append(contents, file(p, pluginsDir+"/"+filepath.Base(p), 0o644))
	}
	conf := file(filepath.Join(o.RepoDir, "configs/agent-production.yaml"), confFile, 0o644)
	conf.Type = files.TypeConfigNoReplace // a conffile: dpkg keeps the administrator's edits
	contents = append(contents,
		conf,
		file(filepath.Join(o.RepoDir, "configs/edge-agent.service"), unitFile, 0o644),
		file(filepath.Join(o.RepoDir, "README.md"), docDir+"/README.md", 0o644),
		file(filepath.Join(o.RepoDir, "docs/operations.md"), docDir+"/operations.md", 0o644),
		file(filepath.Join(o.RepoDir, "docs/config.md"), docDir+"/config.md", 0o644),
	)
	for _, ex := range []string{"agent.yaml", "agent-mosquitto.yaml", "agent-policies.yaml", "mosquitto.conf"} {
		contents = append(contents, file(filepath.Join(o.RepoDir, "configs", ex), docDir+"/examples/"+ex, 0o644))
	}
	for _, c := range contents {
		if _, err := os.Stat(c.Source); err != nil {
			return "", err
		}
	}
	scripts, err := os.MkdirTemp("", "edge-agent-deb")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scripts)
	var sc nfpm.Scripts
	for _, s := range []struct {
		name, body string
		to         *string
	}{{"postinst", postinst, &sc.PostInstall}, {"prerm", prerm, &sc.PreRemove}, {"postrm", postrm, &sc.PostRemove}} {
		p := filepath.Join(scripts, s.name)
		if err := os.WriteFile(p, []byte(s.body), 0o755); err != nil {
			return "", err
		}
		*s.to = p
	}

	info := nfpm.WithDefaults(&nfpm.Info{
		Name:       "edge-agent",
		Arch:       o.Arch,
		Platform:   "linux",
		Version:    o.Version,
		Release:    "1",
		Section:    "net",
		Priority:   "optional",
		Maintainer: "edge-agent maintainers <edge-agent@example.invalid>",
		Homepage:   "https://github.com/edge-agent/edge-agent",
		Description: "fencing gateway between controllers and device firmware\n" +
			"edge-agent receives fenced commands over MQTT, keeps each device's highest\n" +
			"accepted fencing token durably, rejects stale tokens, runs each operation\n" +
			"at most once, lets WebAssembly policies veto unsafe commands, and forwards\n" +
			"what passes to the device firmware over HTTP. Runs as a hardened systemd\n" +
			"service; includes edgectl and the firmware simulator.",
		Overridables: nfpm.Overridables{
			Depends:  []string{"adduser", "procps"}, // procps: /bin/kill, the unit's ExecReload
			Suggests: []string{"mosquitto"},
			Contents: contents,
			Scripts:  sc,
		},
	})
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(o.OutDir, deb.Default.ConventionalFileName(info))
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("nfpm: %w", err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return out, os.Rename(tmp, out)
}
