package main

import (
	"os"
	"os/user"
)

// holderName is the `holder` edgectl puts on its commands: who sent them,
// as an operator reads it in the history, the logs and the status page
// ("edgectl/alice@gw-host"), not the random MQTT client ID.
func holderName() string {
	who := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		who = u.Username
	}
	if who == "" {
		who = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return "edgectl/" + who + "@" + host
}
