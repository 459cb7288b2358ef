package main

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

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
	// /usr/share/doc/edge-agent/copyright (Debian's machine-readable format).
	//go:embed debian/copyright
	copyright string
	// /usr/share/lintian/overrides/edge-agent: the tags that are right for
	// a Go program, each with its reason.
	//go:embed debian/lintian-overrides
	lintianOverrides string
)

// debOptions say what goes into one package.
type debOptions struct {
	Arch       string // Debian architecture: amd64, arm64, armhf
	Version    string // upstream version; a semver pre-release becomes ~pre
	BinDir     string // edge-agent, edgectl, firmware-sim for Arch
	ManDir     string // *.1, as `edge-agent man DIR` and `edgectl man DIR` write them
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
	libDir     = "/usr/lib/edge-agent"
	confFile   = "/etc/edge-agent/agent.yaml"
	unitFile   = "/usr/lib/systemd/system/edge-agent.service"
	pluginsDir = "/usr/lib/edge-agent/plugins"
	docDir     = "/usr/share/doc/edge-agent"
	manDir     = "/usr/share/man/man1"
	overrides  = "/usr/share/lintian/overrides/edge-agent"
	maintainer = "edge-agent maintainers <edge-agent@example.invalid>"
)

// programs and where each goes: the firmware simulator is for trying the
// agent out, not a gateway's tool, so it stays off PATH.
var programs = map[string]string{
	"edge-agent":   binDir + "/edge-agent",
	"edgectl":      binDir + "/edgectl",
	"firmware-sim": libDir + "/firmware-sim",
}

// manPages are the pages that must be there: those of the programs on
// PATH (their commands' pages come with them).
var manPages = []string{"edge-agent.1", "edgectl.1"}

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
	gen, err := os.MkdirTemp("", "edge-agent-deb")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(gen)
	epoch := time.Now()
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return "", fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", e, err)
		}
		epoch = time.Unix(n, 0)
	}
	var contents files.Contents
	names := make([]string, 0, len(programs))
	for p := range programs {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		src := filepath.Join(o.BinDir, p)
		if _, err := os.Stat(src); err != nil {
			return "", fmt.Errorf("--bin: %w", err)
		}
		contents = append(contents, file(src, programs[p], 0o755))
	}
	for _, p := range manPages {
		if _, err := os.Stat(filepath.Join(o.ManDir, p)); err != nil {
			return "", fmt.Errorf("--man: %w (edge-agent man DIR, edgectl man DIR)", err)
		}
	}
	pages, err := filepath.Glob(filepath.Join(o.ManDir, "*.1"))
	if err != nil {
		return "", err
	}
	sort.Strings(pages)
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		gz := filepath.Join(gen, filepath.Base(p)+".gz")
		if err := writeGzip(gz, b); err != nil {
			return "", err
		}
		contents = append(contents, file(gz, manDir+"/"+filepath.Base(gz), 0o644))
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
	for _, ex := range examples {
		contents = append(contents, file(filepath.Join(o.RepoDir, "configs", ex), docDir+"/examples/"+ex, 0o644))
	}
	for _, c := range contents {
		if _, err := os.Stat(c.Source); err != nil {
			return "", err
		}
	}
	for _, g := range []struct{ name, body, dst string }{
		{"copyright", copyright, docDir + "/copyright"},
		{"lintian-overrides", lintianOverrides, overrides},
	} {
		p := filepath.Join(gen, g.name)
		if err := os.WriteFile(p, []byte(g.body), 0o644); err != nil {
			return "", err
		}
		contents = append(contents, file(p, g.dst, 0o644))
	}
	var sc nfpm.Scripts
	for _, s := range []struct {
		name, body string
		to         *string
	}{{"postinst", postinst, &sc.PostInstall}, {"prerm", prerm, &sc.PreRemove}, {"postrm", postrm, &sc.PostRemove}} {
		p := filepath.Join(gen, s.name)
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
		Maintainer: maintainer,
		Homepage:   "https://github.com/edge-agent/edge-agent",
		Description: "fencing gateway between controllers and device firmware\n" +
			"edge-agent receives fenced commands over MQTT, keeps each device's highest\n" +
			"accepted fencing token durably, rejects stale tokens, runs each operation\n" +
			"at most once, lets WebAssembly policies veto unsafe commands, and forwards\n" +
			"what passes to the device firmware over HTTP or Modbus (TCP, or RTU over\n" +
			"TCP). It runs as a hardened systemd service, with an embedded MQTT broker\n" +
			"or another one (mosquitto). Includes edgectl, the operator's tool, and a\n" +
			"firmware simulator for trying it out (/usr/lib/edge-agent/firmware-sim).",
		Overridables: nfpm.Overridables{
			Depends:  []string{"adduser", "procps"}, // procps: /bin/kill, the unit's ExecReload
			Suggests: []string{"mosquitto"},
			Contents: contents,
			Scripts:  sc,
		},
	})
	// Debian's changelog of a package built outside Debian: one entry, for
	// this version, dated as the rest of the package.
	cl := filepath.Join(gen, "changelog.Debian.gz")
	if err := writeGzip(cl, []byte(fmt.Sprintf("edge-agent (%s) unstable; urgency=medium\n\n"+
		"  * Built by packaging/ from the edge-agent repository; its changes are\n"+
		"    the repository's history (git log).\n\n -- %s  %s\n",
		debVersion(info), maintainer, epoch.UTC().Format(time.RFC1123Z)))); err != nil {
		return "", err
	}
	info.Contents = append(info.Contents, file(cl, docDir+"/changelog.Debian.gz", 0o644))
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

// examples go to /usr/share/doc/edge-agent/examples.
var examples = []string{"agent.yaml", "agent-coordinated.yaml", "agent-mosquitto.yaml", "agent-policies.yaml",
	"agent-modbus.yaml", "mosquitto.conf", "mosquitto.acl"}

// debVersion is the package's version as nfpm writes it into the control
// file: 1.2.0-rc1 becomes 1.2.0~rc1-1.
func debVersion(info *nfpm.Info) string {
	v := info.Version
	if info.Prerelease != "" {
		v += "~" + info.Prerelease
	}
	if info.VersionMetadata != "" {
		v += "+" + info.VersionMetadata
	}
	return v + "-" + info.Release
}

// writeGzip writes b to path compressed as `gzip -9n` does: no name, no
// time, so the package stays reproducible.
func writeGzip(path string, b []byte) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(b); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
