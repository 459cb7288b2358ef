package sdk

import "testing"

var benchDoc = []byte(`{"device":{"id":"pump-7","type":"pump"},"command":{"op_id":"op-01HZX3K9Q2W8E7R6T5Y4U3I2O1","fence":742,"action":"set","params":{"rpm":1200,"mode":"auto"},"holder":"ctl-a"},"state":{"rpm":1100,"mode":"auto"},"last_fence":741,"now":"2026-11-30T10:00:00Z"}`)

func BenchmarkParseInput(b *testing.B) {
	b.ReportAllocs()
	zeroCopy = true
	defer func() { zeroCopy = false }()
	for b.Loop() {
		in, err := ParseInput(benchDoc)
		if err != nil || in.Command.Action != "set" {
			b.Fatal(err)
		}
	}
}
