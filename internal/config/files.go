package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CheckFiles adds a problem for every path the configuration names that
// the agent, started now, would not find: data_dir (created at start when
// missing, so then its nearest existing parent must be a writable
// directory), plugins.dir and each bound plugin's file, and mqtt.tls's
// files. Parse reads the files whose content it checks (password and key
// files); these are opened by the parts that use them, at start, so Parse
// leaves them alone (a configuration is parsed on a machine other than
// its gateway's too). `config check` and `run` call it; nil means no
// problem, else it is Problems.
func (c *Config) CheckFiles() error {
	var p Problems
	c.checkDataDir(&p)
	c.checkPluginFiles(&p)
	for _, f := range []struct{ key, path string }{
		{"mqtt.tls.ca_file", c.MQTT.TLS.CAFile},
		{"mqtt.tls.cert_file", c.MQTT.TLS.CertFile},
		{"mqtt.tls.key_file", c.MQTT.TLS.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if fi, err := os.Stat(f.path); err != nil {
			p.Add(f.key, "%v", err)
		} else if !fi.Mode().IsRegular() {
			p.Add(f.key, "%s is not a regular file", f.path)
		}
	}
	if len(p) == 0 {
		return nil
	}
	return p
}

func (c *Config) checkDataDir(p *Problems) {
	fi, err := os.Stat(c.DataDir)
	switch {
	case err == nil && !fi.IsDir():
		p.Add("data_dir", "%s is not a directory", c.DataDir)
		return
	case err == nil:
		return
	case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		p.Add("data_dir", "%v", err)
		return
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		p.Add("data_dir", "%v", err)
		return
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist) && dir != filepath.Dir(dir):
			continue
		case err != nil:
			p.Add("data_dir", "%s does not exist, and cannot be created: %v", c.DataDir, err)
		case !fi.IsDir():
			p.Add("data_dir", "%s does not exist, and cannot be created: %s is not a directory", c.DataDir, dir)
		case syscall.Access(dir, 2 /* W_OK */) != nil:
			p.Add("data_dir", "%s does not exist, and cannot be created: %s is not writable", c.DataDir, dir)
		}
		return
	}
}

// checkPluginFiles checks plugins.dir and each bound plugin's file, when a
// device binds a plugin (only bound plugins are loaded).
func (c *Config) checkPluginFiles(p *Problems) {
	var bound []int
	for i, d := range c.Devices {
		if d.Policy != nil {
			bound = append(bound, i)
		}
	}
	if len(bound) == 0 {
		return
	}
	if fi, err := os.Stat(c.Plugins.Dir); err != nil {
		p.Add("plugins.dir", "%v (devices[%d] (%s) binds plugin %s)", err, bound[0], c.Devices[bound[0]].ID, c.Devices[bound[0]].Policy.Plugin)
		return
	} else if !fi.IsDir() {
		p.Add("plugins.dir", "%s is not a directory", c.Plugins.Dir)
		return
	}
	for _, i := range bound {
		d := c.Devices[i]
		key := fmt.Sprintf("devices[%d] (%s).policy.plugin", i, d.ID)
		f := filepath.Join(c.Plugins.Dir, d.Policy.Plugin+".wasm")
		fi, err := os.Stat(f)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			p.Add(key, "%q: no file %s in plugins.dir (%s)", d.Policy.Plugin, filepath.Base(f), c.Plugins.Dir)
		case err != nil:
			p.Add(key, "%q: %v", d.Policy.Plugin, err)
		case !fi.Mode().IsRegular():
			p.Add(key, "%q: %s is not a regular file", d.Policy.Plugin, f)
		}
	}
}
