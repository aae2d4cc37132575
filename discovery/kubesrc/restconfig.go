package kubesrc

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rolter-ai/rolter/config"
)

// inClusterNamespace is where a pod finds its own namespace, beside its service account's token.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// restConfig finds the API server and the namespace: override (a test's) or the kubeconfig file or the
// pod's service account for the server, kc.Namespace or the kubeconfig context's or the pod's own for the
// namespace.
func restConfig(kc *config.KubernetesSource, override *rest.Config) (*rest.Config, string, error) {
	var cfg *rest.Config
	ns := kc.Namespace
	switch {
	case kc.Kubeconfig != "":
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kc.Kubeconfig}, &clientcmd.ConfigOverrides{})
		if override == nil {
			var err error
			if cfg, err = loader.ClientConfig(); err != nil {
				return nil, "", fmt.Errorf("cannot load kubeconfig %q: %w", kc.Kubeconfig, err)
			}
		}
		if ns == "" {
			var err error
			if ns, _, err = loader.Namespace(); err != nil {
				return nil, "", fmt.Errorf("cannot read the namespace of kubeconfig %q: %w", kc.Kubeconfig, err)
			}
		}
	case override == nil:
		var err error
		if cfg, err = rest.InClusterConfig(); err != nil {
			if errors.Is(err, rest.ErrNotInCluster) {
				return nil, "", errors.New("cannot find the API server: no kubeconfig given, and not in a pod (KUBERNETES_SERVICE_HOST is unset)")
			}
			return nil, "", fmt.Errorf("cannot use the pod's service account: %w", err)
		}
		if ns == "" {
			b, err := os.ReadFile(inClusterNamespace)
			if err != nil {
				return nil, "", fmt.Errorf("cannot read the pod's namespace: %w", err)
			}
			ns = strings.TrimSpace(string(b))
		}
	}
	if override != nil {
		cfg = rest.CopyConfig(override)
	}
	if ns == "" {
		ns = "default"
	}
	cfg.UserAgent = "rolter (discovery)"
	return cfg, ns, nil
}
