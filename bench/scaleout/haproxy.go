package scaleout

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/template"
	"time"
)

//go:embed haproxy.cfg.tmpl
var haproxyTemplateText string

// haproxyTemplate is HAProxy as an L4 balancer over the gateways: mode tcp, round robin per connection,
// as a Kubernetes Service (kube-proxy) balances; the stats socket tells connections per server
// (haproxySessions). missingkey=error: a field the data lacks is an error, not an empty string in the
// config.
var haproxyTemplate = template.Must(template.New("haproxy.cfg.tmpl").Option("missingkey=error").Parse(haproxyTemplateText))

// haproxyServer is one server line of the backend.
type haproxyServer struct{ Name, Addr string }

// haproxyConfig renders the HAProxy config of a cell: frontend front, one server gw1..gwN per gateway
// URL, the pidfile and the stats socket sock.
func haproxyConfig(front string, gateways []string, pidfile, sock string) (string, error) {
	servers := make([]haproxyServer, len(gateways))
	for i, u := range gateways {
		servers[i] = haproxyServer{Name: fmt.Sprintf("gw%d", i+1), Addr: strings.TrimPrefix(u, "http://")}
	}
	var b strings.Builder
	err := haproxyTemplate.Execute(&b, struct {
		Pidfile, Socket, Listen string
		Servers                 []haproxyServer
	}{pidfile, sock, front, servers})
	if err != nil {
		return "", fmt.Errorf("cannot render the HAProxy config: %w", err)
	}
	return b.String(), nil
}

// haproxySessions returns the connections HAProxy gave each server gw1..gwN so far (`stot` of `show stat`).
func haproxySessions(sock string, n int) ([]int, error) {
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the haproxy stats socket: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("show stat\n")); err != nil {
		return nil, fmt.Errorf("cannot query the haproxy stats socket: %w", err)
	}
	data, err := io.ReadAll(conn)
	if err != nil {
		return nil, fmt.Errorf("cannot read the haproxy stats: %w", err)
	}
	return parseHAProxySessions(data, n)
}

// parseHAProxySessions reads `stot` of the servers gw1..gwN of backend "gateways" from `show stat` CSV.
func parseHAProxySessions(data []byte, n int) ([]int, error) {
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(data, []byte("# "))))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("cannot parse the haproxy stats: %w", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("empty haproxy stats")
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	px, sv, stot := col["pxname"], col["svname"], col["stot"]
	if _, ok := col["stot"]; !ok {
		return nil, fmt.Errorf("no stot column in the haproxy stats header %q", strings.Join(rows[0], ","))
	}
	out := make([]int, n)
	found := 0
	for _, row := range rows[1:] {
		if len(row) <= max(px, sv, stot) || row[px] != "gateways" {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(row[sv], "gw"))
		if err != nil || !strings.HasPrefix(row[sv], "gw") || i < 1 || i > n {
			continue
		}
		v, err := strconv.Atoi(row[stot])
		if err != nil {
			return nil, fmt.Errorf("cannot parse stot %q of %s: %w", row[stot], row[sv], err)
		}
		out[i-1] = v
		found++
	}
	if found != n {
		return nil, fmt.Errorf("haproxy stats list %d of %d gateways", found, n)
	}
	return out, nil
}
