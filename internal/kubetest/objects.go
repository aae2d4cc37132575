package kubetest

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeName is the node the harness's pods claim to run on. No such node exists; naming one makes a
// pod's deletion graceful (it keeps a deletionTimestamp until deleted again with no grace period, as a
// kubelet would), where an unscheduled pod goes at once.
const NodeName = "kubetest-node"

// Namespace creates a namespace of a generated name for the test and returns its name. It stays: without a
// namespace controller, a deleted namespace would keep its objects anyway.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ns, err := c.Clientset.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kubetest-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot create a namespace: %v", err)
	}
	return ns.Name
}

// Pod is what CreatePod makes: a pod that a kubelet has started.
type Pod struct {
	Name        string
	IP          string // status.podIP
	Ready       bool   // the Ready condition
	Labels      map[string]string
	Annotations map[string]string
}

// CreatePod creates the pod in namespace and writes the status a kubelet would (phase Running, the IP,
// the Ready condition) through the status subresource, and returns it as it is then.
func (c *Cluster) CreatePod(t testing.TB, namespace string, p Pod) *corev1.Pod {
	t.Helper()
	pod, err := c.Clientset.CoreV1().Pods(namespace).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Labels: p.Labels, Annotations: p.Annotations},
		Spec: corev1.PodSpec{
			NodeName:   NodeName,
			Containers: []corev1.Container{{Name: "engine", Image: "vllm/vllm-openai"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot create pod %q: %v", p.Name, err)
	}
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  p.IP,
		PodIPs: []corev1.PodIP{{IP: p.IP}},
		HostIP: "127.0.0.1",
	}
	setCondition(pod, corev1.PodReady, p.Ready)
	setCondition(pod, corev1.ContainersReady, p.Ready)
	return c.updatePodStatus(t, pod)
}

// SetPodReady sets the pod's Ready condition, as a kubelet does when its readiness probe passes or fails.
func (c *Cluster) SetPodReady(t testing.TB, namespace, name string, ready bool) *corev1.Pod {
	t.Helper()
	pod, err := c.Clientset.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cannot get pod %q: %v", name, err)
	}
	setCondition(pod, corev1.PodReady, ready)
	setCondition(pod, corev1.ContainersReady, ready)
	return c.updatePodStatus(t, pod)
}

func (c *Cluster) updatePodStatus(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := c.Clientset.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("cannot update the status of pod %q: %v", pod.Name, err)
	}
	return got
}

// setCondition sets the pod's condition of type typ to status.
func setCondition(pod *corev1.Pod, typ corev1.PodConditionType, status bool) {
	s := corev1.ConditionFalse
	if status {
		s = corev1.ConditionTrue
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == typ {
			if pod.Status.Conditions[i].Status != s {
				pod.Status.Conditions[i].Status = s
				pod.Status.Conditions[i].LastTransitionTime = metav1.Now()
			}
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: typ, Status: s, LastTransitionTime: metav1.Now()})
}

// TerminatePod deletes the pod gracefully and returns it as it stays: with a deletionTimestamp, until
// RemovePod (the kubelet's part) deletes it for good.
func (c *Cluster) TerminatePod(t testing.TB, namespace, name string) *corev1.Pod {
	t.Helper()
	pods := c.Clientset.CoreV1().Pods(namespace)
	if err := pods.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("cannot delete pod %q: %v", name, err)
	}
	pod, err := pods.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %q is gone, not terminating: %v", name, err)
	}
	if pod.DeletionTimestamp == nil {
		t.Fatalf("BUG: pod %q has no deletionTimestamp after a graceful delete", name)
	}
	return pod
}

// RemovePod deletes the pod with no grace period: it is gone at once.
func (c *Cluster) RemovePod(t testing.TB, namespace, name string) {
	t.Helper()
	zero := int64(0)
	err := c.Clientset.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil {
		t.Fatalf("cannot remove pod %q: %v", name, err)
	}
}

// EndpointOf is pod's endpoint as the EndpointSlice controller writes it: serving when the pod is Ready,
// terminating when it is being deleted, ready when serving and not terminating, and a targetRef to the
// pod by name and UID.
func EndpointOf(pod *corev1.Pod) discoveryv1.Endpoint {
	serving := podReady(pod)
	terminating := pod.DeletionTimestamp != nil
	ready := serving && !terminating
	node := pod.Spec.NodeName
	return discoveryv1.Endpoint{
		Addresses:  []string{pod.Status.PodIP},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
		NodeName:   &node,
		TargetRef: &corev1.ObjectReference{
			Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		},
	}
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Port is an EndpointSlice port of TCP.
func Port(name string, port int32) discoveryv1.EndpointPort {
	tcp := corev1.ProtocolTCP
	return discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &tcp}
}

// EndpointSlice is a slice of service's in namespace, labelled as the EndpointSlice controller labels its
// own; CreateEndpointSlice and UpdateEndpointSlice write it.
func EndpointSlice(namespace, service, name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: service,
				discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

// CreateEndpointSlice creates s and returns it as created.
func (c *Cluster) CreateEndpointSlice(t testing.TB, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	got, err := c.Clientset.DiscoveryV1().EndpointSlices(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot create EndpointSlice %q: %v", s.Name, err)
	}
	return got
}

// UpdateEndpointSlice replaces the slice of s's name with s, whatever its resource version, and returns it
// as written.
func (c *Cluster) UpdateEndpointSlice(t testing.TB, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	slices := c.Clientset.DiscoveryV1().EndpointSlices(s.Namespace)
	cur, err := slices.Get(context.Background(), s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cannot get EndpointSlice %q: %v", s.Name, err)
	}
	s = s.DeepCopy()
	s.ResourceVersion = cur.ResourceVersion
	got, err := slices.Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("cannot update EndpointSlice %q: %v", s.Name, err)
	}
	return got
}
