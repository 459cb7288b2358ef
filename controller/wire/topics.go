package wire

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// DefaultPrefix is mqtt.topic_prefix's default.
const DefaultPrefix = "edge"

var (
	deviceIDRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	opIDRe     = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	actionRe   = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
)

// ValidDeviceID reports whether s is a device ID of docs/protocol.md §1.
func ValidDeviceID(s string) bool { return deviceIDRe.MatchString(s) }

// ValidOpID reports whether s is a valid op_id.
func ValidOpID(s string) bool { return opIDRe.MatchString(s) }

// ValidAction reports whether s is a valid action name.
func ValidAction(s string) bool { return actionRe.MatchString(s) }

// ValidPublishTopic reports whether s may be published to: non-empty,
// UTF-8, at most 65535 bytes, no wildcard and no NUL.
func ValidPublishTopic(s string) bool {
	return s != "" && len(s) <= 65535 && utf8.ValidString(s) &&
		!strings.ContainsAny(s, "+#\x00")
}

// CmdTopic is the topic a device's commands are published on.
func CmdTopic(prefix, gw, dev string) string { return prefix + "/" + gw + "/devices/" + dev + "/cmd" }

// CmdFilter is the agent's subscription: every device's cmd topic.
func CmdFilter(prefix, gw string) string { return prefix + "/" + gw + "/devices/+/cmd" }

// ResultTopic is where Results go when a command has no reply_to.
func ResultTopic(prefix, gw, dev string) string {
	return prefix + "/" + gw + "/devices/" + dev + "/result"
}

// ResultFilter matches every device's result topic.
func ResultFilter(prefix, gw string) string { return prefix + "/" + gw + "/devices/+/result" }

// StateTopic is a device's retained DeviceState topic.
func StateTopic(prefix, gw, dev string) string {
	return prefix + "/" + gw + "/devices/" + dev + "/state"
}

// StateFilter matches every device's state topic.
func StateFilter(prefix, gw string) string { return prefix + "/" + gw + "/devices/+/state" }

// StatusTopic is the gateway's retained status topic.
func StatusTopic(prefix, gw string) string { return prefix + "/" + gw + "/status" }

// DeviceFromCmdTopic returns the device ID of a cmd topic of this gateway,
// and false when the topic is not one (or the ID segment is empty).
func DeviceFromCmdTopic(prefix, gw, topic string) (string, bool) {
	head := prefix + "/" + gw + "/devices/"
	if !strings.HasPrefix(topic, head) || !strings.HasSuffix(topic, "/cmd") {
		return "", false
	}
	dev := topic[len(head) : len(topic)-len("/cmd")]
	if dev == "" || strings.Contains(dev, "/") {
		return "", false
	}
	return dev, true
}
