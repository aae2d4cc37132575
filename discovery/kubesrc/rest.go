package kubesrc

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// The watcher reads two API groups (core v1 pods, discovery.k8s.io v1 EndpointSlices) through REST
// clients of a scheme that knows only them. client-go's generated clients would do the same but register
// every API group the Kubernetes project has, which the gateway would link (tens of megabytes) and
// never use.
var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic("BUG: " + err.Error())
		}
	}
}

// restClient is a client of one group version (apiPath "/api" for the core group, "/apis" for the
// others) on hc.
func restClient(cfg *rest.Config, hc *http.Client, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion, c.APIPath = &gv, apiPath
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientForConfigAndClient(c, hc)
}

// resourceLister lists and watches resource in namespace ns through c, the selector added to the
// options; newList makes the list object to decode into.
func resourceLister(c *rest.RESTClient, resource, ns, selector string, newList func() runtime.Object) lister {
	return lister{
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			out := newList()
			err := c.Get().Namespace(ns).Resource(resource).VersionedParams(&o, parameterCodec).Do(ctx).Into(out)
			return out, err
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector, o.Watch = selector, true
			return c.Get().Namespace(ns).Resource(resource).VersionedParams(&o, parameterCodec).Watch(ctx)
		},
	}
}
