package dnssrc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
	"golang.org/x/net/dns/dnsmessage"
)

// Bounds of a source's durations: past them a value is a typo, not a choice.
const (
	maxTTL     = 24 * time.Hour
	maxTimeout = time.Minute
)

// Watcher follows the DNS records of one [[sources]] entry of kind "dns". It holds only what New made of
// the config: Watch keeps its own state, so a Watcher is safe for concurrent use.
type Watcher struct {
	source string // the source's name, for logs
	host   string // the name, without its trailing dot
	record string // config.RecordSRV or config.RecordA
	port   uint16 // for A/AAAA records
	server string // the DNS server, "host:port"

	minTTL, maxTTL, timeout time.Duration

	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	check func(name string, a netip.Addr) error
	log   *slog.Logger
}

var _ discovery.Watcher = (*Watcher)(nil)

// New returns a Watcher of sc, a source of kind "dns" with its defaults set. It reports every fault of
// sc's dns keys at once.
func New(sc *config.SourceConfig, opts Options) (*Watcher, error) {
	if sc == nil || sc.Kind != config.SourceDNS || sc.DNS == nil {
		return nil, errors.New(`cannot watch a DNS source: the source is not of kind "dns" with a [sources.dns] table`)
	}
	d := sc.DNS
	w := &Watcher{
		source: sc.Name, host: trimDot(d.Name), record: d.Record,
		dial: opts.dialer(), check: opts.checker(),
		log: opts.logger().With("source", sc.Name),
	}
	errs := []error{w.setName(d), w.setPort(sc), w.setDurations(d), w.setServer(d.Resolver, opts.resolvConf())}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("cannot watch source %q: %w", sc.Name, err)
	}
	return w, nil
}

// setName checks the record kind and that the name is one a query can carry.
func (w *Watcher) setName(d *config.DNSSource) error {
	var errs []error
	if d.Record != config.RecordSRV && d.Record != config.RecordA {
		errs = append(errs, fmt.Errorf("dns.record must be %q or %q, not %q", config.RecordSRV, config.RecordA, d.Record))
	}
	if w.host == "" {
		errs = append(errs, errors.New("dns.name must be set"))
	} else if w.host == "." {
		errs = append(errs, errors.New(`dns.name must be a name below the root ".", not the root`))
	} else if q, err := newQuestion(w.host, dnsmessage.TypeA); err != nil {
		errs = append(errs, fmt.Errorf("dns.name %q is not a DNS name: %w", d.Name, err))
	} else if _, err := q.pack(0); err != nil {
		errs = append(errs, fmt.Errorf("dns.name %q is not a DNS name: %w", d.Name, err))
	}
	return errors.Join(errs...)
}

// setPort takes the engines' port, which A/AAAA records do not give.
func (w *Watcher) setPort(sc *config.SourceConfig) error {
	if w.record != config.RecordA {
		return nil
	}
	if sc.Port < 1 || sc.Port > math.MaxUint16 {
		return fmt.Errorf("port must be 1 to 65535 for dns.record %q, not %d", config.RecordA, sc.Port)
	}
	w.port = uint16(sc.Port)
	return nil
}

// setDurations checks the TTL bounds and the timeout.
func (w *Watcher) setDurations(d *config.DNSSource) error {
	var errs []error
	w.minTTL, errs = duration(errs, "dns.min_ttl_secs", d.MinTTLSecs, maxTTL)
	w.maxTTL, errs = duration(errs, "dns.max_ttl_secs", d.MaxTTLSecs, maxTTL)
	w.timeout, errs = duration(errs, "dns.timeout_secs", d.TimeoutSecs, maxTimeout)
	if w.minTTL > w.maxTTL {
		errs = append(errs, fmt.Errorf("dns.min_ttl_secs (%g) must not be above dns.max_ttl_secs (%g)", d.MinTTLSecs, d.MaxTTLSecs))
	}
	return errors.Join(errs...)
}

// duration returns secs as a Duration, appending to errs when it is not in (0, most].
func duration(errs []error, key string, secs float64, most time.Duration) (time.Duration, []error) {
	if !(secs > 0) || secs > most.Seconds() {
		return 0, append(errs, fmt.Errorf("%s must be above 0 and at most %g, not %g", key, most.Seconds(), secs))
	}
	return time.Duration(secs * float64(time.Second)), errs
}

// setServer takes the DNS server: resolver as "host:port", or the first nameserver of resolvConf.
func (w *Watcher) setServer(resolver, resolvConf string) error {
	if resolver == "" {
		s, err := firstNameserver(resolvConf)
		w.server = s
		return err
	}
	host, port, err := net.SplitHostPort(resolver)
	if err != nil {
		return fmt.Errorf("dns.resolver %q must be host:port: %w", resolver, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || p == 0 {
		return fmt.Errorf("dns.resolver %q must be host:port with a port of 1 to 65535", resolver)
	}
	w.server = resolver
	return nil
}

// trimDot returns name without its trailing dot.
func trimDot(name string) string {
	if len(name) > 1 && name[len(name)-1] == '.' {
		return name[:len(name)-1]
	}
	return name
}
