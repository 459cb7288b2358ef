package sdk

import (
	"strings"
	"testing"
)

func TestParseInput(t *testing.T) {
	in, err := ParseInput(benchDoc)
	if err != nil {
		t.Fatal(err)
	}
	if in.Device.ID != "pump-7" || in.Device.Type != "pump" || in.Command.OpID != "op-01HZX3K9Q2W8E7R6T5Y4U3I2O1" ||
		in.Command.Fence != 742 || in.Command.Action != "set" || in.Command.Holder != "ctl-a" || in.LastFence != 741 {
		t.Fatalf("%+v", in)
	}
	if rpm, ok := in.Command.Params.Float("rpm"); !ok || rpm != 1200 {
		t.Fatalf("params.rpm = %v %v", rpm, ok)
	}
	if mode, ok := in.State.Str("mode"); !ok || mode != "auto" {
		t.Fatalf("state.mode = %q %v", mode, ok)
	}
	if got := in.Now().Format("15:04"); got != "10:00" {
		t.Fatalf("now = %s", got)
	}
	if _, ok := in.Member("x"); ok {
		t.Fatal("member of an empty group")
	}
}

func TestObject(t *testing.T) {
	o, err := ParseObject([]byte(` {"a": 1.5, "b" : "x\"y\u00e9", "c":[1, {"d":2}], "e":true, "f":null, "g\u0041":{"h":[]}, "i":-7} `))
	if err != nil {
		t.Fatal(err)
	}
	if o.Len() != 7 {
		t.Fatalf("len %d", o.Len())
	}
	if f, _ := o.Float("a"); f != 1.5 {
		t.Fatal(f)
	}
	if s, _ := o.Str("b"); s != `x"yé` {
		t.Fatal(s)
	}
	if b, ok := o.Bool("e"); !b || !ok {
		t.Fatal("e")
	}
	if v, _ := o.Get("f"); v.Kind() != Null {
		t.Fatal("f")
	}
	if inner, ok := o.Obj("gA"); !ok || !inner.Has("h") {
		t.Fatal("escaped key")
	}
	if n, ok := o.Int("i"); !ok || n != -7 {
		t.Fatal(n)
	}
	if _, ok := o.Int("a"); ok {
		t.Fatal("1.5 is not an integer")
	}
	arr, ok := mustGet(t, o, "c").Array()
	if !ok || len(arr) != 2 || string(arr[1].Raw()) != `{"d":2}` {
		t.Fatalf("array %v", arr)
	}
	if strings.Join(o.Keys(), ",") != "a,b,c,e,f,gA,i" {
		t.Fatal(o.Keys())
	}
	if err := o.Only("a", "b", "c", "e", "f", "gA"); err == nil || !strings.Contains(err.Error(), `"i"`) {
		t.Fatalf("Only: %v", err)
	}
	w := o.With("a", Num(3000)).With("z", Str("new"))
	if string(w.Raw()) != `{"a":3000,"b":"x\"y\u00e9","c":[1, {"d":2}],"e":true,"f":null,"g\u0041":{"h":[]},"i":-7,"z":"new"}` {
		t.Fatalf("With: %s", w.Raw())
	}
	if f, _ := o.Float("a"); f != 1.5 {
		t.Fatal("With changed the original")
	}
	for _, bad := range []string{`{`, `{"a":}`, `[1]`, `{"a":1}x`, `{"a" 1}`} {
		if _, err := ParseObject([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	var empty Object
	if empty.Len() != 0 || string(empty.Raw()) != "{}" || string(empty.With("k", Int(1)).Raw()) != `{"k":1}` {
		t.Fatal("empty object")
	}
}

func mustGet(t *testing.T, o Object, k string) Value {
	v, ok := o.Get(k)
	if !ok {
		t.Fatalf("no %s", k)
	}
	return v
}

func TestDecisionJSON(t *testing.T) {
	for _, c := range []struct {
		d    Decision
		want string
	}{
		{Allow(), `{"allow":true}`},
		{Deny("rpm \"4000\"\n"), `{"allow":false,"reason":"rpm \"4000\"\n"}`},
		{Rewrite(Object{}.With("rpm", Num(2.5))), `{"allow":true,"params":{"rpm":2.5}}`},
	} {
		if got := string(c.d.AppendJSON(nil)); got != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}
