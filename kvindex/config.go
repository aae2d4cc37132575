package kvindex

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
)

// ErrNoCgo is returned by NewSubscriber in builds without cgo: the subscriber uses libzmq through
// github.com/pebbe/zmq4.
var ErrNoCgo = errors.New("kv_events needs a cgo build with libzmq (this binary was built with CGO_ENABLED=0)")

// Size limits of a subscription; see "Exposure" in doc.go.
const (
	// DefaultMaxMessageBytes is the largest frame a KV-event socket accepts when
	// SubscriberConfig.MaxMessageBytes is 0: 16 MiB, more than ten times the largest batch a 128k-token prompt
	// produces. That batch is one BlockStored for a 131,072-token prefill at block size 16: 8,192 block hashes
	// (9 bytes each as msgpack uint64 = 72 KiB, or 34 bytes each as 32-byte bin digests with
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 = 272 KiB) and 131,072 token ids (at most 5 bytes each, uint32
	// for vocabularies past 65,536 = 640 KiB), plus a few dozen bytes of other fields: 912 KiB at worst, 1.4
	// MiB with a 64-character multimodal hash in every block's extra_keys (+536 KiB). A whole 1M-token step
	// (5 MiB of token ids, 2.1 MiB of bin hashes) still fits.
	DefaultMaxMessageBytes = 16 << 20
	// DefaultMaxQueueBytes bounds, when SubscriberConfig.MaxQueueBytes is 0, the bytes of received batches
	// waiting for the index: four messages of the default maximum, about 70 worst-case 128k-token batches or
	// 20,000 typical 3 KiB ones (a replay of 5 seconds at vLLM's pace queues a few hundred).
	DefaultMaxQueueBytes = 64 << 20
)

// SubscriberConfig configures the KV-event subscription of one target ([providers.kv_events]).
type SubscriberConfig struct {
	// Endpoint is the ZMQ address of the engine's PUB socket ("connect" mode, vLLM's default
	// tcp://*:5557 seen from the gateway) or the address the gateway binds its SUB to ("bind" mode,
	// llm-d style: the engine connects).
	Endpoint string
	// Topic is the subscription prefix ("" = every message). On a bind endpoint several targets share
	// (SameSocket), it names the engine: a message goes to the targets whose topic is the longest prefix of
	// its topic frame (doc.go, "One bind endpoint for many engines").
	Topic string
	// ReplayEndpoint is the engine's ROUTER replay address; "" disables replay (gaps clear the target).
	ReplayEndpoint string
	// Mode is "connect" (default) or "bind".
	Mode string
	// StaleAfter makes the target fallback/stale after this long without a message; 0 disables it.
	StaleAfter time.Duration
	// MaxBlocks caps the resident blocks the index keeps for the target (LRU); 0 means
	// MaxBlocksPerTarget.
	MaxBlocks int
	// MaxMessageBytes is the largest frame the SUB and replay DEALER sockets accept (ZMQ_MAXMSGSIZE); 0
	// means DefaultMaxMessageBytes. libzmq disconnects a peer that announces a larger frame before
	// allocating it; the frame is lost (the sequence shows the gap) and only StreamStats.Disconnects sees
	// it: libzmq does not say why a peer was disconnected.
	MaxMessageBytes int64
	// MaxQueueBytes bounds the batches received but not yet applied (payload bytes plus a fixed charge per
	// message); 0 means DefaultMaxQueueBytes. It must hold at least one message of MaxMessageBytes. A
	// message that does not fit is dropped, counted (StreamStats.QueueDrops) and treated as a gap.
	MaxQueueBytes int64

	// The publisher policy of a bind-mode target (see "Exposure" in doc.go). Without one, today's
	// behaviour: any peer that reaches the bound socket publishes. With one, the target's socket asks the
	// Subscriber's ZAP handler (ZMQ RFC 27) about every connection, and a refused one is closed before its
	// first message and counted (StreamStats.AuthRefused). Connect mode takes none of these: there the
	// gateway chooses whom it connects to, and the endpoint is checked by the gateway's egress policy.

	// AllowedPublishers admits only publishers whose IP address is one of these addresses or falls in one
	// of these CIDR prefixes ("10.0.0.7", "10.0.0.0/24", "fd00::/8"); IPv4 and IPv6, an IPv4 peer of a
	// dual-stack socket (::ffff:a.b.c.d) counts as its IPv4 address. Empty: no address check. Bind mode
	// over tcp:// only. The address is the TCP peer's: it proves where a connection comes from, not who
	// sends on it, so on a network where addresses can be spoofed or shared use CURVE as well.
	AllowedPublishers []string
	// CurveSecretKey is the gateway's CURVE secret key (40 characters of Z85, as zmq_curve_keypair or
	// libzmq's curve_keygen print it). When set, the socket is a CURVE server: publishers must use CURVE
	// with the matching public key (CurvePublicKey derives it) as their server key and one of
	// CurveClientKeys as their own; NULL (unauthenticated, unencrypted) connections are refused. Bind mode
	// over tcp:// or ipc:// only; it needs CurveClientKeys.
	CurveSecretKey string
	// CurveClientKeys are the public keys (Z85) of the publishers CURVE admits. With AllowedPublishers
	// too, a publisher needs both an allowed address and an allowed key.
	CurveClientKeys []string
}

