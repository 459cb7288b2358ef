package jws_test

import (
	"fmt"
	"log"

	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

// A controller signs a command with its key (docs/protocol.md §6); the
// agent parses the JWS, picks the public key by kid and verifies it.
func ExampleSign() {
	privPEM, pubPEM, err := jws.GenerateKey()
	if err != nil {
		log.Fatal(err)
	}
	priv, err := jws.ParsePrivateKey(privPEM)
	if err != nil {
		log.Fatal(err)
	}
	cmd := []byte(`{"op_id":"op-1","fence":42,"action":"set","gateway":"gw-1","device":"pump-7"}`)
	msg, err := jws.Sign(priv, "planner-1", cmd)
	if err != nil {
		log.Fatal(err)
	}

	tok, err := jws.Parse(msg)
	if err != nil {
		log.Fatal(err)
	}
	pubs, err := jws.ParsePublicKeys(pubPEM)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(jws.Looks(msg), tok.Header.Kid, tok.Verify(pubs[0]))
	fmt.Println(string(tok.Payload))
	// Output:
	// true planner-1 <nil>
	// {"op_id":"op-1","fence":42,"action":"set","gateway":"gw-1","device":"pump-7"}
}
