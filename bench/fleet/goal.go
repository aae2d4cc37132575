package fleet

// Goal is one target the report is held against.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Verdict is PASS, MISS, or n/a (the strategy or scenario did not run).
	Verdict string `json:"verdict"`
}

func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}