// maxMessageBytes returns MaxMessageBytes or its default.
func (c *SubscriberConfig) maxMessageBytes() int64 {
	if c.MaxMessageBytes == 0 {
		return DefaultMaxMessageBytes
	}
	return c.MaxMessageBytes
}

// maxQueueBytes returns MaxQueueBytes or its default.
func (c *SubscriberConfig) maxQueueBytes() int64 {
	if c.MaxQueueBytes == 0 {
		return DefaultMaxQueueBytes
	}
	return c.MaxQueueBytes
}

// Validate returns every problem of c at once.
func (c *SubscriberConfig) Validate() error {
	var errs []error
	if err := CheckEndpoint(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("cannot use endpoint: %w", err))
	}
	if c.ReplayEndpoint != "" {
		if err := CheckEndpoint(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("cannot use replay_endpoint: %w", err))
		}
	}
	switch c.Mode {
	case "", "connect", "bind":
	default:
		errs = append(errs, fmt.Errorf("cannot use mode %q: want \"connect\" or \"bind\"", c.Mode))
	}
	if c.StaleAfter < 0 {
		errs = append(errs, fmt.Errorf("cannot use stale_secs %s: must not be negative", c.StaleAfter))
	}
	if c.MaxBlocks < 0 || c.MaxBlocks > MaxBlocksPerTarget {
		errs = append(errs, fmt.Errorf("cannot use max_blocks %d: must be in 0..%d", c.MaxBlocks, MaxBlocksPerTarget))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("cannot use max_message_bytes %d: must not be negative", c.MaxMessageBytes))
	}
	if c.MaxQueueBytes < 0 {
		errs = append(errs, fmt.Errorf("cannot use max_queue_bytes %d: must not be negative", c.MaxQueueBytes))
	} else if c.MaxMessageBytes >= 0 && c.maxQueueBytes() < c.maxMessageBytes()+queuedOverhead {
		errs = append(errs, fmt.Errorf("cannot use max_queue_bytes %d: must hold one message of max_message_bytes %d "+
			"(plus %d)", c.maxQueueBytes(), c.maxMessageBytes(), queuedOverhead))
	}
	errs = c.validatePolicy(errs)
	return errors.Join(errs...)
}

// CheckEndpoint reports whether ep is a ZMQ endpoint the subscriber can use: tcp://host:port (host may be
// "*" in bind mode), ipc://path or inproc://name. Config validation calls it so a config that passes
// `rolter check` never fails at subscribe time.
func CheckEndpoint(ep string) error {
	if ep == "" {
		return errors.New("empty address")
	}
	for _, scheme := range []string{"tcp://", "ipc://", "inproc://"} {
		if rest, ok := strings.CutPrefix(ep, scheme); ok {
			if rest == "" {
				return fmt.Errorf("%q has no address after the scheme", ep)
			}
			if scheme == "tcp://" {
				if _, _, err := net.SplitHostPort(rest); err != nil {
					return fmt.Errorf("%q: want tcp://host:port", ep)
				}
			}
			return nil
		}
	}
	return fmt.Errorf("%q: want tcp://, ipc:// or inproc://", ep)
}

// ipv6Host reports whether a tcp:// endpoint's host is an IPv6 literal ("tcp://[::]:5557"): libzmq binds
// it only with ZMQ_IPV6 set (without it the bind fails with "no such device").
func ipv6Host(endpoint string) bool {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(rest)
	return err == nil && strings.Contains(host, ":")
}

