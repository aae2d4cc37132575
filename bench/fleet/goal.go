package fleet

// Goal is one target the report is held against.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Verdict is PASS, MISS, or n/a (the strategy or scenario did not run).
	Verdict string `json:"verdict"`
}

// Verdict is PASS when ok, else MISS.
func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// Goals collects a report's goals, in the order they are judged.
type Goals []Goal

// Add appends a measured goal, PASS when ok.
func (g *Goals) Add(name, target, measured string, ok bool) {
	*g = append(*g, Goal{Name: name, Target: target, Measured: measured, Verdict: Verdict(ok)})
}

// NA appends a goal that could not be judged, and why.
func (g *Goals) NA(name, target, why string) {
	*g = append(*g, Goal{Name: name, Target: target, Measured: why, Verdict: "n/a"})
}
