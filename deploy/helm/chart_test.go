package helm

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/rolter-ai/rolter/config"
)

// The chart's tests run helm's own lint and template (the Go module, as `helm lint` and `helm template`
// run them: no cluster, no network), then decode every rendered manifest strictly into the Kubernetes API
// types (an unknown or duplicated field is an error) and check what the chart promises: probes, the drain
// wired to the grace period, selectors that match, and a rolter.toml the gateway loads.

const chartDir = "rolter"

// fleetValues: three gateways on PostgreSQL with the password from a Secret, autoscaling, and config.
var fleetValues = map[string]any{
	"replicaCount": 3,
	"image":        map[string]any{"tag": "v1.2.3"},
	"server":       map[string]any{"drainSecs": 45, "settings": map[string]any{"max_body_bytes": 1048576, "expose_decision_headers": false}},
	"control": map[string]any{
		"store":    "postgres://rolter@db.example:5432/rolter?sslmode=require",
		"database": map[string]any{"passwordSecret": "rolter-db"},
	},
	"autoscaling": map[string]any{"enabled": true, "minReplicas": 3, "maxReplicas": 12},
	"env":         []any{map[string]any{"name": "OPENAI_API_KEY", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "keys", "key": "openai"}}}},
	"config": `[[providers]]
name = "vllm-0"
api_base = "http://10.0.0.10:8000"

[[routes]]
model = "llama"
strategy = "cache_aware"
[[routes.targets]]
provider = "vllm-0"
`,
}

func TestChartLint(t *testing.T) {
	f := func(name string, values map[string]any) {
		t.Helper()
		l := lint.All(chartDir, values, "rolter", false)
		for _, m := range l.Messages {
			t.Logf("%s: %s", name, m)
		}
		if l.HighestSeverity >= support.WarningSev {
			t.Fatalf("%s: helm lint: severity %d", name, l.HighestSeverity)
		}
	}
	f("defaults", nil)
	f("fleet", fleetValues)
	f("discovery", discoveryValues)
}

// render is `helm template rolter deploy/helm/rolter -n rolter --kube-version 1.31` with values: the
// manifests by template file. It renders as helm template does (action.Install, client-only: the release
// values with the chart's values and schema, then helm's engine), without the cluster client packages
// that the action package would add to every test build.
func render(t *testing.T, values map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Validate(); err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "rolter", Namespace: "rolter", Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for name, text := range files {
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(text) == "" {
			continue
		}
		out[name] = text
	}
	return out, nil
}

// manifests are the rendered objects, decoded strictly.
type manifests struct {
	deployment *appsv1.Deployment
	service    *corev1.Service
	configMap  *corev1.ConfigMap
	secret     *corev1.Secret
	pdb        *policyv1.PodDisruptionBudget
	hpa        *autoscalingv2.HorizontalPodAutoscaler
	account    *corev1.ServiceAccount
	roles      []*rbacv1.Role
	bindings   []*rbacv1.RoleBinding
}

// decode decodes every document of the rendered templates into its Kubernetes type, refusing unknown and
// duplicated fields, and objects of kinds the chart should not make.
func decode(t *testing.T, rendered map[string]string) manifests {
	t.Helper()
	var m manifests
	for _, name := range slices.Sorted(maps.Keys(rendered)) {
		for _, doc := range strings.Split(rendered[name], "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			var obj any
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				m.deployment = &appsv1.Deployment{}
				obj = m.deployment
			case "v1 Service":
				m.service = &corev1.Service{}
				obj = m.service
			case "v1 ConfigMap":
				m.configMap = &corev1.ConfigMap{}
				obj = m.configMap
			case "v1 Secret":
				m.secret = &corev1.Secret{}
				obj = m.secret
			case "policy/v1 PodDisruptionBudget":
				m.pdb = &policyv1.PodDisruptionBudget{}
				obj = m.pdb
			case "autoscaling/v2 HorizontalPodAutoscaler":
				m.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
				obj = m.hpa
			case "v1 ServiceAccount":
				m.account = &corev1.ServiceAccount{}
				obj = m.account
			case "rbac.authorization.k8s.io/v1 Role":
				m.roles = append(m.roles, &rbacv1.Role{})
				obj = m.roles[len(m.roles)-1]
			case "rbac.authorization.k8s.io/v1 RoleBinding":
				m.bindings = append(m.bindings, &rbacv1.RoleBinding{})
				obj = m.bindings[len(m.bindings)-1]
			default:
				t.Fatalf("%s: unexpected %s %s", name, meta.APIVersion, meta.Kind)
			}
			// UnmarshalStrict: YAML to JSON refusing duplicate keys, then json's DisallowUnknownFields.
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %s %s does not fit the Kubernetes schema: %v\n%s", name, meta.APIVersion, meta.Kind, err, doc)
			}
		}
	}
	if m.deployment == nil || m.service == nil || m.configMap == nil {
		t.Fatalf("rendered %q: want a Deployment, a Service and a ConfigMap", slices.Sorted(maps.Keys(rendered)))
	}
	return m
}

