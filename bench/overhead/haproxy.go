package overhead

import (
	"context"
	_ "embed"
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

//go:embed haproxy.cfg.tmpl
var haproxyTemplateText string

// haproxyTemplate is the HAProxy config of a case: a null proxy in HTTP mode whose backend is the case's
// targets, all the one upstream (haproxyConfig fills it). missingkey=error: a field the data lacks is an
// error, not an empty string in the config.
var haproxyTemplate = template.Must(template.New("haproxy.cfg.tmpl").Option("missingkey=error").Parse(haproxyTemplateText))

// haproxyServer is one server line of the backend.
type haproxyServer struct{ Name, Addr string }

// haproxyConfig renders the HAProxy config of case c: a null proxy whose backend has c.Targets servers,
// all the upstream, balanced round robin.
func haproxyConfig(c *Case, listen, upstream, pidfile string) (string, error) {
	servers := make([]haproxyServer, c.Targets)
	for i := range servers {
		servers[i] = haproxyServer{Name: fmt.Sprintf("s%d", i+1), Addr: upstream}
	}
	var b strings.Builder
	err := haproxyTemplate.Execute(&b, struct {
		Case, Pidfile, Listen string
		Servers               []haproxyServer
	}{c.Name, pidfile, listen, servers})
	if err != nil {
		return "", fmt.Errorf("cannot render the HAProxy config of case %q: %w", c.Name, err)
	}
	return b.String(), nil
}

// startHAProxy starts case c's HAProxy in front of upstream, when Options.HAProxy names one, and waits
// until its frontend answers.
func (r *harness) startHAProxy(ctx context.Context, c *Case, upstream string) error {
	if r.o.HAProxy == "" {
		return nil
	}
	u := unit{c, PathHAProxy}
	listen, err := r.listen(u)
	if err != nil {
		return err
	}
	text, err := haproxyConfig(c, listen, upstream, filepath.Join(r.dir, "haproxy-"+c.Name+".pid"))
	if err != nil {
		return err
	}
	hcfg, err := r.writeConfig("haproxy-"+c.Name+".cfg", text)
	if err != nil {
		return err
	}
	// -db keeps it in the foreground: it is our child, stopped by its PID.
	hp, _, err := fleet.StartProc("haproxy ("+c.Name+")", r.o.HAProxy, []string{"-f", hcfg, "-db"}, "", 0)
	if err != nil {
		return err
	}
	r.procs[u.gateway()] = hp
	if err := fleet.WaitHTTP(ctx, "http://"+listen+"/health", 15*time.Second, hp); err != nil {
		return fmt.Errorf("haproxy (%s) did not come up: %w", c.Name, err)
	}
	return nil
}
