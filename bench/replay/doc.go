// Package replay replays a trace (a Rolter capture or a Mooncake trace) through every strategy on a fleet of
// simulated engines behind a real gateway: `rolter replay`. TracePlan turns the trace into prompts of
// synthetic text that share exactly the prefixes the trace's prompts shared. It writes Markdown or JSON and
// draws no charts, so the gateway binary links no charting library.
package replay