func TestChartTemplate(t *testing.T) {
	f := func(name string, values map[string]any, drain float64, replicas int32, postgres, hpa bool) {
		t.Helper()
		rendered, err := render(t, values)
		if err != nil {
			t.Fatalf("%s: helm template: %v", name, err)
		}
		m := decode(t, rendered)
		d := m.deployment
		pod := d.Spec.Template
		c := pod.Spec.Containers[0]

		// Probes on the data plane's /readyz and /healthz; the drain wired to the grace period.
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Fatalf("%s: probes %+v, %+v", name, c.ReadinessProbe, c.LivenessProbe)
		}
		preStop := int64(0)
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			preStop = c.Lifecycle.PreStop.Sleep.Seconds
		}
		if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g != int64(drain)+preStop+10 || preStop != 5 {
			t.Fatalf("%s: terminationGracePeriodSeconds %v with preStop sleep %d; want drain %v + 5 + 10", name, g, preStop, drain)
		}
		// Selectors find the pods.
		labels := pod.Labels
		matches := func(sel map[string]string) bool {
			for k, v := range sel {
				if labels[k] != v {
					return false
				}
			}
			return len(sel) > 0
		}
		if !matches(d.Spec.Selector.MatchLabels) || !matches(m.service.Spec.Selector) || (m.pdb != nil && !matches(m.pdb.Spec.Selector.MatchLabels)) {
			t.Fatalf("%s: selectors do not match the pod labels %v", name, labels)
		}
		if m.pdb == nil {
			t.Fatalf("%s: no PodDisruptionBudget", name)
		}
		if (m.hpa != nil) != hpa || (hpa && (d.Spec.Replicas != nil || m.hpa.Spec.ScaleTargetRef.Name != d.Name)) ||
			(!hpa && (d.Spec.Replicas == nil || *d.Spec.Replicas != replicas)) {
			t.Fatalf("%s: replicas %v, HPA %+v", name, d.Spec.Replicas, m.hpa)
		}
		// The admin token from the chart's Secret; PGPASSWORD from the operator's.
		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			env[e.Name] = e
		}
		tok := env["ROLTER_ADMIN_TOKEN"].ValueFrom
		if tok == nil || tok.SecretKeyRef == nil || m.secret == nil || tok.SecretKeyRef.Name != m.secret.Name || len(m.secret.Data[tok.SecretKeyRef.Key]) < 32 {
			t.Fatalf("%s: ROLTER_ADMIN_TOKEN %+v from Secret %+v", name, tok, m.secret)
		}
		if pw, ok := env["PGPASSWORD"]; ok != postgres || (ok && pw.ValueFrom.SecretKeyRef.Name != "rolter-db") {
			t.Fatalf("%s: PGPASSWORD %+v", name, pw)
		}
		// The gateway loads the rolter.toml the ConfigMap holds, drain and store as the values say.
		toml := m.configMap.Data["rolter.toml"]
		cfg, err := config.Parse([]byte(toml), "rolter.toml")
		if err != nil {
			t.Fatalf("%s: the gateway refuses the chart's rolter.toml: %v\n%s", name, err, toml)
		}
		if cfg.Server.DrainSecs != drain || !cfg.Control.Enabled || strings.HasPrefix(cfg.Control.Store, "postgres://") != postgres {
			t.Fatalf("%s: rolter.toml drain_secs %v, control %+v", name, cfg.Server.DrainSecs, cfg.Control)
		}
		if pod.Annotations["checksum/config"] == "" {
			t.Fatalf("%s: no config checksum on the pods: a changed config would not roll them", name)
		}
		t.Logf("%s: %d manifests, terminationGracePeriodSeconds %d", name, len(rendered), *pod.Spec.TerminationGracePeriodSeconds)
	}
	f("defaults", nil, 30, 1, false, false)
	f("fleet", fleetValues, 45, 3, true, true)
	fleet := maps.Clone(fleetValues)
	fleet["autoscaling"] = map[string]any{"enabled": false}
	f("fleet without HPA", fleet, 45, 3, true, false)

	// Refused: several gateways without PostgreSQL, a store that is neither, a password in the URL.
	refused := func(values map[string]any, want string) {
		t.Helper()
		if _, err := render(t, values); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("values %v: error %v; want %q", values, err, want)
		}
	}
	refused(map[string]any{"replicaCount": 2}, "replicaCount > 1 or autoscaling needs control.store")
	refused(map[string]any{"replicaCount": 1, "autoscaling": map[string]any{"enabled": true}}, "needs control.store")
	refused(map[string]any{"replicaCount": 1, "control": map[string]any{"store": "/data/rolter.db"}}, "must be a postgres://")
	refused(map[string]any{"control": map[string]any{"store": "postgres://rolter:secret@db/rolter"}}, "must not hold the password")
	refused(map[string]any{"control": map[string]any{"store": "postgres://rolter@db/rolter"}, "podDisruptionBudget": map[string]any{"maxUnavailable": "", "minAvailable": ""}}, "podDisruptionBudget")
	refused(map[string]any{"control": map[string]any{"tls": map[string]any{"clientCA": true}}}, "control.tls.clientCA needs control.tls.secretName")
}

