package disagg

import (
	"bytes"
	"strconv"
	"testing"
)

// TestBootstrapFields checks both SGLang requests against mini_lb.py _forward_to_backend
// (modified_request.update({"bootstrap_host": hostname, "bootstrap_port": bootstrap_port,
// "bootstrap_room": _generate_bootstrap_room()}), posted unchanged to the prefill and the decode server).
func TestBootstrapFields(t *testing.T) {
	py := startPython(t)
	room := NewRoom()
	for _, c := range clientBodies {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			o, err := Scan(body)
			if err != nil {
				t.Fatal(err)
			}
			b := splice(body, o, AppendBootstrap(nil, o, "10.0.3.17", 8998, room))
			py.check(t, b)
			got, want := decode(t, b), miniLB(decode(t, body), "10.0.3.17", 8998.0, float64(room))
			// float64 cannot hold every room: compare its digits.
			suffixEnd := len(b) - (len(body) - o.End)
			if !bytes.HasSuffix(b[:suffixEnd], []byte(`"bootstrap_room":`+strconv.FormatUint(room, 10))) {
				t.Fatalf("room %d not at the end of the suffix in %s", room, b)
			}
			sameRequest(t, got, want)
		})
	}
}

func TestBootstrapSuffix(t *testing.T) {
	f := func(body, host string, port uint16, room uint64, want string) {
		t.Helper()
		o, err := Scan([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(AppendBootstrap(nil, o, host, port, room)); got != want {
			t.Fatalf("AppendBootstrap(%q, %d, %d)\n got %s\nwant %s", host, port, room, got, want)
		}
	}
	f(`{"model":"m"}`, "prefill-0.svc", 8998, 42,
		`,"bootstrap_host":"prefill-0.svc","bootstrap_port":8998,"bootstrap_room":42`)
	f(`{}`, "10.0.0.1", 0, 1<<63-1,
		`"bootstrap_host":"10.0.0.1","bootstrap_port":null,"bootstrap_room":9223372036854775807`)
	// A room is masked to 63 bits, as SGLang's routers draw it.
	f(`{}`, "h", 1, 1<<64-1, `"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":9223372036854775807`)
	// IPv6 in brackets, as mini_lb.py's maybe_wrap_ipv6_address; already bracketed stays as it is.
	f(`{}`, "fd00::1", 8998, 7, `"bootstrap_host":"[fd00::1]","bootstrap_port":8998,"bootstrap_room":7`)
	f(`{}`, "[fd00::1]", 8998, 7, `"bootstrap_host":"[fd00::1]","bootstrap_port":8998,"bootstrap_room":7`)
	// A host is a JSON string whatever it holds.
	f(`{}`, "a\"b\\c\n", 2, 0, `"bootstrap_host":"a\"b\\c\u000a","bootstrap_port":2,"bootstrap_room":0`)
}

// TestNewRoom: 63 bits, and not a constant (a broken source would pair unrelated requests).
func TestNewRoom(t *testing.T) {
	seen := map[uint64]bool{}
	high := false
	for range 1000 {
		r := NewRoom()
		if r > maxRoom {
			t.Fatalf("NewRoom() = %d, above 2^63-1", r)
		}
		high = high || r >= 1<<62
		seen[r] = true
	}
	if len(seen) < 999 || !high {
		t.Fatalf("NewRoom: %d distinct of 1000, a value >= 2^62 seen: %v", len(seen), high)
	}
}
