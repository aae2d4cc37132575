package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fastjson"
)

// Defaults applied to zero fields of ModelsConfig (DefaultPollTimeout, in poller.go, bounds each poll).
const (
	DefaultModelsPath     = "/v1/models"
	DefaultModelsInterval = 5 * time.Second
	DefaultModelsMaxBody  = 1 << 20
)

// Limits on a model list: the engine is not trusted.
const (
	// MaxModelCards caps the cards of one list; a longer list is a failed poll.
	MaxModelCards = 4096
	// maxModelRootLen caps a card's root (a path or a hub name).
	maxModelRootLen = 4096
)

// ModelList is an engine's GET /v1/models, as vLLM serves it (vllm/entrypoints/openai/serving_models.py):
// the base models (cards without a parent), then one card per registered LoRA adapter, whose parent is
// its base model and whose root is the path it was loaded from.
type ModelList struct {
	Base     []string
	Adapters []AdapterCard
}

// AdapterCard is one LoRA adapter of a ModelList.
type AdapterCard struct {
	Name   string // the card's id: the model name requests use
	Parent string // the base model
	Root   string // where the engine loaded it from; may be empty
}

// ParseModelList reads an OpenAI model list, {"object":"list","data":[{"id":...,"parent":...,
// "root":...},...]}. Other fields are ignored. Anything else is an error: a body that is not a JSON
// object with a "data" array of objects, an id that is missing, empty, longer than MaxAdapterNameLen
// bytes or listed twice, a parent or root that is neither a string nor null, more than MaxModelCards
// cards. p is used for parsing and must not be shared between goroutines; the result does not alias
// body or p.
func ParseModelList(p *fastjson.Parser, body []byte) (ModelList, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return ModelList{}, fmt.Errorf("cannot parse model list JSON: %w", err)
	}
	if v.Type() != fastjson.TypeObject {
		return ModelList{}, errModelListObject
	}
	data := v.Get("data")
	if data == nil || data.Type() != fastjson.TypeArray {
		return ModelList{}, errModelListData
	}
	cards, _ := data.Array()
	if len(cards) > MaxModelCards {
		return ModelList{}, fmt.Errorf("cannot use model list: %d cards, more than %d", len(cards), MaxModelCards)
	}
	var ml ModelList
	ids := make(map[string]struct{}, len(cards))
	for i, c := range cards {
		if c.Type() != fastjson.TypeObject {
			return ModelList{}, fmt.Errorf("cannot use model list card %d: it must be a JSON object", i)
		}
		id, err := cardString(c, "id", MaxAdapterNameLen)
		if err == nil && id == "" {
			err = errors.New(`"id" must be a non-empty string`)
		}
		if err != nil {
			return ModelList{}, fmt.Errorf("cannot use model list card %d: %w", i, err)
		}
		if _, dup := ids[id]; dup {
			return ModelList{}, fmt.Errorf("cannot use model list card %d: id %q is listed twice", i, id)
		}
		ids[id] = struct{}{}
		parent, err := cardString(c, "parent", MaxAdapterNameLen)
		if err != nil {
			return ModelList{}, fmt.Errorf("cannot use model list card %q: %w", id, err)
		}
		root, err := cardString(c, "root", maxModelRootLen)
		if err != nil {
			return ModelList{}, fmt.Errorf("cannot use model list card %q: %w", id, err)
		}
		if parent == "" {
			ml.Base = append(ml.Base, id)
			continue
		}
		ml.Adapters = append(ml.Adapters, AdapterCard{Name: id, Parent: parent, Root: root})
	}
	return ml, nil
}

// cardString returns a card's string field, "" when it is absent or null.
func cardString(c *fastjson.Value, key string, maxLen int) (string, error) {
	f := c.Get(key)
	if f == nil || f.Type() == fastjson.TypeNull {
		return "", nil
	}
	b, err := f.StringBytes()
	if err != nil {
		return "", fmt.Errorf("%q must be a string or null", key)
	}
	if len(b) > maxLen {
		return "", fmt.Errorf("%q is %d bytes, more than %d", key, len(b), maxLen)
	}
	return string(b), nil
}

