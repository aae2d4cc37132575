package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Reader binds a Role of rules in namespace to ReaderUser (a Role and a RoleBinding, as a Helm chart grants
// a workload what it needs) and returns ReaderUser's client config once the API server enforces it.
func (c *Cluster) Reader(t testing.TB, namespace string, rules ...rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	ctx := context.Background()
	rbac := c.Clientset.RbacV1()
	role, err := rbac.Roles(namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kubetest-reader-"},
		Rules:      rules,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot create the reader's role: %v", err)
	}
	_, err = rbac.RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ReaderUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot bind the reader's role: %v", err)
	}
	cfg := c.UserConfig(ReaderUser)
	if len(rules) > 0 && len(rules[0].Verbs) > 0 && len(rules[0].Resources) > 0 {
		c.waitAllowed(t, cfg, namespace, rules[0])
	}
	return cfg
}

// waitAllowed waits until the API server's RBAC authorizer, which follows Roles and RoleBindings through
// informers of its own, allows cfg's user the first verb of rule.
func (c *Cluster) waitAllowed(t testing.TB, cfg *rest.Config, namespace string, rule rbacv1.PolicyRule) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	group := ""
	if len(rule.APIGroups) > 0 {
		group = rule.APIGroups[0]
	}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: rule.Verbs[0], Group: group, Resource: rule.Resources[0],
		},
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), review, metav1.CreateOptions{})
		if err == nil && got.Status.Allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reader may not %s %s in %q after 30s: %v", rule.Verbs[0], rule.Resources[0], namespace, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var kubeconfigs atomic.Int64

// Kubeconfig writes cfg as a kubeconfig file whose current context is in namespace ("" for none) and
// returns its path, in the test's temporary directory.
func (c *Cluster) Kubeconfig(t testing.TB, cfg *rest.Config, namespace string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "user", Namespace: namespace}
	kc.CurrentContext = "kubetest"
	path := filepath.Join(t.TempDir(), fmt.Sprintf("kubeconfig-%d", kubeconfigs.Add(1)))
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("cannot write a kubeconfig: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
