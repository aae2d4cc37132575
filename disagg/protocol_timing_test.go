package disagg

import (
	"strings"
	"testing"
)

// realisticChat is a chat body of about 20 KB: a system prompt, a few turns, tools, streaming with usage.
func realisticChat() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"meta-llama/Llama-3.1-70B-Instruct","messages":[{"role":"system","content":"`)
	b.WriteString(strings.Repeat(`You are a careful assistant. Answer in JSON like {\"a\": \"}\"} when asked. `, 120))
	b.WriteString(`"}`)
	for i := range 8 {
		b.WriteString(`,{"role":"user","content":"Question `)
		b.WriteString(strings.Repeat("x", 200+i))
		b.WriteString(`"},{"role":"assistant","content":"Answer with \"quotes\" and \\ backslashes \u00e9"}`)
	}
	b.WriteString(`],"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}}],`)
	b.WriteString(`"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":512,"temperature":0.7,"top_p":0.95}`)
	return []byte(b.String())
}

var (
	sinkObject Object
	sinkBytes  []byte
	sinkErr    error
	sinkRoom   uint64
)

func BenchmarkScan(b *testing.B) {
	body := realisticChat()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		sinkObject, sinkErr = Scan(body)
	}
}

func BenchmarkAppendPrefill(b *testing.B) {
	o, _ := Scan(realisticChat())
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPrefill(buf[:0], o)
	}
	sinkBytes = buf
}

func BenchmarkParsePrefillAnswer(b *testing.B) {
	answer := []byte(answerChat)
	b.ReportAllocs()
	b.SetBytes(int64(len(answer)))
	for b.Loop() {
		sinkBytes, sinkErr = ParsePrefillAnswer(answer)
	}
}

func BenchmarkAppendDecode(b *testing.B) {
	o, _ := Scan(realisticChat())
	params, _ := ParsePrefillAnswer([]byte(answerChat))
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendDecode(buf[:0], o, params)
	}
	sinkBytes = buf
}

func BenchmarkAppendBootstrap(b *testing.B) {
	o, _ := Scan(realisticChat())
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 512)
		for pb.Next() {
			buf = AppendBootstrap(buf[:0], o, "10.0.3.17", 8998, NewRoom())
		}
	})
	sinkBytes = buf
}

func BenchmarkNewRoom(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var r uint64
		for pb.Next() {
			r += NewRoom()
		}
		sinkRoom = r
	})
}