var (
	errModelListObject = errors.New("cannot use model list: it must be a JSON object")
	errModelListData   = errors.New(`cannot use model list: "data" must be an array`)
)

// ModelsConfig configures one ModelsPoller. Zero fields take the Default* values.
type ModelsConfig struct {
	// BaseURL is the engine's server root, http[s]://host[:port][/prefix]; Path is appended to it.
	BaseURL string
	// Path is the model list path, "/v1/models" by default.
	Path string
	// Interval is the time between polls; Timeout bounds each poll, connect included.
	Interval time.Duration
	Timeout  time.Duration
	// Headers are sent with every poll, e.g. Authorization.
	Headers map[string]string
	// MaxBodySize caps the body read (1 MiB by default); a larger body is a failed poll.
	MaxBodySize int
	// Dial, when set, makes the poll's connections (the gateway's egress-policy dialer). Connections are
	// then not kept between polls: every poll is dialled, and checked, again.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// URL returns the full model list URL.
func (c *ModelsConfig) URL() (string, error) {
	return endpointURL(c.BaseURL, c.Path, DefaultModelsPath, "models path")
}

// Validate reports every problem of c at once.
func (c *ModelsConfig) Validate() error {
	var errs []error
	if _, err := c.URL(); err != nil {
		errs = append(errs, err)
	}
	errs = appendNegativeError(errs, "interval", c.Interval)
	errs = appendNegativeError(errs, "timeout", c.Timeout)
	errs = appendNegativeError(errs, "max body size", c.MaxBodySize)
	return errors.Join(errs...)
}

// ModelsPoller polls one engine's /v1/models every interval and stores the list in an Adapters. A
// failed poll (egress denied, connect error, timeout, non-200 status, body too large, a list
// ParseModelList refuses) invalidates the Adapters' model list at once.
//
// Start and Stop are safe for concurrent use; a ModelsPoller runs at most once.
type ModelsPoller struct {
	p        *poller
	adapters *Adapters
	jp       fastjson.Parser // used only by the poll goroutine
}

// NewModelsPoller returns a poller for cfg writing to adapters. A nil logger means slog.Default(). An
// invalid cfg makes every poll fail with the ModelsConfig.Validate error.
func NewModelsPoller(cfg ModelsConfig, adapters *Adapters, logger *slog.Logger) *ModelsPoller {
	mp := &ModelsPoller{adapters: adapters}
	u, _ := cfg.URL()
	if u == "" {
		u = cfg.BaseURL + cfg.Path // for log lines only: every poll fails with the Validate error
	}
	mp.p = newPoller(pollerConfig{
		what:       "models poll",
		url:        u,
		cfgErr:     cfg.Validate(),
		accept:     "application/json",
		interval:   orDefault(cfg.Interval, DefaultModelsInterval),
		timeout:    orDefault(cfg.Timeout, DefaultPollTimeout),
		maxBody:    orDefault(cfg.MaxBodySize, DefaultModelsMaxBody),
		headers:    cfg.Headers,
		dialer:     cfg.Dial,
		handle:     mp.handle,
		invalidate: adapters.InvalidateModels,
		logger:     logger,
	})
	return mp
}

func (mp *ModelsPoller) handle(body []byte) error {
	ml, err := ParseModelList(&mp.jp, body)
	if err != nil {
		return fmt.Errorf("cannot read model list from %q: %w", mp.p.url, err)
	}
	// Stamped with the poll's send time: a list sent before an adapter was loaded, and received after,
	// must not look newer than the load (the gateway would take the adapter for unloaded).
	mp.adapters.StoreModels(ml, mp.p.sent.UnixNano())
	return nil
}

// Start starts the poll goroutine; the first poll happens at once.
func (mp *ModelsPoller) Start() { mp.p.start() }

// Stop stops the poll goroutine and waits for it, aborting a poll in flight. The Adapters keeps its
// last model list.
func (mp *ModelsPoller) Stop() { mp.p.stop() }

// Stats returns the poll counters. Safe for concurrent use.
func (mp *ModelsPoller) Stats() PollStats { return mp.p.stats() }
