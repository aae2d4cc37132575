package engine

import "fmt"

// A KV-event stream that receives nothing at all while its engine serves requests is almost always wired
// wrong, and ZMQ says nothing about it: a PUB with no subscriber and a SUB with no publisher both wait
// quietly. The usual cause is that both sides connect (or both bind): vLLM's publisher binds when its
// endpoint has a wildcard host (tcp://*:5557) and connects otherwise, and the gateway connects unless
// mode = "bind". The janitor counts its ticks at which the provider has requests in flight while the
// stream has seen no frame; after kvSilentTicks of them the gateway logs the likely cause, once per
// subscription.

// kvSilentTicks is how many busy janitor ticks (about a second each) a stream may stay silent.
var kvSilentTicks = 10

// watchKVSilence runs at each janitor tick over the live snapshot's KV-event sources. Only the janitor
// touches a source's silence fields.
func (g *Gateway) watchKVSilence(s *Snapshot) {
	for name, src := range s.kv {
		if src.silenceDone {
			continue
		}
		st := src.st.Stats()
		if st.Batches > 0 || st.HasSeq || st.GarbageFrames > 0 || st.DecodeErrors > 0 || st.AuthRefused > 0 {
			src.silenceDone = true // something arrives: the wiring works
			continue
		}
		p := s.providers[name]
		if p == nil || p.Inflight() == 0 {
			continue
		}
		if src.busyTicks++; src.busyTicks < kvSilentTicks {
			continue
		}
		src.silenceDone = true
		g.log.Warn("no KV event received while the engine serves requests", "provider", name,
			"endpoint", src.cfg.Endpoint, "mode", src.cfg.Mode, "likely_cause", silenceCause(src.cfg.Mode, src.cfg.Endpoint))
	}
}

// silenceCause is the likely cause of a silent stream in mode at endpoint.
func silenceCause(mode, endpoint string) string {
	if mode == "bind" {
		return fmt.Sprintf("the gateway binds %s; the engine must connect to it (its --kv-events-config endpoint this gateway's address, "+
			"not a wildcard, which makes vLLM bind too), and a publisher outside allowed_publishers or without the CURVE key is refused", endpoint)
	}
	return fmt.Sprintf("the gateway connects to %s; the engine must bind it (vLLM binds when its --kv-events-config endpoint is "+
		"tcp://*:PORT and connects when it names a host, so both sides connect and neither hears the other), "+
		`or set mode = "bind" here and point the engine at this gateway`, endpoint)
}
