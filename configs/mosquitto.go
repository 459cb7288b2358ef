package configs

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"strings"
)

// MosquittoConf is configs/mosquitto.conf, the broker configuration the
// project ships and tests against.
//
//go:embed mosquitto.conf
var MosquittoConf []byte

// LocalMosquittoConf is MosquittoConf for a broker of one's own on this
// machine (tests, benchmarks): its one listener moved to 127.0.0.1:port,
// persistence_location to dataDir, log_dest to logDest, pid_file dropped,
// extra lines appended (a log_type among them replaces the shipped ones),
// and "user root" when asRoot (else mosquitto drops to the mosquitto user,
// who cannot write a temporary directory).
func LocalMosquittoConf(port int, dataDir, logDest string, asRoot bool, extra ...string) ([]byte, error) {
	var out bytes.Buffer
	out.WriteString("# generated from configs/mosquitto.conf\n")
	sawListener, sawPersistence := false, false
	ownLogTypes := false
	for _, l := range extra {
		ownLogTypes = ownLogTypes || strings.HasPrefix(l, "log_type ")
	}
	sc := bufio.NewScanner(bytes.NewReader(MosquittoConf))
	for sc.Scan() {
		line := sc.Text()
		key := ""
		if f := strings.Fields(line); len(f) > 0 {
			key = f[0]
		}
		switch key {
		case "listener":
			if sawListener {
				return nil, fmt.Errorf("configs/mosquitto.conf: more than one listener; exactly one can be moved")
			}
			sawListener = true
			fmt.Fprintf(&out, "listener %d 127.0.0.1\n", port)
		case "persistence_location":
			sawPersistence = true
			fmt.Fprintf(&out, "persistence_location %s/\n", strings.TrimSuffix(dataDir, "/"))
		case "log_dest", "pid_file", "user":
			// replaced below
		case "log_type":
			if !ownLogTypes {
				out.WriteString(line + "\n")
			}
		default:
			out.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !sawListener || !sawPersistence {
		return nil, fmt.Errorf("configs/mosquitto.conf: needs a listener and a persistence_location line")
	}
	fmt.Fprintf(&out, "log_dest %s\n", logDest)
	for _, l := range extra {
		out.WriteString(l + "\n")
	}
	if asRoot {
		out.WriteString("user root\n")
	}
	return out.Bytes(), nil
}
