// Package chaos is the chaos campaign's record and its judge (the campaign
// itself, which runs the processes and injects the faults, is
// cmd/edge-chaos): the history a run writes (History: controllers' and the
// observer's Events, FaultRecords, the firmware's journal, RunMeta), its
// files (OpenLines, ReadLines, LoadHistory), and the checker (Check): the
// direct checks per operation and against the firmware's journal, and a
// porcupine model of each device as a fenced at-most-once register.
package chaos
