package promptkey

// MaxKeyFields and MaxKeyFieldLen bound [server] cache_key_fields (the configuration validates against
// them): at most MaxKeyFields names of at most MaxKeyFieldLen bytes each, so that any escaped spelling of
// one fits the scanner's name buffer (a byte is at most 6 bytes escaped, \u00XX).
const (
	MaxKeyFields   = 8
	MaxKeyFieldLen = 32
)

// maxRequestDepth is the deepest nesting of objects and arrays accepted (the top-level object is depth 1).
// Python's json.loads fails with RecursionError somewhat deeper (~990 at the default recursion limit of
// 1000); 512 keeps the scanner's stack a fixed 64 bytes.
const maxRequestDepth = 512

// maxIntDigits is CPython's default int_max_str_digits: json.loads raises ValueError for an integer literal
// (no fraction, no exponent) with more digits, which FastAPI answers 400 (CVE-2020-10735,
// https://docs.python.org/3/library/stdtypes.html#int-max-str-digits).
const maxIntDigits = 4300