// discoveryValues: a Service in the release's namespace and an InferencePool in another, routed by config.
var discoveryValues = map[string]any{
	"discovery": map[string]any{"sources": []any{
		map[string]any{"name": "vllm", "settle_secs": 2, "kubernetes": map[string]any{"service": "vllm", "port_name": "http"},
			"provider": map[string]any{"api_base": "http://{ip}:{port}/v1", "kv_events": map[string]any{"endpoint": "tcp://{ip}:5557"}}},
		map[string]any{"name": "pool", "kubernetes": map[string]any{"inference_pool": "llama", "namespace": "models"},
			"provider": map[string]any{"api_base": "http://{ip}:{port}", "headers": map[string]any{"x-team": "a"}}},
	}},
	"config": `[[routes]]
model = "llama"
strategy = "precise_cache_aware"
[[routes.targets]]
source = "vllm"
[[routes]]
model = "pool"
[[routes.targets]]
source = "pool"
`,
}

// TestChartDiscovery: discovery.sources render as [[sources]] the gateway loads, with the release's
// namespace by default, and a read-only Role bound to the pods' service account in each namespace a
// source reads; without sources no API token is mounted.
func TestChartDiscovery(t *testing.T) {
	rendered, err := render(t, discoveryValues)
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, rendered)
	toml := m.configMap.Data["rolter.toml"]
	cfg, err := config.Parse([]byte(toml), "rolter.toml")
	if err != nil {
		t.Fatalf("the gateway refuses the chart's rolter.toml: %v\n%s", err, toml)
	}
	if len(cfg.Sources) != 2 {
		t.Fatalf("sources %+v\n%s", cfg.Sources, toml)
	}
	vllm, pool := cfg.Sources[0], cfg.Sources[1]
	if vllm.Kind != "kubernetes" || vllm.Kubernetes.Namespace != "rolter" || vllm.Kubernetes.PortName != "http" || vllm.SettleSecs != 2 ||
		vllm.Provider.KVEvents == nil || vllm.Provider.KVEvents.Endpoint != "tcp://{ip}:5557" {
		t.Fatalf("source vllm %+v\n%s", vllm, toml)
	}
	if pool.Kubernetes.Namespace != "models" || pool.Kubernetes.InferencePool != "llama" || pool.Provider.Headers["x-team"] != "a" {
		t.Fatalf("source pool %+v", pool)
	}
	pod := m.deployment.Spec.Template.Spec
	if m.account == nil || pod.ServiceAccountName != m.account.Name || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Fatalf("service account %+v, pod %q automount %v", m.account, pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	var namespaces []string
	for i, r := range m.roles {
		namespaces = append(namespaces, r.Namespace)
		b := m.bindings[i]
		if b.RoleRef.Name != r.Name || b.Namespace != r.Namespace || len(b.Subjects) != 1 || b.Subjects[0].Name != m.account.Name || b.Subjects[0].Namespace != "rolter" {
			t.Fatalf("binding %+v for role %s/%s", b, r.Namespace, r.Name)
		}
		granted := map[string]bool{}
		for _, rule := range r.Rules {
			if !slices.Equal(rule.Verbs, []string{"get", "list", "watch"}) {
				t.Fatalf("role %s grants %v: want read-only", r.Namespace, rule.Verbs)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					granted[g+"/"+res] = true
				}
			}
		}
		for _, want := range []string{"discovery.k8s.io/endpointslices", "/pods", "inference.networking.k8s.io/inferencepools", "inference.networking.x-k8s.io/inferencepools"} {
			if !granted[want] {
				t.Fatalf("role %s does not grant %s: %v", r.Namespace, want, granted)
			}
		}
		if len(granted) != 4 {
			t.Fatalf("role %s grants more than discovery reads: %v", r.Namespace, granted)
		}
	}
	if !slices.Equal(namespaces, []string{"rolter", "models"}) || len(m.bindings) != 2 {
		t.Fatalf("roles in %v, %d bindings", namespaces, len(m.bindings))
	}

	rendered, err = render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	m = decode(t, rendered)
	if a := m.deployment.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a || len(m.roles) != 0 {
		t.Fatalf("without sources: automount %v, %d roles", a, len(m.roles))
	}
}
