package limits

import "strconv"

// AppendDuration appends ns nanoseconds as OpenAI's x-ratelimit-reset-* headers write a duration - "20ms",
// "1s", "6m0s", "1h2m3.5s" - to the millisecond, rounded up so a client that waits that long finds the
// limit reset, and returns the extended buffer. Allocation-free.
func AppendDuration(dst []byte, ns int64) []byte {
	ms := (max(ns, 0) + 999_999) / 1_000_000
	if ms < 1000 {
		return append(strconv.AppendInt(dst, ms, 10), 'm', 's')
	}
	h, rest := ms/3_600_000, ms%3_600_000
	m, rest := rest/60_000, rest%60_000
	s, frac := rest/1000, rest%1000
	if h > 0 {
		dst = append(strconv.AppendInt(dst, h, 10), 'h')
	}
	if h > 0 || m > 0 {
		dst = append(strconv.AppendInt(dst, m, 10), 'm')
	}
	dst = strconv.AppendInt(dst, s, 10)
	if frac > 0 {
		dst = append(dst, '.')
		// Three digits, trailing zeros dropped: 500 -> "5", 50 -> "05", 5 -> "005".
		d := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for n > 1 && d[n-1] == '0' {
			n--
		}
		dst = append(dst, d[:n]...)
	}
	return append(dst, 's')
}

// RetryAfterSeconds is a wait as the Retry-After header's whole seconds, rounded up, at least 1.
func RetryAfterSeconds(ns int64) int64 { return max((ns+999_999_999)/1_000_000_000, 1) }
