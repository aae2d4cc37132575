package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/control/store"
)

// maxBody bounds a request body: the store keeps configs up to store.MaxConfigLen.
const maxBody = store.MaxConfigLen

// readBody reads r's body, at most maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errorf(http.StatusBadRequest, "invalid_json", "the body is larger than %d bytes", maxBody)
	}
	if err != nil {
		return nil, errorf(http.StatusBadRequest, "invalid_json", "cannot read the body: %s", err)
	}
	return b, nil
}

// decodeObject decodes data, one JSON object, into v (a pointer to a struct) as strictly as the TOML loader
// decodes rolter.toml: a field v does not have, a field given twice, or a value of the wrong type is an
// error named by its path ("kv_events.endpoint", "targets[0].weight"), every one of them at once. The
// names in readOnly are fields of the answers that a request cannot set.
func decodeObject(data []byte, v any, readOnly ...string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	sc := &shapeChecker{dec: dec, readOnly: readOnly}
	tok, err := dec.Token()
	if err == io.EOF {
		return errorf(http.StatusBadRequest, "invalid_json", "the body is empty: want a JSON object")
	}
	if err == nil {
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return errorf(http.StatusBadRequest, "invalid_json", "the body is %s: want a JSON object", tokenKind(tok))
		}
		err = sc.valueOf(tok, reflect.TypeOf(v).Elem(), "")
	}
	if err == nil {
		if _, err = dec.Token(); err == nil {
			err = errors.New("more data after the JSON object")
		} else if err == io.EOF {
			err = nil
		}
	}
	if err != nil {
		return syntaxError(err, dec.InputOffset())
	}
	if len(sc.problems) > 0 {
		e := errorf(http.StatusBadRequest, "invalid_json", "the body does not fit the schema: %s: %s", sc.problems[0].Field, sc.problems[0].Message)
		if n := len(sc.problems) - 1; n > 0 {
			e.msg += fmt.Sprintf(" (and %d more)", n)
		}
		e.fields = sc.problems
		return e
	}
	// The shape is right, so the standard decoder takes it as checked (the same decoder Compose uses).
	if err := decodeStrict(data, v); err != nil {
		return fmt.Errorf("BUG: a body that passed the shape check does not decode: %w", err)
	}
	return nil
}

func syntaxError(err error, offset int64) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errorf(http.StatusBadRequest, "invalid_json", "the body is not JSON: it ends early")
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		offset = se.Offset
	}
	return errorf(http.StatusBadRequest, "invalid_json", "the body is not JSON at byte %d: %s", offset, strings.TrimPrefix(err.Error(), "json: "))
}

// shapeChecker walks a JSON value token by token against a Go type, collecting every problem of shape. It
// returns an error only for broken JSON, where it cannot go on.
type shapeChecker struct {
	dec      *json.Decoder
	readOnly []string
	problems []FieldError
}

func (sc *shapeChecker) add(path, format string, args ...any) {
	sc.problems = append(sc.problems, FieldError{Field: path, Message: fmt.Sprintf(format, args...)})
}

func (sc *shapeChecker) value(t reflect.Type, path string) error {
	tok, err := sc.dec.Token()
	if err != nil {
		return err
	}
	return sc.valueOf(tok, t, path)
}

// valueOf checks the value that starts with tok against t.
func (sc *shapeChecker) valueOf(tok json.Token, t reflect.Type, path string) error {
	if tok == nil {
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map:
			return nil // absent, as in TOML, where a key left out has no value
		}
		sc.add(path, "must be %s, got null", typeKind(t))
		return nil
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	ok := false
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		if d, isDelim := tok.(json.Delim); isDelim && d == '{' {
			return sc.object(t, path)
		}
	case reflect.Slice:
		if d, isDelim := tok.(json.Delim); isDelim && d == '[' {
			for i := 0; sc.dec.More(); i++ {
				if err := sc.value(t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, err := sc.dec.Token() // ']'
			return err
		}
	case reflect.String:
		_, ok = tok.(string)
	case reflect.Bool:
		_, ok = tok.(bool)
	case reflect.Int, reflect.Int64:
		if n, isNum := tok.(json.Number); isNum {
			if _, err := strconv.ParseInt(string(n), 10, 64); err != nil {
				sc.add(path, "must be an integer, got %s", n)
			}
			return nil
		}
	case reflect.Float64:
		if n, isNum := tok.(json.Number); isNum {
			if _, err := strconv.ParseFloat(string(n), 64); err != nil {
				sc.add(path, "must be a number within the range of a 64-bit float, got %s", n)
			}
			return nil
		}
	default:
		panic("BUG: the shape checker does not know " + t.String())
	}
	if !ok {
		sc.add(path, "must be %s, got %s", typeKind(t), tokenKind(tok))
		return sc.skip(tok)
	}
	return nil
}

// object checks the members of an object, after its '{', against a struct's fields or a map's values.
func (sc *shapeChecker) object(t reflect.Type, path string) error {
	seen := map[string]bool{}
	for sc.dec.More() {
		tok, err := sc.dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string) // the decoder returns object keys as strings
		fp := key
		if path != "" {
			fp = path + "." + key
		}
		var ft reflect.Type
		switch {
		case seen[key]:
			sc.add(fp, "given twice")
		case t.Kind() == reflect.Map:
			ft = t.Elem()
		default:
			if f, found := fieldByName(t, key); found {
				ft = f.Type
			} else if path == "" && slices.Contains(sc.readOnly, key) {
				sc.add(fp, "read-only: it is set by the control plane (send the version in If-Match)")
			} else {
				sc.add(fp, "unknown field")
			}
		}
		seen[key] = true
		if ft == nil {
			if err := sc.skipValue(); err != nil {
				return err
			}
			continue
		}
		if err := sc.value(ft, fp); err != nil {
			return err
		}
	}
	_, err := sc.dec.Token() // '}'
	return err
}

// skipValue reads one value and drops it.
func (sc *shapeChecker) skipValue() error {
	tok, err := sc.dec.Token()
	if err != nil {
		return err
	}
	return sc.skip(tok)
}

// skip drops the rest of the value that started with tok.
func (sc *shapeChecker) skip(tok json.Token) error {
	d, ok := tok.(json.Delim)
	if !ok || (d != '{' && d != '[') {
		return nil
	}
	for depth := 1; depth > 0; {
		tok, err := sc.dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

// fieldByName returns the field of struct t whose JSON name is name (encoding/json's tag rules; the
// config structs have no embedded fields).
func fieldByName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.IsExported() && tag != "-" && tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func typeKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return typeKind(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	}
	return t.String()
}

func tokenKind(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return "an object"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}