// SameSocket reports whether bind-mode subscriptions a and b can share one socket: the same endpoint
// (as written: "tcp://*:5557" and "tcp://0.0.0.0:5557" are two sockets, the second failing to bind) and
// the same socket settings, which apply to every publisher that connects whatever topic it then sends:
// max_message_bytes and the publisher policy (allowed_publishers, CURVE keys; a publisher admitted for one
// topic can publish any). The topic, replay endpoint, staleness, block cap and queue bound stay per
// target.
func SameSocket(a, b *SubscriberConfig) bool {
	return a.Mode == "bind" && b.Mode == "bind" && a.Endpoint == b.Endpoint &&
		a.maxMessageBytes() == b.maxMessageBytes() &&
		sameSet(a.AllowedPublishers, b.AllowedPublishers) &&
		a.CurveSecretKey == b.CurveSecretKey && sameSet(a.CurveClientKeys, b.CurveClientKeys)
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// BindConflict is a problem between two bind-mode subscriptions of one config (BindConflicts): I is the
// later one, J the earlier, Key the setting of I that is wrong ("topic", "endpoint", "allowed_publishers",
// ...), Msg what is wrong with it.
type BindConflict struct {
	I, J int
	Key  string
	Msg  string
}

// BindConflicts checks the bind-mode subscriptions of one config against each other (nil entries and
// connect-mode ones are skipped; each entry must be valid on its own): subscriptions that bind the same
// endpoint share one socket (llm-d style: every engine connects to one subscriber), so each must set a
// topic no other on the endpoint sets and an empty topic is refused (it would take every engine's
// messages), and their socket settings must agree (SameSocket). Two tcp endpoints that differ as written
// but would bind the same port (a wildcard host and another address, say) are refused too: the second
// bind would fail with "address already in use" forever. Each problem is reported once, on the later
// subscription.
func BindConflicts(cfgs []*SubscriberConfig) []BindConflict {
	var out []BindConflict
	first := map[string]int{} // endpoint -> its first subscription
	topics := map[string]map[string]int{}
	sharedSeen := map[string]bool{}
	for i, c := range cfgs {
		if c == nil || c.Mode != "bind" {
			continue
		}
		j, shared := first[c.Endpoint]
		if !shared {
			for k, d := range cfgs[:i] {
				if d != nil && d.Mode == "bind" && d.Endpoint != c.Endpoint && samePort(c.Endpoint, d.Endpoint) {
					out = append(out, BindConflict{I: i, J: k, Key: "endpoint", Msg: fmt.Sprintf("endpoint %q binds the port of %q: "+
						"write the same endpoint to share one socket, or use another port", c.Endpoint, d.Endpoint)})
					break
				}
			}
			first[c.Endpoint] = i
			topics[c.Endpoint] = map[string]int{c.Topic: i}
			continue
		}
		d := cfgs[j]
		empty := func(at, other int) BindConflict {
			return BindConflict{I: at, J: other, Key: "topic", Msg: fmt.Sprintf("empty topic on bind endpoint %q, which other providers "+
				"share: each engine on a shared endpoint needs a topic of its own (vLLM: --kv-events-config '{\"topic\": \"...\"}')", c.Endpoint)}
		}
		if d.Topic == "" && !sharedSeen[c.Endpoint] {
			// The endpoint's first subscription, reported once, when a second one makes the endpoint shared.
			out = append(out, empty(j, i))
		}
		sharedSeen[c.Endpoint] = true
		if c.Topic == "" {
			out = append(out, empty(i, j))
		} else if k, dup := topics[c.Endpoint][c.Topic]; dup {
			out = append(out, BindConflict{I: i, J: k, Key: "topic", Msg: fmt.Sprintf("topic %q is already taken on bind endpoint %q: "+
				"providers that share an endpoint are told apart by topic", c.Topic, c.Endpoint)})
		} else {
			topics[c.Endpoint][c.Topic] = i
		}
		for _, e := range []struct {
			key  string
			same bool
		}{
			{"max_message_bytes", c.maxMessageBytes() == d.maxMessageBytes()},
			{"allowed_publishers", sameSet(c.AllowedPublishers, d.AllowedPublishers)},
			// The secret itself never goes into a message.
			{"curve_secret_key", c.CurveSecretKey == d.CurveSecretKey},
			{"curve_client_keys", sameSet(c.CurveClientKeys, d.CurveClientKeys)},
		} {
			if !e.same {
				out = append(out, BindConflict{I: i, J: j, Key: e.key, Msg: fmt.Sprintf("%s differs on shared bind endpoint %q: "+
					"one socket admits every publisher of the endpoint alike, so every provider on it needs the same", e.key, c.Endpoint)})
			}
		}
	}
	return out
}

// samePort reports whether two tcp:// endpoints would bind one port: the same port, and the same host or
// a wildcard on either side (Linux refuses a second listener on a port a wildcard holds).
func samePort(a, b string) bool {
	ha, pa, oka := tcpHostPort(a)
	hb, pb, okb := tcpHostPort(b)
	if !oka || !okb || pa != pb || pa == "*" || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "*" || h == "0.0.0.0" || h == "::" || h == "" }
	return ha == hb || wild(ha) || wild(hb)
}

func tcpHostPort(ep string) (host, port string, ok bool) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", "", false
	}
	host, port, err := net.SplitHostPort(rest)
	return host, port, err == nil
}
