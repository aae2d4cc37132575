package disagg

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os/exec"
	"reflect"
	"testing"
)

// The reference behaviour, restated from the routers' sources as operations on the decoded body, so the
// spliced bodies can be compared with what those routers would send.

// proxyPrefill is vLLM's toy_proxy_server.py send_request_to_service: the copy of the request it posts to
// the prefill engine.
func proxyPrefill(req map[string]any) map[string]any {
	p := clone(req)
	p["kv_transfer_params"] = map[string]any{
		"do_remote_decode":  true,
		"do_remote_prefill": false,
		"remote_engine_id":  nil,
		"remote_block_ids":  nil,
		"remote_host":       nil,
		"remote_port":       nil,
	}
	p["stream"] = false
	p["max_tokens"] = 1.0
	if _, ok := p["max_completion_tokens"]; ok {
		p["max_completion_tokens"] = 1.0
	}
	delete(p, "stream_options")
	delete(p, "min_tokens")
	delete(p, "min_completion_tokens")
	return p
}

// proxyDecode is toy_proxy_server.py _handle_completions: the client's request, with the prefill answer's
// kv_transfer_params when it had any.
func proxyDecode(req map[string]any, params any) map[string]any {
	d := clone(req)
	if m, ok := params.(map[string]any); ok && len(m) > 0 {
		d["kv_transfer_params"] = params
	}
	return d
}

// miniLB is SGLang's mini_lb.py _forward_to_backend: the request both engines get.
func miniLB(req map[string]any, host string, port any, room float64) map[string]any {
	d := clone(req)
	d["bootstrap_host"] = host
	d["bootstrap_port"] = port
	d["bootstrap_room"] = room
	return d
}

// vllmDefaults are the values AppendPrefill sends for keys the proxy deletes: vLLM's pydantic defaults,
// which it treats as the key being absent.
var vllmDefaults = map[string]any{"stream_options": nil, "min_tokens": 0.0, "min_completion_tokens": 0.0}

// sameRequest fails unless got equals want, except that a key want lacks may be in got with its vLLM
// default value.
func sameRequest(t *testing.T, got, want map[string]any) {
	t.Helper()
	for k, v := range got {
		w, ok := want[k]
		if !ok {
			def, isDefault := vllmDefaults[k]
			if !isDefault || !reflect.DeepEqual(v, def) {
				t.Errorf("key %q = %#v, which the proxy does not send", k, v)
			}
			continue
		}
		if !reflect.DeepEqual(v, w) {
			t.Errorf("key %q = %#v, want %#v", k, v, w)
		}
	}
	for k, w := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("key %q missing, want %#v", k, w)
		}
	}
}

func clone(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// splice inserts suffix into body at o.End, as the engine does.
func splice(body []byte, o Object, suffix []byte) []byte {
	out := append([]byte(nil), body[:o.End]...)
	out = append(out, suffix...)
	return append(out, body[o.End:]...)
}

// decode decodes a body the way Python's json.loads does where it matters here: encoding/json stores each
// member of an object into the map in order, so of a repeated key the last value stays.
func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("cannot decode %s: %v", b, err)
	}
	return m
}

// python decodes bodies with CPython's json.loads, what FastAPI does with a request body, one body a line
// in, one canonical JSON a line out. It returns nil when python3 is not installed.
type python struct {
	cmd *exec.Cmd
	in  *bufio.Writer
	out *bufio.Scanner
}

func startPython(t *testing.T) *python {
	t.Helper()
	path, err := exec.LookPath("python3")
	if err != nil {
		t.Log("python3 not installed: bodies are checked with encoding/json only")
		return nil
	}
	const prog = `import json, sys
for line in sys.stdin:
    print(json.dumps(json.loads(line)), flush=True)
`
	cmd := exec.Command(path, "-c", prog)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	return &python{cmd: cmd, in: bufio.NewWriter(stdin), out: sc}
}

// check fails unless Python decodes body into the same value as decode.
func (p *python) check(t *testing.T, body []byte) {
	t.Helper()
	if p == nil {
		return
	}
	line := bytes.ReplaceAll(bytes.ReplaceAll(body, []byte("\r"), []byte(" ")), []byte("\n"), []byte(" "))
	p.in.Write(line)
	p.in.WriteByte('\n')
	if err := p.in.Flush(); err != nil {
		t.Fatal(err)
	}
	if !p.out.Scan() {
		t.Fatalf("python3 gave no answer for %s: %v", body, p.out.Err())
	}
	got, want := decode(t, p.out.Bytes()), decode(t, body)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("json.loads(%s) = %v, encoding/json = %v", body, got, want)
	}
}
