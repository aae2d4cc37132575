package kvindex

import (
	"fmt"
	"strings"
	"testing"
)

func TestBindConflicts(t *testing.T) {
	bind := func(endpoint, topic string) *SubscriberConfig {
		return &SubscriberConfig{Endpoint: endpoint, Mode: "bind", Topic: topic}
	}
	const ep = "tcp://*:5557"
	// want: one "i:key" (i the subscription reported) per problem, in order.
	f := func(cfgs []*SubscriberConfig, want ...string) {
		t.Helper()
		var got []string
		for _, c := range BindConflicts(cfgs) {
			if c.I == c.J || c.Msg == "" {
				t.Fatalf("malformed conflict %+v", c)
			}
			got = append(got, fmt.Sprintf("%d:%s", c.I, c.Key))
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("got %q; want %q", got, want)
		}
	}
	// One subscription per endpoint: any topic, the empty one included.
	f([]*SubscriberConfig{bind(ep, ""), bind("tcp://*:5558", ""), nil, {Endpoint: "tcp://10.0.0.1:5557"}})
	// Four engines on one endpoint, told apart by topic (llm-d style).
	f([]*SubscriberConfig{bind(ep, "kv@10.0.0.1"), bind(ep, "kv@10.0.0.2"), bind(ep, "kv@10.0.0.3"), bind(ep, "kv@10.0.0.11")})
	// Connect mode never shares a socket: the same endpoint twice is fine.
	f([]*SubscriberConfig{{Endpoint: "tcp://10.0.0.1:5557"}, {Endpoint: "tcp://10.0.0.1:5557"}})
	// Empty topics on a shared endpoint: the first reported once, each later one on its own.
	f([]*SubscriberConfig{bind(ep, ""), bind(ep, "a")}, "0:topic")
	f([]*SubscriberConfig{bind(ep, ""), bind(ep, "a"), bind(ep, "b")}, "0:topic")
	f([]*SubscriberConfig{bind(ep, "a"), bind(ep, ""), bind(ep, "")}, "1:topic", "2:topic")
	f([]*SubscriberConfig{bind(ep, ""), bind(ep, "")}, "0:topic", "1:topic")
	// The same topic twice.
	f([]*SubscriberConfig{bind(ep, "a"), bind(ep, "b"), nil, bind(ep, "a")}, "3:topic")
	// Socket settings must agree (lists in any order).
	withPolicy := func(c *SubscriberConfig, allowed ...string) *SubscriberConfig {
		c.AllowedPublishers = allowed
		return c
	}
	f([]*SubscriberConfig{withPolicy(bind(ep, "a"), "10.0.0.1", "10.0.0.2"), withPolicy(bind(ep, "b"), "10.0.0.2", "10.0.0.1")})
	f([]*SubscriberConfig{withPolicy(bind(ep, "a"), "10.0.0.1"), bind(ep, "b")}, "1:allowed_publishers")
	curve := bind(ep, "b")
	curve.CurveSecretKey, curve.CurveClientKeys = testServerSecret, []string{testServerSecret}
	f([]*SubscriberConfig{bind(ep, "a"), curve}, "1:curve_secret_key", "1:curve_client_keys")
	big := bind(ep, "b")
	big.MaxMessageBytes = 1 << 20
	f([]*SubscriberConfig{bind(ep, "a"), big}, "1:max_message_bytes")
	// Endpoints that differ as written but bind one port.
	f([]*SubscriberConfig{bind(ep, "a"), bind("tcp://10.0.0.5:5557", "b")}, "1:endpoint")
	f([]*SubscriberConfig{bind("tcp://10.0.0.5:5557", "a"), bind("tcp://0.0.0.0:5557", "b")}, "1:endpoint")
	f([]*SubscriberConfig{bind("tcp://[::]:5557", "a"), bind("tcp://127.0.0.1:5557", "b")}, "1:endpoint")
	f([]*SubscriberConfig{bind("tcp://10.0.0.5:5557", "a"), bind("tcp://10.0.0.6:5557", "b"), bind("ipc:///tmp/kv", "")})
	f([]*SubscriberConfig{bind(ep, "a"), bind("tcp://*:5558", "b")})
}

func TestSameSocket(t *testing.T) {
	f := func(a, b SubscriberConfig, want bool) {
		t.Helper()
		if got := SameSocket(&a, &b); got != want {
			t.Fatalf("SameSocket(%+v, %+v) = %v; want %v", a, b, got, want)
		}
	}
	ep := "tcp://*:5557"
	f(SubscriberConfig{Endpoint: ep, Mode: "bind", Topic: "a", StaleAfter: 1, ReplayEndpoint: "tcp://e:1"},
		SubscriberConfig{Endpoint: ep, Mode: "bind", Topic: "b", MaxBlocks: 9, MaxQueueBytes: 1 << 30}, true)
	f(SubscriberConfig{Endpoint: ep}, SubscriberConfig{Endpoint: ep}, false) // connect mode
	f(SubscriberConfig{Endpoint: ep, Mode: "bind"}, SubscriberConfig{Endpoint: "tcp://0.0.0.0:5557", Mode: "bind"}, false)
	f(SubscriberConfig{Endpoint: ep, Mode: "bind"}, SubscriberConfig{Endpoint: ep, Mode: "bind", MaxMessageBytes: DefaultMaxMessageBytes}, true)
	f(SubscriberConfig{Endpoint: ep, Mode: "bind", AllowedPublishers: []string{"10.0.0.1"}}, SubscriberConfig{Endpoint: ep, Mode: "bind"}, false)
}
